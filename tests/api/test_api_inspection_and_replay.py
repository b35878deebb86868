"""Looking at jobs and at the service through the API, over real HTTP on loopback and a real PostgreSQL:
a job with its attempts and events, lists by status, replaying a DEAD job, and the health checks."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from pydantic import TypeAdapter

from reliableq import api_contract as contract
from tests.api.job_steps import make_dead, submit

pytestmark = pytest.mark.anyio


# -- inspection ---------------------------------------------------------------------------------


async def test_get_job_shows_its_attempts_and_events(api, make_queue):
    """GET /v1/jobs/{id} returns the job with its claims (attempts) and its lifecycle events."""
    job_id = (await submit(api, 777))["id"]
    before = (await api.get(f"/v1/jobs/{job_id}")).json()
    assert before["status"] == "PENDING"
    assert before["attempts"] == 0 and before["attempt_history"] == []
    assert [event["event"] for event in before["events"]] == ["submitted"]

    claimed = await make_queue().claim(1, "inspect-worker", 30.0)
    assert [str(job.id) for job in claimed] == [job_id]

    response = await api.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200
    shown = response.json()
    assert shown["id"] == job_id
    assert shown["status"] == "RUNNING"
    assert shown["payload"] == {"amount_cents": 777, "currency": "USD"}
    assert isinstance(shown["attempt_history"], list) and isinstance(shown["events"], list)
    assert shown["attempts"] == 1
    [attempt] = shown["attempt_history"]
    assert attempt["attempt"] == 1
    assert attempt["worker_id"] == "inspect-worker"
    assert attempt["lease_token"] == str(claimed[0].lease_token)
    assert attempt["outcome"] is None
    assert [event["event"] for event in shown["events"]] == ["submitted"]


async def test_a_jobs_detail_is_exactly_as_the_document_says(api, make_queue):
    """A job retried once and claimed again: its detail validates against the document's JobDetail, and
    names no field the document does not; the retry's delay is on record."""
    job_id = (await submit(api, 55))["id"]
    queue = make_queue()
    [first] = await queue.claim(1, "detail-worker", 30.0)
    assert await queue.retry(first, 0.0, "transient: 503") is True
    await queue.claim(1, "detail-worker", 30.0)

    shown = (await api.get(f"/v1/jobs/{job_id}")).json()
    detail = TypeAdapter(contract.JobDetail).validate_python(shown)
    assert set(shown) == {field.name for field in dataclasses.fields(contract.JobDetail)}
    assert all(set(a) == set(contract.Attempt.model_fields) for a in shown["attempt_history"])
    assert all(set(e) == set(contract.JobEvent.model_fields) for e in shown["events"])
    assert [(a.outcome, a.retry_delay_seconds) for a in detail.attempt_history] == [("retried", 0.0), (None, None)]


async def test_get_unknown_job_is_404(api):
    """An id that is a UUID but no job gets 404 naming the id."""
    unknown = uuid.uuid4()
    response = await api.get(f"/v1/jobs/{unknown}")
    assert response.status_code == 404
    assert str(unknown) in response.json()["error"]


@pytest.mark.parametrize("raw_id", ["not-a-uuid", "12345", "0f0f"])
async def test_get_non_uuid_job_id_is_400(api, raw_id):
    """An id that is not a UUID gets 400, not a database error."""
    response = await api.get(f"/v1/jobs/{raw_id}")
    assert response.status_code == 400
    assert raw_id in response.json()["error"]


async def test_list_by_status_dead_lists_only_dead_jobs(api, make_queue):
    """GET /v1/jobs?status=DEAD returns the DEAD jobs only, whatever else is queued."""
    dead_id = (await submit(api, 100))["id"]
    await make_dead(make_queue, dead_id)
    pending_ids = {(await submit(api, 200))["id"], (await submit(api, 300))["id"]}

    for status in ("DEAD", "dead"):
        response = await api.get("/v1/jobs", params={"status": status})
        assert response.status_code == 200
        listed = response.json()
        assert [job["id"] for job in listed["jobs"]] == [dead_id]
        assert listed["jobs"][0]["status"] == "DEAD"
        assert listed["jobs"][0]["last_error"] == "card rejected: do not honor"
        assert listed["counts"] == {"PENDING": 2, "RUNNING": 0, "SUCCEEDED": 0, "DEAD": 1}

    everything = (await api.get("/v1/jobs")).json()["jobs"]
    assert {job["id"] for job in everything} == pending_ids | {dead_id}
    pending = (await api.get("/v1/jobs", params={"status": "PENDING"})).json()["jobs"]
    assert {job["id"] for job in pending} == pending_ids


