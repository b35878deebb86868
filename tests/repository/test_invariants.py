"""The invariant checks themselves: they pass on a clean history and catch the violations they name."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import psycopg

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab import invariants
from reliableq.lab.faults import Triggered
from reliableq.queue import Queue
from tests.conftest import stale_and_current, wait_until_lease_ran_out

LEASE = 30.0


def broken(checks) -> list[str]:
    return [check.name for check in checks if not check.held]


async def test_a_replayed_job_finalized_again_is_not_a_double_finalize(make_queue, submission, databases):
    """DEAD, replayed, then SUCCEEDED: one finalize per life of the job, no violation."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, "w1", LEASE)
    assert await queue.dead(job, "permanent failure: card rejected")
    await queue.replay(job.id, budget=2)
    (again,) = await queue.claim(1, "w2", LEASE)
    assert await queue.succeed(again)
    checks = await invariants.check_stored(databases)
    assert "no stale owner finalized a job; each job was finalized once" not in broken(checks)


async def test_a_stale_finalize_without_fencing_is_caught(make_queue, submission, databases):
    """Without fencing, a stale owner's succeed after the current owner's is reported."""
    queue = make_queue(Mechanisms().without("fencing"))
    await queue.submit(submission())
    (stale,) = await queue.claim(1, "paused", lease_seconds=1)
    later = await queue.database_now() + timedelta(seconds=2)
    (current,) = await queue.claim(1, "rescuer", LEASE, now=later)
    assert await queue.succeed(current) and await queue.succeed(stale)
    checks = await invariants.check_stored(databases)
    assert "no stale owner finalized a job; each job was finalized once" in broken(checks)


async def test_unfinished_and_lost_jobs_are_named(make_queue, submission, databases):
    """A job still PENDING and an acknowledged id never stored both break their invariants."""
    job = await make_queue().submit(submission())
    checks = await invariants.check_stored(databases, acknowledged=[job.id, uuid.uuid4()])
    assert {"every acknowledged job is stored", "every job is SUCCEEDED or DEAD"} <= set(broken(checks))


def _fault(point: str, action: str, job_id, worker: str) -> Triggered:
    return Triggered(datetime.now(UTC), point, action, job_id, worker)


async def test_a_lease_lost_without_a_fault_to_explain_it_is_caught(make_queue, submission, databases):
    """A claim reclaimed after expiry is explained by its worker's crash or by a stall at a point that
    stands for a stopped worker, not by a slow commit (a live worker keeps renewing through it)."""
    first, _ = await stale_and_current(make_queue(), submission, "worker-1", "worker-2")
    assert not (await invariants.lease_loss_check(databases, [])).held
    for explained, fault in ((True, _fault("during_finalize", "crash", None, "worker-1")),
                             (True, _fault("after_effect_before_finalize", "pause", first.id, "worker-1")),
                             (True, _fault("during_renewal", "pause", first.id, "worker-1")),
                             (False, _fault("before_group_commit", "pause", first.id, "worker-1")),
                             (False, _fault("after_effect_before_finalize", "pause", first.id, "worker-2"))):
        assert (await invariants.lease_loss_check(databases, [fault])).held is explained, fault


async def test_a_lease_that_ran_out_before_its_worker_could_renew_it_is_explained_and_noted(
        make_queue, submission, databases):
    """A worker whose own clock says its lease ran out before a renewal landed (a machine too busy for the
    lease) explains that loss, and only that worker's loss of that job; the note says how many."""
    first, _ = await stale_and_current(make_queue(), submission, "worker-1", "worker-2")
    slow = await invariants.lease_loss_check(databases, [], ran_out_unrenewed=[(str(first.id), "worker-1")])
    assert slow.held
    assert slow.note == "1 lease(s) ran out before a renewal landed: the machine was too busy for the lease"
    for other in ((str(first.id), "worker-2"), (str(uuid.uuid4()), "worker-1")):
        assert not (await invariants.lease_loss_check(databases, [], ran_out_unrenewed=[other])).held, other


async def test_a_worker_account_that_disagrees_with_postgresql_is_caught(make_queue, submission, databases):
    """A worker that reports a won finalize as lost (or counts one it never made) is named."""
    queue = make_queue()
    first, second = await stale_and_current(queue, submission, "worker-1", "worker-2")
    assert await queue.succeed(second) and not await queue.succeed(first)
    zero = {"succeeded": 0, "retried": 0, "dead": 0, "lost_finalizes": 0}
    truthful = {"worker-1": zero | {"lost_finalizes": 1}, "worker-2": zero | {"succeeded": 1}}
    assert (await invariants.accounts_check(databases, truthful)).held
    misreported = truthful | {"worker-2": zero | {"lost_finalizes": 1}}
    check = await invariants.accounts_check(databases, misreported)
    assert [v["worker"] for v in check.violations] == ["worker-2"]


