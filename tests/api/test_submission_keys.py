"""Submission idempotency over real HTTP and a real PostgreSQL: a client's `Idempotency-Key` (or a batch
job's `submission_key`) names one job however often it is sent; another body under the key is 409; bad
keys are refused and store nothing. The SIGKILL-and-retry test with real processes is
tests/integration/test_retrying_client.py."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import psycopg
import pytest

from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.payload import MAX_SUBMISSION_KEY_CHARS
from tests.conftest import serve

pytestmark = pytest.mark.anyio

CHARGE = {"amount_cents": 1250, "currency": "USD"}


async def stored(queue_url: str) -> dict[str, int]:
    """Row counts of what a submission writes: jobs, the events of those with a key, and held keys."""
    async with await psycopg.AsyncConnection.connect(queue_url, autocommit=True) as conn:
        row = await (await conn.execute(
            "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events),"
            " (SELECT count(*) FROM job_submission_keys)")).fetchone()
    return dict(zip(("jobs", "events", "keys"), row, strict=True))


async def post(client: httpx.AsyncClient, body, key: str | None = None) -> httpx.Response:
    return await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key} if key else {})


async def test_the_same_key_and_body_answer_the_first_job_and_store_no_second(api, databases):
    first = await post(api, CHARGE, "order-17")
    again = await post(api, {"currency": "USD", "amount_cents": 1250}, "order-17")  # other key order: same job
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"]
    assert (first.json()["replayed"], again.json()["replayed"]) == (False, True)
    assert again.json()["submission_key"] == "order-17"
    assert await stored(databases.queue_url) == {"jobs": 1, "events": 1, "keys": 1}
    detail = (await api.get(f"/v1/jobs/{first.json()['id']}")).json()
    assert [event["detail"] for event in detail["events"]] == ["idempotency key order-17"]


async def test_a_replayed_answer_gives_the_jobs_status_now(api, databases):
    job_id = (await post(api, CHARGE, "k")).json()["id"]
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
        await conn.execute("UPDATE jobs SET status = 'SUCCEEDED' WHERE id = %s", (uuid.UUID(job_id),))
    assert (await post(api, CHARGE, "k")).json() | {"idempotency_key": None} == {
        "id": job_id, "status": "SUCCEEDED", "idempotency_key": None, "submission_key": "k", "replayed": True}


async def test_the_same_key_with_another_body_is_409_and_stores_nothing(api, databases):
    first = await post(api, CHARGE, "order-17")
    for other in ({**CHARGE, "amount_cents": 1251}, {**CHARGE, "max_attempts": 2}, {**CHARGE, "kind": "charge",
                                                                                      "description": "x"}):
        refused = await post(api, other, "order-17")
        assert refused.status_code == 409, refused.text
        assert first.json()["id"] in refused.json()["error"] and "different body" in refused.json()["error"]
    assert await stored(databases.queue_url) == {"jobs": 1, "events": 1, "keys": 1}


async def test_without_a_key_a_repeat_is_a_second_job(api, databases):
    """The duplicate the key exists for: the API cannot tell a retry from a new request."""
    ids = {(await post(api, CHARGE)).json()["id"] for _ in range(2)}
    assert len(ids) == 2
    assert await stored(databases.queue_url) == {"jobs": 2, "events": 0, "keys": 0}


async def test_concurrent_requests_with_one_key_make_one_job(api, databases):
    """A retry racing its first try, many times over, beside requests without a key: the group commit
    may hold one key twice, and the database's UNIQUE key may make one request wait for another."""
    keyed = [post(api, CHARGE, "racing") for _ in range(12)]
    unkeyed = [post(api, CHARGE) for _ in range(6)]
    answers = await asyncio.gather(*keyed, *unkeyed)
    assert {answer.status_code for answer in answers} == {202}
    keyed_ids = {answer.json()["id"] for answer in answers[:12]}
    assert len(keyed_ids) == 1
    assert sum(not answer.json()["replayed"] for answer in answers[:12]) == 1
    assert await stored(databases.queue_url) == {"jobs": 7, "events": 1, "keys": 1}


