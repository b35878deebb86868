"""The HTTP API over real HTTP on loopback and a real PostgreSQL: acknowledgement after commit, input
validation, batch submission, inspection, listing, replay, health and the bearer token."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from reliableq.api import HEALTH_PATHS, create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.config import MAX_BATCH_BYTES, MAX_BATCH_JOBS, MAX_PAYLOAD_BYTES, Mechanisms
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import local_system
from reliableq.lab.waiting import wait_until
from reliableq.payload import JobKinds
from tests.conftest import serve

# Marked here, at collection, so that parametrized async tests keep their parameters (the conftest's
# late marker makes anyio re-create such items without their callspec).
pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 2.0


# -- helpers ----------------------------------------------------------------------------------




@pytest.fixture
async def api(databases) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the real API (all mechanisms on) over the test's queue database."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as client:
        yield client


async def fetch_one(url: str, query: str, params: tuple = ()) -> tuple | None:
    """One row read on a brand-new connection: what any other process would see right now."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchone()


async def row_visible(queue_url: str, job_id: str | uuid.UUID) -> bool:
    return await fetch_one(queue_url, "SELECT 1 FROM jobs WHERE id = %s", (uuid.UUID(str(job_id)),)) is not None


async def stored_rows(queue_url: str) -> tuple[int, int]:
    """(jobs, job_events) row counts."""
    row = await fetch_one(queue_url, "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events)")
    return row[0], row[1]


async def submit(client: httpx.AsyncClient, amount_cents: int = 1250, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"amount_cents": amount_cents, **fields})
    assert response.status_code == 202, response.text
    return response.json()