async def test_claims_beyond_the_fleet_limit_are_caught(make_queue, submission, databases):
    """Two leases live at once break a limit of one, not a limit of two; a claim after the first lease
    ran out (or after it was finalized) breaks nothing."""
    queue = make_queue()
    for _ in range(3):
        await queue.submit(submission())
    now = await queue.database_now()
    (first,) = await queue.claim(1, "w1", lease_seconds=5, now=now)
    await queue.claim(1, "w2", lease_seconds=1, now=now + timedelta(seconds=1))
    assert not (await invariants.fleet_limit_check(databases, 1)).held
    assert (await invariants.fleet_limit_check(databases, 2)).held
    await queue.claim(1, "w3", lease_seconds=1, now=now + timedelta(seconds=2.5))
    assert (await invariants.fleet_limit_check(databases, 2)).held


async def _outage_requests(databases, requests_by_job: dict[uuid.UUID, int]) -> None:
    async with await psycopg.AsyncConnection.connect(databases.charge_url) as conn:
        for job_id, requests in requests_by_job.items():
            for _ in range(requests):
                await conn.execute(sql.queries("charge")["charge_request_log"],
                                   {"job_id": job_id, "idempotency_key": None, "outcome": "injected_outage",
                                    "status_code": 503, "charge_id": None})


async def test_the_outage_bound_is_per_job_so_few_jobs_cannot_break_it_by_chance(databases):
    """Three jobs (one in flight per worker) whose jittered retries all came early hold the bound; one job
    that retried at once, spending its budget in the outage, is named however many jobs sent one request
    each (an average over them would hide it)."""
    limit = invariants.OUTAGE_REQUESTS_PER_JOB_LIMIT
    unlucky = {uuid.uuid4(): limit - 1 for _ in range(3)}
    await _outage_requests(databases, unlucky)
    assert (await invariants.outage_check(databases)).held
    hammering = uuid.uuid4()
    await _outage_requests(databases, {hammering: 19} | {uuid.uuid4(): 1 for _ in range(20)})
    check = await invariants.outage_check(databases)
    assert check.violations == [{"job_id": hammering, "requests": 19}]
    assert check.note == f"{3 * (limit - 1) + 19 + 20} requests from 24 jobs, at most 19 from one"


class _HeldTransaction:
    """A pool of one connection outside autocommit: a claim run on it belongs to a transaction the test
    began earlier, so the claim's now() is that earlier moment."""

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn

    @asynccontextmanager
    async def connection(self):
        yield self.conn


FIFO_CLAIM = Mechanisms().without("fairness")  # the claim _claim_reclaiming edits is the first-in-first-out one


def _claim_reclaiming(condition: str) -> dict[str, str]:
    """The shipped claim with its reclaim of an expired lease judged by `condition` instead."""
    shipped = sql.queries("queue")["job_claim_due_skip_locked"]
    expired = "lease_expires_at <= coalesce(%(now)s::timestamptz, now())\n"
    assert shipped.count(expired) == 1
    return {"job_claim_due_skip_locked": shipped.replace(expired, condition + "\n")}


async def _reclaimed_early(databases) -> bool:
    return "no job was reclaimed while its lease was still running" in broken(
        await invariants.check_stored(databases))


async def test_a_reclaim_on_clock_timestamp_after_its_transaction_began_is_not_early(pool, submission, databases):
    """The reclaim reads clock_timestamp(): the lease ran out after its transaction began (its now(), the
    claimed_at it stamps) and before it found the job due. Judged by claimed_at alone it would be early."""
    queue = Queue(pool, Mechanisms())
    await queue.submit(submission())
    (first,) = await queue.claim(1, "w1", lease_seconds=0.3)
    async with await psycopg.AsyncConnection.connect(databases.queue_url) as conn:
        await conn.execute("SELECT now()")  # the transaction, and its now(), begin while the lease runs
        await wait_until_lease_ran_out(queue, first)
        held = Queue(_HeldTransaction(conn), FIFO_CLAIM,
                     replaced_queries=_claim_reclaiming("lease_expires_at <= clock_timestamp()"))
        (again,) = await held.claim(1, "w2", LEASE)
        await conn.commit()
    assert again.id == first.id and again.updated_at < first.lease_expires_at  # stamped with the earlier now()
    assert not await _reclaimed_early(databases)


async def test_a_reclaim_of_a_live_lease_is_caught(pool, submission, databases):
    queue = Queue(pool, Mechanisms())
    await queue.submit(submission())
    (first,) = await queue.claim(1, "w1", LEASE)
    loose = Queue(pool, FIFO_CLAIM, replaced_queries=_claim_reclaiming("true"))
    (again,) = await loose.claim(1, "w2", LEASE)
    assert again.id == first.id
    assert await _reclaimed_early(databases)