@pytest.mark.parametrize("params", [{"status": "FAILED"}, {"status": ""}, {"limit": 0}, {"limit": 1001}])
async def test_list_with_unknown_status_or_bad_limit_is_400(api, params):
    """An unknown status or an out-of-range limit gets 400 naming the parameter."""
    response = await api.get("/v1/jobs", params=params)
    assert response.status_code == 400
    assert next(iter(params)) in response.json()["error"]


# -- replay ---------------------------------------------------------------------------------------


async def test_replay_of_a_dead_job_requeues_it_with_the_same_identity(api, make_queue):
    """Replaying a DEAD job makes it PENDING again with the same id and key, and records a 'replayed' event."""
    accepted = await submit(api, 4321)
    job_id = accepted["id"]
    await make_dead(make_queue, job_id, "declined: amount over limit")

    response = await api.post(f"/v1/jobs/{job_id}/replay")
    assert response.status_code == 200, response.text
    replayed = response.json()
    assert replayed["id"] == job_id
    assert replayed["idempotency_key"] == accepted["idempotency_key"]
    assert replayed["status"] == "PENDING"
    assert replayed["attempts"] == 1
    assert replayed["max_attempts"] == 1 + 5  # attempts so far plus the default replay budget
    assert replayed["last_error"] is None
    assert replayed["finalized_at"] is None

    shown = (await api.get(f"/v1/jobs/{job_id}")).json()
    assert shown["status"] == "PENDING"
    assert [event["event"] for event in shown["events"]] == ["submitted", "replayed"]
    assert shown["events"][-1]["detail"] == "declined: amount over limit"
    assert [attempt["outcome"] for attempt in shown["attempt_history"]] == ["dead"]

    # It is due again, under the same key the charge service deduplicates on.
    [again] = await make_queue().claim(1, "after-replay", 30.0)
    assert str(again.id) == job_id
    assert again.idempotency_key == accepted["idempotency_key"]
    assert again.attempts == 2


async def test_replay_with_an_explicit_budget(api, make_queue):
    """?budget=N grants N more attempts on top of the ones already made."""
    job_id = (await submit(api))["id"]
    await make_dead(make_queue, job_id)
    response = await api.post(f"/v1/jobs/{job_id}/replay", params={"budget": 2})
    assert response.status_code == 200
    assert response.json()["max_attempts"] == 3


async def test_replay_of_a_job_that_is_not_dead_is_409(api, make_queue):
    """PENDING and RUNNING jobs cannot be replayed: 409 naming the status, and the job is unchanged."""
    pending_id = (await submit(api))["id"]
    response = await api.post(f"/v1/jobs/{pending_id}/replay")
    assert response.status_code == 409
    assert "PENDING" in response.json()["error"]

    await make_queue().claim(1, "busy-worker", 30.0)
    response = await api.post(f"/v1/jobs/{pending_id}/replay")
    assert response.status_code == 409
    assert "RUNNING" in response.json()["error"]
    shown = (await api.get(f"/v1/jobs/{pending_id}")).json()
    assert shown["status"] == "RUNNING"
    assert [event["event"] for event in shown["events"]] == ["submitted"]


async def test_replay_of_an_unknown_job_is_404(api):
    """Replaying a job that does not exist gets 404."""
    response = await api.post(f"/v1/jobs/{uuid.uuid4()}/replay")
    assert response.status_code == 404


@pytest.mark.parametrize(("path", "params"), [("not-a-uuid", {}), ("{job}", {"budget": 0}), ("{job}", {"budget": 101})])
async def test_replay_with_bad_id_or_budget_is_400(api, make_queue, path, params):
    """A non-UUID id or a budget outside 1..100 gets 400, and a DEAD job stays DEAD."""
    job_id = (await submit(api))["id"]
    await make_dead(make_queue, job_id)
    response = await api.post(f"/v1/jobs/{path.format(job=job_id)}/replay", params=params)
    assert response.status_code == 400
    assert (await api.get(f"/v1/jobs/{job_id}")).json()["status"] == "DEAD"


# -- health ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/health/ready"])
async def test_readiness_is_200_with_the_mechanisms_when_the_database_answers(api, path):
    """/health/ready, and /healthz its alias, answer 200 with the mechanisms in force."""
    response = await api.get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "mechanisms": "all mechanisms on"}


async def test_liveness_is_200_without_asking_the_database(api):
    """/health/live answers 200 {"status": "ok"} (tests/integration/test_outage.py: with the database down)."""
    response = await api.get("/health/live")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