async def submit_batch(client: httpx.AsyncClient, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 202, response.text
    return response.json()["jobs"]


async def count_visible(queue_url: str, job_ids: list[str]) -> int:
    """How many of `job_ids` a brand-new connection sees stored."""
    row = await fetch_one(queue_url, "SELECT count(*) FROM jobs WHERE id = ANY(%s)",
                          ([uuid.UUID(job_id) for job_id in job_ids],))
    return row[0]


async def make_dead(make_queue, job_id: str, error: str = "card rejected: do not honor") -> None:
    """Claim the job with the queue and finalize it as DEAD, as a worker giving up would."""
    queue = make_queue()
    claimed = await queue.claim(1, "test-worker", 30.0)
    assert [str(job.id) for job in claimed] == [job_id]
    assert await queue.dead(claimed[0], error)


# -- acknowledgement and durability -------------------------------------------------------------


async def test_202_means_the_job_is_already_visible_from_another_connection(api, databases):
    """With commit_before_ack, every 202 is sent only once another connection can already see the row."""
    for amount in range(1, 11):
        response = await api.post("/v1/jobs", json={"amount_cents": amount})
        assert response.status_code == 202, response.text
        # A separate connection, opened after the response: no waiting, no polling.
        assert await row_visible(databases.queue_url, response.json()["id"])
    assert await stored_rows(databases.queue_url) == (10, 10)


async def test_concurrent_submissions_sharing_commits_are_each_visible_at_their_202(databases):
    """Forty submissions at once, more than the commits the API runs side by side, so they share
    inserts: still, when each 202 arrives, another connection can already see that job."""
    # pool_size 2: one commit in flight.
    async with serve(create_api_app(databases.queue_url, pool_size=2, kinds=STANDARD_KINDS)) as api:
        async def submit(amount: int) -> bool:
            response = await api.post("/v1/jobs", json={"amount_cents": amount})
            assert response.status_code == 202, response.text
            return await row_visible(databases.queue_url, response.json()["id"])
        assert all(await asyncio.gather(*(submit(amount) for amount in range(1, 41))))
    assert await stored_rows(databases.queue_url) == (40, 40)


async def test_202_body_carries_id_status_and_stable_idempotency_key(api, databases):
    """The 202 body names the job, says PENDING, and gives the key the stored row carries."""
    accepted = await submit(api, 4200, currency="EUR", description="order 17", max_attempts=3)
    job_id = uuid.UUID(accepted["id"])
    assert accepted["status"] == "PENDING"
    assert accepted["idempotency_key"] == f"reliableq:charge:{job_id}"
    row = await fetch_one(databases.queue_url,
                          "SELECT status, idempotency_key, payload, max_attempts FROM jobs WHERE id = %s", (job_id,))
    assert row == ("PENDING", accepted["idempotency_key"],
                   {"amount_cents": 4200, "currency": "EUR", "description": "order 17"}, 3)


async def test_a_noop_jobs_key_names_its_kind_not_the_charge(api, databases):
    """The key names the job's kind (the core knows no charge): a noop job's says noop, in its 202 and
    in its row, in the order that answers before the row exists too."""
    response = await api.post("/v1/jobs", json={"kind": "noop"})
    job_id = response.json()["id"]
    assert response.json()["idempotency_key"] == f"reliableq:noop:{job_id}"
    assert await fetch_one(databases.queue_url, "SELECT idempotency_key FROM jobs WHERE id = %s", (job_id,)) == (
        f"reliableq:noop:{job_id}",)
    async with serve(create_api_app(databases.queue_url, Mechanisms(commit_before_ack=False),
                                    kinds=STANDARD_KINDS)) as naive:
        early = (await naive.post("/v1/jobs", json={"kind": "noop"})).json()
    assert early["idempotency_key"] == f"reliableq:noop:{early['id']}"


async def test_ack_before_commit_acknowledges_a_job_nobody_can_see(databases):
    """Without commit_before_ack, a client holds a 202 for a row that is not stored until the API moves on."""
    release = asyncio.Event()
    server_loops: list[asyncio.AbstractEventLoop] = []

    def note_server_loop(job_id: Any) -> bool:
        # Called in the API server's own thread and loop; the event must be set from that loop.
        server_loops.append(asyncio.get_running_loop())
        return True

    plan = FaultPlan()
    plan.arm_pause("after_ack_before_commit", until=release, job_filter=note_server_loop)
    async with local_system(Mechanisms().without("commit_before_ack"), api_faults=plan,
                            databases=databases) as system:
        try:
            response = await system.http.post(f"{system.api_url}/v1/jobs", json={"amount_cents": 1250})
            assert response.status_code == 202
            job_id = response.json()["id"]
            assert not await row_visible(databases.queue_url, job_id)
            assert (await system.http.get(f"{system.api_url}/v1/jobs/{job_id}")).status_code == 404
            await wait_until(lambda: bool(server_loops), DEADLINE_SECONDS,
                             "the API to pause at after_ack_before_commit")
            assert not await row_visible(databases.queue_url, job_id)
        finally:
            if server_loops:
                server_loops[0].call_soon_threadsafe(release.set)
        await wait_until(lambda: row_visible(databases.queue_url, job_id), DEADLINE_SECONDS,
                         f"job {job_id} to be stored")
        assert (await system.http.get(f"{system.api_url}/v1/jobs/{job_id}")).status_code == 200


async def test_crash_between_ack_and_commit_loses_an_acknowledged_job(databases):
    """Without commit_before_ack, a crash after the 202 and before the insert loses a job the client was promised."""
    plan = FaultPlan()
    plan.arm_crash("after_ack_before_commit")  # only the first job crashes
    async with local_system(Mechanisms().without("commit_before_ack"), api_faults=plan,
                            databases=databases) as system:
        lost = await system.submit_http(1250)  # 202 received
        await wait_until(lambda: bool(plan.triggered), DEADLINE_SECONDS, "the simulated crash")
        [crash] = plan.triggered
        assert (crash.point, crash.action, crash.job_id) == ("after_ack_before_commit", "crash", lost)
        # A follow-up job goes through the same path after the crash and is stored...
        kept = await system.submit_http(990)
        await wait_until(lambda: row_visible(databases.queue_url, kept), DEADLINE_SECONDS,
                         "the follow-up job to be stored")
        # ...while the acknowledged one never is.
        assert not await row_visible(databases.queue_url, lost)
        assert (await system.http.get(f"{system.api_url}/v1/jobs/{lost}")).status_code == 404
        assert await stored_rows(databases.queue_url) == (1, 1)


# -- validation -------------------------------------------------------------------------------

_OVERSIZE = {"amount_cents": 1250, "description": "x" * (MAX_PAYLOAD_BYTES + 1)}
_NESTED = b"[" * 5000 + b"]" * 5000

BAD_SUBMISSIONS = [
    pytest.param(b'{"amount_cents": ', 400, "invalid JSON", id="invalid-json"),
    pytest.param(b'{"amount_cents": "\xff"}', 400, "invalid JSON", id="not-utf8"),
    pytest.param(b"", 400, "invalid JSON", id="empty-body"),
    pytest.param([{"amount_cents": 1250}], 422, "JSON object", id="json-array"),
    pytest.param(1250, 422, "JSON object", id="json-number"),
    pytest.param({"amount_cents": "1250"}, 422, "amount_cents", id="amount-string"),
    pytest.param({"amount_cents": 12.5}, 422, "amount_cents", id="amount-float"),
    pytest.param({"amount_cents": True}, 422, "amount_cents", id="amount-true"),
    pytest.param({"amount_cents": None}, 422, "amount_cents", id="amount-null"),
    pytest.param({"currency": "USD"}, 422, "amount_cents", id="amount-missing"),
    pytest.param({"amount_cents": 0}, 422, "amount_cents", id="amount-zero"),
    pytest.param({"amount_cents": -5}, 422, "amount_cents", id="amount-negative"),
    pytest.param({"amount_cents": 10**13}, 422, "amount_cents", id="amount-too-large"),
    pytest.param({"amount_cents": 1250, "colour": "red"}, 422, "colour", id="unknown-field"),
    pytest.param({"amount_cents": 1250, "currency": "usd"}, 422, "currency", id="currency-lowercase"),
    pytest.param({"amount_cents": 1250, "currency": "EURO"}, 422, "currency", id="currency-four-letters"),
    pytest.param({"amount_cents": 1250, "currency": 840}, 422, "currency", id="currency-number"),
    pytest.param({"amount_cents": 1250, "currency": "USD\n"}, 422, "currency", id="currency-trailing-newline"),
    pytest.param({"kind": "mystery", "amount_cents": 1250}, 422,
                 "kind: unknown job kind 'mystery'; known: charge, noop", id="kind-unknown"),
    pytest.param({"kind": ["charge"], "amount_cents": 1250}, 422, "kind must be text", id="kind-a-list"),
    pytest.param({"kind": "noop", "max_attempts": 0}, 422, "max_attempts", id="kind-noop-bad-budget"),
    # A kind that takes any payload still gets only what jsonb can store (a refused row would fail its group).
    pytest.param({"kind": "noop", "note": "a\u0000b"}, 422, "NUL", id="noop-nul"),
    pytest.param({"kind": "noop", "\u0000": 1}, 422, "NUL", id="noop-nul-key"),
    pytest.param({"kind": "noop", "note": ["\ud800"]}, 422, "UTF-8", id="noop-surrogate"),
    pytest.param(b'{"kind": "noop", "x": NaN}', 422, "finite", id="noop-nan"),
    pytest.param(b'{"kind": "noop", "x": 1e400}', 422, "finite", id="noop-overflow"),
    pytest.param({"amount_cents": 1250, "description": 7}, 422, "description", id="description-number"),
    pytest.param({"amount_cents": 1250, "description": "x" * 201}, 422, "description", id="description-too-long"),
    pytest.param({"amount_cents": 1250, "max_attempts": 0}, 422, "max_attempts", id="max-attempts-zero"),
    pytest.param({"amount_cents": 1250, "max_attempts": "3"}, 422, "max_attempts", id="max-attempts-string"),
    pytest.param(_OVERSIZE, 413, f"{MAX_PAYLOAD_BYTES} bytes", id="oversize"),
    # Inputs the API currently answers with 500 (see the report): they must be refused as bad input.
    pytest.param({"amount_cents": 1250, "description": "a\u0000b"}, 422, "description", id="description-nul"),
    pytest.param({"amount_cents": 1250, "description": "\ud800"}, 422, "description", id="description-surrogate"),
    pytest.param(_NESTED, 400, "JSON", id="deeply-nested-json"),
]


async def test_an_integral_number_written_with_a_fraction_is_that_integer(api):
    """JSON has one kind of number, and the document's `integer` takes 1250.0: stored as 1250."""
    response = await api.post("/v1/jobs", json={"amount_cents": 1250.0, "max_attempts": 3.0})
    assert response.status_code == 202, response.text
    job = (await api.get(f"/v1/jobs/{response.json()['id']}")).json()
    assert (job["payload"]["amount_cents"], job["max_attempts"]) == (1250, 3)
    assert isinstance(job["payload"]["amount_cents"], int)


async def test_body_of_exactly_the_limit_is_accepted(api, databases):
    """The limit is inclusive: a valid body of exactly 16 KiB is accepted."""
    head, tail = b'{"amount_cents": 1250, "max_attempts": 2, "colour": "', b'"}'
    body = head + b"x" * (MAX_PAYLOAD_BYTES - len(head) - len(tail)) + tail
    assert len(body) == MAX_PAYLOAD_BYTES
    response = await api.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    # Not 413: the size is allowed, so what is refused is the unknown field.
    assert response.status_code == 422
    assert "colour" in response.json()["error"]


# -- batch submission -----------------------------------------------------------------------------


async def test_batch_stores_every_job_pending_with_its_event_and_answers_in_order(api, databases):
    """A 202 for a batch lists every job in submission order, each stored PENDING with its `submitted` event."""
    jobs = [{"amount_cents": 100 + n, "currency": "EUR", "description": f"order {n}", "max_attempts": 1 + n % 3}
            for n in range(7)]
    accepted = await submit_batch(api, jobs)
    assert len(accepted) == len(jobs)
    assert len({job["id"] for job in accepted}) == len(jobs)
    for job, sent in zip(accepted, jobs, strict=True):
        job_id = uuid.UUID(job["id"])
        assert job["status"] == "PENDING"
        assert job["idempotency_key"] == f"reliableq:charge:{job_id}"
        row = await fetch_one(databases.queue_url, """
            SELECT status, idempotency_key, payload, max_attempts,
                   (SELECT array_agg(event) FROM job_events WHERE job_id = jobs.id)
            FROM jobs WHERE id = %s""", (job_id,))
        payload = {k: v for k, v in sent.items() if k != "max_attempts"}
        assert row == ("PENDING", job["idempotency_key"], payload, sent["max_attempts"], ["submitted"])
    assert await stored_rows(databases.queue_url) == (7, 7)


async def test_batch_202_means_every_job_is_already_visible_from_another_connection(api, databases):
    """With commit_before_ack, a batch's 202 is sent only once another connection sees every job in it."""
    for size in (1, 10, 100):
        accepted = await submit_batch(api, [{"amount_cents": n + 1} for n in range(size)])
        # A separate connection, opened after the response: no waiting, no polling.
        assert await count_visible(databases.queue_url, [job["id"] for job in accepted]) == size
    assert await stored_rows(databases.queue_url) == (111, 111)


async def test_batch_of_exactly_the_job_limit_is_accepted(api, databases):
    """The job limit is inclusive: MAX_BATCH_JOBS jobs in one request are all stored."""
    accepted = await submit_batch(api, [{"amount_cents": 1250}] * MAX_BATCH_JOBS)
    assert await count_visible(databases.queue_url, [job["id"] for job in accepted]) == MAX_BATCH_JOBS


async def stored_kinds(queue_url: str, accepted: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """(kind, payload) of each accepted job as stored, in the order given."""
    return [await fetch_one(queue_url, "SELECT kind, payload FROM jobs WHERE id = %s", (uuid.UUID(job["id"]),))
            for job in accepted]


async def test_each_job_is_stored_with_its_kind(api, databases):
    """`kind` chooses the job's kind (charge by default), alone or in a batch; its payload is what its
    kind's check kept, without the queue's own fields."""
    single = [await submit(api)]
    for body in ({"kind": "noop", "max_attempts": 2}, {"kind": "noop", "note": "hello"}):
        response = await api.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        single.append(response.json())
    batch = await submit_batch(api, [{"kind": "noop"}, {"amount_cents": 5, "currency": "EUR"}])
    assert await stored_kinds(databases.queue_url, single + batch) == [
        ("charge", {"amount_cents": 1250, "currency": "USD"}), ("noop", {}), ("noop", {"note": "hello"}),
        ("noop", {}), ("charge", {"amount_cents": 5, "currency": "EUR"})]


async def test_an_api_accepts_the_kinds_it_was_given(databases):
    """A kind registered with its own check is accepted and checked by it; the stock kinds it was not
    given are refused; with no default kind, a submission must name one. The job's idempotency key
    names its kind, in the 202 and in its row (the queue knows no kind of its own)."""
    def positive_n(payload: dict) -> dict:
        if not isinstance(payload.get("n"), int) or payload["n"] < 1:
            raise ValueError("n must be a positive integer")
        return payload

    async with serve(create_api_app(databases.queue_url, kinds=JobKinds({"count": positive_n}))) as api:
        accepted = await api.post("/v1/jobs", json={"kind": "count", "n": 3})
        refused = await api.post("/v1/jobs", json={"kind": "count", "n": 0})
        charge = await api.post("/v1/jobs", json={"kind": "charge", "amount_cents": 1250})
        unnamed = await api.post("/v1/jobs", json={"n": 3})
    assert refused.status_code == 422 and refused.json()["error"] == "n must be a positive integer"
    assert charge.status_code == 422 and charge.json()["error"] == "kind: unknown job kind 'charge'; known: count"
    assert unnamed.status_code == 422 and unnamed.json()["error"] == "kind: required; known: count"
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    assert accepted.json()["idempotency_key"] == f"reliableq:count:{job_id}"
    assert await stored_kinds(databases.queue_url, [accepted.json()]) == [("count", {"n": 3})]
    assert await fetch_one(databases.queue_url, "SELECT idempotency_key FROM jobs WHERE id = %s", (job_id,)) == (
        f"reliableq:count:{job_id}",)
    assert await stored_rows(databases.queue_url) == (1, 1)


async def test_batch_with_one_bad_job_stores_nothing_and_names_its_index(api, databases):
    """All or nothing: one invalid submission refuses the whole batch with 422 naming its index."""
    jobs = [{"amount_cents": 100}, {"amount_cents": 200}, {"amount_cents": 300}, {"amount_cents": -1},
            {"amount_cents": 500}]
    response = await api.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "jobs[3]: amount_cents must be between 1 and 1000000000000, got -1"
    assert await stored_rows(databases.queue_url) == (0, 0)


BAD_BATCHES = [
    pytest.param(b'{"jobs": [{"amount_cents": 1', 400, "invalid JSON", id="invalid-json"),
    pytest.param(b'{"jobs": [{"amount_cents": "\xff"}]}', 400, "invalid JSON", id="not-utf8"),
    pytest.param(b"", 400, "invalid JSON", id="empty-body"),
    pytest.param({"jobs": []}, 422, f"between 1 and {MAX_BATCH_JOBS}", id="empty-list"),
    pytest.param({"jobs": [{"amount_cents": 1}] * (MAX_BATCH_JOBS + 1)}, 422, f"between 1 and {MAX_BATCH_JOBS}",
                 id="too-many"),
    pytest.param({"jobs": {"amount_cents": 1250}}, 422, "jobs must be a list", id="jobs-not-a-list"),
    pytest.param([{"amount_cents": 1250}], 422, '{"jobs": [...]}', id="body-a-list"),
    pytest.param({"amount_cents": 1250}, 422, '{"jobs": [...]}', id="single-submission"),
    pytest.param({"jobs": [{"amount_cents": 1250}], "priority": 1}, 422, '{"jobs": [...]}', id="extra-key"),
    pytest.param({"jobs": [{"amount_cents": 1250}, 7]}, 422, "jobs[1]: a submission must be a JSON object",
                 id="item-not-an-object"),
    pytest.param({"jobs": [{"kind": "noop"}, {"kind": "mystery"}]}, 422, "jobs[1]: kind: unknown job kind 'mystery'",
                 id="item-unknown-kind"),
    pytest.param({"jobs": [{"amount_cents": 1250, "description": "x" * MAX_BATCH_BYTES}]}, 413,
                 f"{MAX_BATCH_BYTES} bytes", id="oversize-declared"),
]


def _bad_bodies_for(path: str, cases: list) -> list:
    return [pytest.param(path, *case.values, id=f"{path.rsplit('/', 1)[1]}-{case.id}") for case in cases]


@pytest.mark.parametrize(("path", "body", "status_code", "mentions"),
                         _bad_bodies_for("/v1/jobs", BAD_SUBMISSIONS) + _bad_bodies_for("/v1/jobs/batch", BAD_BATCHES))
async def test_bad_submission_is_refused_with_a_clear_4xx_and_stores_nothing(databases, path, body, status_code,
                                                                              mentions):
    """Each kind of bad submission or batch gets its 4xx, an error naming what is wrong, and no stored row."""
    # json.dumps escapes NUL and lone surrogates (\\u0000, \\ud800), as any JSON client may send them.
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    # The server is stopped before asserting, so a 500's traceback is logged by then (see serve()).
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as api:
        response = await api.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status_code, response.text
    error = response.json()["error"]
    assert mentions in error
    assert "\n" not in error
    assert await stored_rows(databases.queue_url) == (0, 0)


async def _oversize_job() -> AsyncIterator[bytes]:
    yield b'{"amount_cents": 1250, "description": "'
    for _ in range(MAX_PAYLOAD_BYTES // 1024 + 1):
        yield b"x" * 1024
    yield b'"}'


async def _oversize_batch() -> AsyncIterator[bytes]:
    job = b'{"amount_cents": 1250, "description": "' + b"x" * 200 + b'"}'
    yield b'{"jobs": [' + job
    for _ in range(MAX_BATCH_BYTES // len(job) + 1):
        yield b", " + job
    yield b"]}"


@pytest.mark.parametrize(("path", "chunks", "limit"), [("/v1/jobs", _oversize_job, MAX_PAYLOAD_BYTES),
                                                        ("/v1/jobs/batch", _oversize_batch, MAX_BATCH_BYTES)])
async def test_oversize_body_without_content_length_is_refused(api, databases, path, chunks, limit):
    """A chunked body over the limit (no Content-Length to check up front) is still refused with 413."""
    response = await api.post(path, content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert f"{limit} bytes" in response.json()["error"]
    assert await stored_rows(databases.queue_url) == (0, 0)


async def test_crash_between_ack_and_commit_loses_a_whole_acknowledged_batch(databases):
    """Without commit_before_ack, a crash after a batch's 202 and before its insert loses every job the
    client was promised: the failure that answering only after the commit prevents."""
    plan = FaultPlan()
    plan.arm_crash("after_ack_before_commit")  # only the first batch crashes
    async with local_system(Mechanisms().without("commit_before_ack"), api_faults=plan,
                            databases=databases) as system:
        async def post_batch(*amounts: int) -> list[str]:
            response = await system.http.post(f"{system.api_url}/v1/jobs/batch",
                                              json={"jobs": [{"amount_cents": a} for a in amounts]})
            assert response.status_code == 202, response.text
            return [job["id"] for job in response.json()["jobs"]]

        lost = await post_batch(100, 200, 300)  # 202 received for all three
        await wait_until(lambda: bool(plan.triggered), DEADLINE_SECONDS, "the simulated crash")
        [crash] = plan.triggered
        assert (crash.point, crash.action) == ("after_ack_before_commit", "crash")
        assert [str(job_id) for job_id in crash.job_id] == lost
        # A follow-up batch goes through the same path after the crash and is stored...
        kept = await post_batch(400, 500)
        # One statement stores a batch: once any of it is visible, all of it is.
        await wait_until(lambda: count_visible(databases.queue_url, kept), DEADLINE_SECONDS,
                         "the follow-up batch to be stored")
        assert await count_visible(databases.queue_url, kept) == 2
        # ...while the acknowledged one never is.
        assert await count_visible(databases.queue_url, lost) == 0
        assert (await system.http.get(f"{system.api_url}/v1/jobs/{lost[0]}")).status_code == 404
        assert await stored_rows(databases.queue_url) == (2, 2)


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


# -- bearer token ---------------------------------------------------------------------------------


@pytest.fixture
async def guarded_api(databases) -> AsyncIterator[httpx.AsyncClient]:
    """The API requiring the bearer token s3cret."""
    async with serve(create_api_app(databases.queue_url, api_token="s3cret", kinds=STANDARD_KINDS)) as client:
        yield client


@pytest.mark.parametrize("authorization", [
    pytest.param(None, id="missing"),
    pytest.param("Bearer wrong", id="wrong-token"),
    pytest.param("s3cret", id="no-scheme"),
    pytest.param("Basic s3cret", id="other-scheme"),
    pytest.param("Bearer s3cret2", id="longer-token"),
    pytest.param("Bearer", id="empty-token"),
    # Currently a 500 (see the report): compare_digest refuses non-ASCII str.
    pytest.param(b"Bearer s\xe9cret", id="non-ascii-token"),
])
async def test_missing_or_wrong_token_is_401_and_stores_nothing(databases, authorization):
    """Without the right bearer token every /v1 route answers 401 and nothing is stored."""
    headers = {} if authorization is None else {"Authorization": authorization}
    answers = []
    async with serve(create_api_app(databases.queue_url, api_token="s3cret", kinds=STANDARD_KINDS)) as api:
        for method, path in (("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"), ("GET", "/v1/jobs"),
                             ("GET", f"/v1/jobs/{uuid.uuid4()}"), ("POST", f"/v1/jobs/{uuid.uuid4()}/replay")):
            response = await api.request(method, path, json={"amount_cents": 1250}, headers=headers)
            answers.append((method, path, response.status_code, response.text))
    # Asserted once the server has stopped, so a 500's traceback is logged by then (see serve()).
    for method, path, status_code, text in answers:
        assert status_code == 401, (method, path, text)
        assert "token" in json.loads(text)["error"]
    assert await stored_rows(databases.queue_url) == (0, 0)


async def test_right_token_is_accepted_and_health_checks_stay_open(guarded_api, databases):
    """With "Authorization: Bearer s3cret" submissions are accepted; the health checks need no token."""
    headers = {"Authorization": "Bearer s3cret"}
    response = await guarded_api.post("/v1/jobs", json={"amount_cents": 1250}, headers=headers)
    assert response.status_code == 202
    assert await row_visible(databases.queue_url, response.json()["id"])
    assert (await guarded_api.get("/v1/jobs", headers=headers)).status_code == 200
    for path in HEALTH_PATHS:
        assert (await guarded_api.get(path)).status_code == 200, path


async def test_an_integer_too_long_to_convert_is_invalid_json_not_a_500(databases):
    """Python refuses to convert a 5000-digit integer; that is bad input (400), and nothing is stored."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as client:
        response = await client.post("/v1/jobs", content=b'{"amount_cents": ' + b"1" * 5000 + b"}",
                                     headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "invalid JSON" in response.json()["error"]
    with psycopg.connect(databases.queue_url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
