"""Submitting jobs over real HTTP on loopback and a real PostgreSQL: a 202, single or batch, is sent only
once another connection can see every job it names, each stored with its kind and a key naming that kind;
without commit_before_ack the 202 comes first, and a crash between the two loses acknowledged jobs."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.config import Mechanisms
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import local_system
from reliableq.lab.waiting import wait_until
from reliableq.payload import JobKinds
from tests.api.job_steps import count_visible, fetch_one, row_visible, stored_rows, submit, submit_batch
from tests.conftest import serve

DEADLINE_SECONDS = 2.0


# -- single jobs ---------------------------------------------------------------------------------


async def test_202_means_the_job_is_already_visible_from_another_connection(api, databases):
    """With commit_before_ack, every 202 is sent only once another connection can already see the row."""
    for amount in range(1, 11):
        response = await api.post("/v1/jobs", json={"amount_cents": amount})
        assert response.status_code == 202, response.text
        # A separate connection, opened after the response: no waiting, no polling.
        assert await row_visible(databases.queue_url, response.json()["id"])
    assert await stored_rows(databases.queue_url) == (10, 0)


async def test_concurrent_submissions_sharing_commits_are_each_visible_at_their_202(databases):
    """Forty submissions at once, more than the one commit the API runs at a time, so they share
    inserts: still, when each 202 arrives, another connection can already see that job."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as api:
        async def submit(amount: int) -> bool:
            response = await api.post("/v1/jobs", json={"amount_cents": amount})
            assert response.status_code == 202, response.text
            return await row_visible(databases.queue_url, response.json()["id"])
        assert all(await asyncio.gather(*(submit(amount) for amount in range(1, 41))))
    assert await stored_rows(databases.queue_url) == (40, 0)


async def test_submissions_that_arrive_while_a_commit_runs_share_the_next_one(databases):
    """One submission commit at a time: while the first one's insert waits (another session holds the
    table), the next six queue in the API rather than open commits of their own, and once it commits
    they are stored by one statement together: two transactions for seven jobs, each 202 after its own."""
    app = create_api_app(databases.queue_url, kinds=STANDARD_KINDS)
    async with serve(app) as api, await psycopg.AsyncConnection.connect(databases.queue_url) as holder:
        await holder.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")  # until it commits: inserts wait

        async def inserts_waiting_for_the_lock() -> int:
            row = await fetch_one(databases.queue_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                                  "wait_event_type = 'Lock' AND starts_with(query, 'INSERT INTO jobs')")
            return row[0]
        first = asyncio.create_task(api.post("/v1/jobs", json={"amount_cents": 1}))
        await wait_until(inserts_waiting_for_the_lock, DEADLINE_SECONDS, "the first insert to wait for the lock")
        rest = [asyncio.create_task(api.post("/v1/jobs", json={"amount_cents": amount})) for amount in range(2, 8)]
        await wait_until(lambda: app.state.submissions.waiting == 6, DEADLINE_SECONDS,
                         "six submissions queued behind the first commit")
        assert not first.done() and await inserts_waiting_for_the_lock() == 1
        await holder.commit()
        answers = await asyncio.gather(first, *rest)
    assert [answer.status_code for answer in answers] == [202] * 7
    transactions = await fetch_one(databases.queue_url, "SELECT count(DISTINCT xmin::text) FROM jobs")
    assert transactions == (2,)


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
        assert await stored_rows(databases.queue_url) == (1, 0)



# -- batches ------------------------------------------------------------------------------------------


async def test_batch_stores_every_job_pending_and_answers_in_order(api, databases):
    """A 202 for a batch lists every job in submission order, each stored PENDING, its history its submission."""
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
            SELECT status, idempotency_key, payload, max_attempts
            FROM jobs WHERE id = %s""", (job_id,))
        payload = {k: v for k, v in sent.items() if k != "max_attempts"}
        assert row == ("PENDING", job["idempotency_key"], payload, sent["max_attempts"])
        assert [event["event"] for event in (await api.get(f"/v1/jobs/{job_id}")).json()["events"]] == ["submitted"]
    assert await stored_rows(databases.queue_url) == (7, 0)


async def test_batch_202_means_every_job_is_already_visible_from_another_connection(api, databases):
    """With commit_before_ack, a batch's 202 is sent only once another connection sees every job in it."""
    for size in (1, 10, 100):
        accepted = await submit_batch(api, [{"amount_cents": n + 1} for n in range(size)])
        # A separate connection, opened after the response: no waiting, no polling.
        assert await count_visible(databases.queue_url, [job["id"] for job in accepted]) == size
    assert await stored_rows(databases.queue_url) == (111, 0)


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
    assert await stored_rows(databases.queue_url) == (1, 0)


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
        assert await stored_rows(databases.queue_url) == (2, 0)