async def test_a_batch_keys_each_job_and_a_resent_batch_makes_nothing_new(api, databases):
    jobs = [{**CHARGE, "amount_cents": 100 + i, "submission_key": f"line-{i}"} for i in range(3)]
    first = await api.post("/v1/jobs/batch", json={"jobs": jobs})
    # Resent with one more job: the three are answered with their jobs, the new one stored.
    again = await api.post("/v1/jobs/batch", json={"jobs": [*jobs, {**CHARGE, "submission_key": "line-3"}]})
    assert (first.status_code, again.status_code) == (202, 202)
    assert [job["id"] for job in again.json()["jobs"][:3]] == [job["id"] for job in first.json()["jobs"]]
    assert [job["replayed"] for job in again.json()["jobs"]] == [True, True, True, False]
    assert await stored(databases.queue_url) == {"jobs": 4, "events": 4, "keys": 4}


async def test_a_batch_with_one_key_reused_for_another_body_stores_none_of_it(api, databases):
    await post(api, CHARGE, "line-1")
    batch = {"jobs": [{**CHARGE, "submission_key": "line-0"}, {**CHARGE, "amount_cents": 9, "submission_key": "line-1"},
                      CHARGE]}
    refused = await api.post("/v1/jobs/batch", json=batch)
    assert refused.status_code == 409, refused.text
    assert "line-1" in refused.json()["error"]
    assert await stored(databases.queue_url) == {"jobs": 1, "events": 1, "keys": 1}


@pytest.mark.parametrize("path, body, headers, message", [
    ("/v1/jobs", CHARGE, {"Idempotency-Key": "x" * (MAX_SUBMISSION_KEY_CHARS + 1)}, "Idempotency-Key must be"),
    ("/v1/jobs", CHARGE, {"Idempotency-Key": "two words"}, "Idempotency-Key must be"),
    ("/v1/jobs", CHARGE, {"Idempotency-Key": "caf\u00e9".encode()}, "Idempotency-Key must be"),  # UTF-8 bytes
    ("/v1/jobs", {**CHARGE, "submission_key": "a"}, {"Idempotency-Key": "b"}, "differ"),
    ("/v1/jobs", {**CHARGE, "submission_key": 7}, {}, "submission_key must be"),
    ("/v1/jobs", {**CHARGE, "submission_key": ""}, {}, "submission_key must be"),
    ("/v1/jobs/batch", {"jobs": [{**CHARGE, "submission_key": "a"}, {**CHARGE, "submission_key": "a"}]}, {},
     "jobs[1]: submission_key repeats jobs[0]'s"),
    ("/v1/jobs/batch", {"jobs": [CHARGE]}, {"Idempotency-Key": "k"}, "a submission_key per job"),
], ids=["too-long", "space", "non-ascii", "header-and-body-differ", "not-text", "empty", "repeated-in-batch",
        "header-on-a-batch"])
async def test_a_bad_key_is_422_and_stores_nothing(api, databases, path, body, headers, message):
    refused = await api.post(path, json=body, headers=headers)
    assert refused.status_code == 422, refused.text
    assert message in refused.json()["error"]
    assert await stored(databases.queue_url) == {"jobs": 0, "events": 0, "keys": 0}


async def test_a_key_in_the_body_works_as_the_header_does(api, databases):
    first = await post(api, {**CHARGE, "submission_key": "same"})
    again = await post(api, {**CHARGE, "submission_key": "same"}, "same")
    assert again.json()["id"] == first.json()["id"] and again.json()["replayed"]
    job = (await api.get(f"/v1/jobs/{first.json()['id']}")).json()
    assert "submission_key" not in job["payload"]  # the queue's field, not the charge's


async def test_a_key_older_than_the_window_names_a_new_job(databases):
    async with serve(create_api_app(databases.queue_url, key_window=60, kinds=STANDARD_KINDS)) as api:
        first = (await post(api, CHARGE, "old")).json()["id"]
        async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
            await conn.execute("UPDATE job_submission_keys SET created_at = now() - interval '61 seconds'")
        renewed = await post(api, {**CHARGE, "amount_cents": 5}, "old")  # any body: the key is free again
        assert renewed.status_code == 202 and renewed.json()["id"] != first and not renewed.json()["replayed"]
        assert (await post(api, {**CHARGE, "amount_cents": 5}, "old")).json()["id"] == renewed.json()["id"]
    assert await stored(databases.queue_url) == {"jobs": 2, "events": 2, "keys": 1}
