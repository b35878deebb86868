"""The queue repository against real PostgreSQL: claims, leases, fencing, retries, DEAD, replay."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import psycopg
import pytest

from reliableq import queue as queue_module
from reliableq.config import Mechanisms
from reliableq.hooks import SimulatedCrash
from reliableq.lab.faults import FaultPlan
from reliableq.lab.waiting import wait_until
from reliableq.queue import Queue
from tests.conftest import stale_and_current, wait_until_lease_ran_out, worker_name

LEASE = 30.0


async def test_submit_is_visible_from_another_connection(make_queue, submission, databases):
    """A submitted job is committed when submit returns."""
    job = await make_queue().submit(submission())
    with psycopg.connect(databases.queue_url) as other:
        row = other.execute("SELECT status, idempotency_key FROM jobs WHERE id = %s", [job.id]).fetchone()
    assert row == ("PENDING", f"reliableq:charge:{job.id}")


async def test_concurrent_claimers_never_double_claim(make_queue, submission):
    """Eight claimers racing over 40 jobs with SKIP LOCKED: every job is taken exactly once."""
    queue = make_queue()
    for _ in range(40):
        await queue.submit(submission())
    batches = await asyncio.gather(*(queue.claim(7, worker_name(), LEASE) for _ in range(8)))
    claimed = [job.id for batch in batches for job in batch]
    assert len(claimed) == 40
    assert len(set(claimed)) == 40
    assert all(job.attempts == 1 for batch in batches for job in batch)


async def test_without_skip_locked_two_claimers_take_the_same_job(make_queue, submission):
    """Plain read, then update: both claimers read the job before either updates it."""
    both_read = asyncio.Event()
    arrivals = 0
    faults = FaultPlan()
    faults.arm_pause("before_claim_update", until=both_read, times=2)
    queue = make_queue(Mechanisms().without("skip_locked"), faults)
    job = await queue.submit(submission())

    async def claim():
        nonlocal arrivals
        task = asyncio.create_task(queue.claim(1, worker_name(), LEASE))
        await wait_until(lambda: len(faults.triggered) > arrivals, 5, "the claim to reach its pause", interval=0.005)
        arrivals += 1
        if arrivals == 2:
            both_read.set()
        return await task

    first, second = await asyncio.gather(claim(), claim())
    assert [j.id for j in first] == [job.id] and [j.id for j in second] == [job.id]
    stored = await queue.get(job.id)
    assert stored.attempts == 2  # two owners, two attempts, one job
    assert len(await queue.attempts_of(job.id)) == 2


async def test_skip_locked_claimer_is_not_blocked_by_a_held_row(make_queue, submission, databases):
    """A row locked by another transaction is skipped, not waited for."""
    queue = make_queue()
    held = await queue.submit(submission())
    free = await queue.submit(submission())
    with psycopg.connect(databases.queue_url) as other:
        other.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [held.id])
        claimed = await asyncio.wait_for(queue.claim(10, worker_name(), LEASE), timeout=5)
    assert [job.id for job in claimed] == [free.id]


async def test_expired_lease_is_reclaimed_with_a_new_token(make_queue, submission):
    """A lost worker's job is due again once its lease expires by the database's clock."""
    queue = make_queue()
    await queue.submit(submission())
    (first,) = await queue.claim(1, "lost-worker", lease_seconds=5)
    now = await queue.database_now()
    assert await queue.claim(1, "rescuer", LEASE, now=now + timedelta(seconds=4)) == []
    (second,) = await queue.claim(1, "rescuer", LEASE, now=now + timedelta(seconds=6))
    assert second.id == first.id and second.attempts == 2
    assert second.lease_token != first.lease_token and second.worker_id == "rescuer"
    outcomes = [a["outcome"] for a in await queue.attempts_of(first.id)]
    assert outcomes == ["expired", None]


async def test_without_leases_a_claimed_job_is_stranded(make_queue, submission):
    """No expiry: a crashed worker's RUNNING job is never due again, however late it gets."""
    queue = make_queue(Mechanisms().without("leases"))
    await queue.submit(submission())
    (job,) = await queue.claim(1, "crashed-worker", LEASE)
    assert job.lease_expires_at is None
    far_future = await queue.database_now() + timedelta(days=365)
    assert await queue.claim(1, "rescuer", LEASE, now=far_future) == []


async def test_stale_token_renew_succeed_retry_dead_affect_zero_rows(make_queue, submission):
    """With fencing, every ownership-sensitive update by a stale owner loses and changes nothing."""
    queue = make_queue()
    stale, current = await stale_and_current(queue, submission)
    before = await queue.get(current.id)
    assert await queue.renew(stale, LEASE) is False
    assert await queue.succeed(stale) is False
    assert await queue.retry(stale, 0, "stale retry") is False
    assert await queue.dead(stale, "stale dead") is False
    after = await queue.get(current.id)
    assert after == before
    stale_attempt = (await queue.attempts_of(current.id))[0]
    assert stale_attempt["outcome"] == "lost_dead"  # the last refused finalize, on record
    assert await queue.succeed(current) is True


async def test_without_fencing_a_stale_owner_overwrites(make_queue, submission):
    """Without fencing, a stale owner's succeed wins a second time (F = 2), and its retry sends a
    finished job back to PENDING."""
    queue = make_queue(Mechanisms().without("fencing"))
    stale, current = await stale_and_current(queue, submission)
    assert await queue.succeed(current) is True
    assert await queue.succeed(stale) is True
    finalized = [a for a in await queue.attempts_of(current.id) if a["outcome"] == "succeeded"]
    assert len(finalized) == 2
    stale, current = await stale_and_current(queue, submission)
    assert await queue.succeed(current) is True
    assert await queue.retry(stale, 0, "stale retry") is True
    assert (await queue.get(current.id)).status == "PENDING"


@pytest.mark.parametrize("stale_first", [True, False])
async def test_a_stale_and_a_current_claim_in_one_group_are_told_apart(make_queue, submission, stale_first):
    """Two claims of one job in one grouped finalize (a stale owner's late success beside the current
    owner's): the job is finalized once, only the current token wins, and each attempt records its own
    outcome. A statement fenced per row but reporting per job id told both that they won (F=2)."""
    queue = make_queue()
    stale, current = await stale_and_current(queue, submission)
    group = [stale, current] if stale_first else [current, stale]
    assert await queue.succeed_many(group) == [claim is current for claim in group]
    assert [a["outcome"] for a in await queue.attempts_of(current.id)] == ["lost_succeed", "succeeded"]
    assert (await queue.get(current.id)).status == "SUCCEEDED"


async def test_without_fencing_both_claims_in_one_group_write_blindly(make_queue, submission):
    """Without fencing, each claim's success lands as it would in its own statement: both win, F=2."""
    queue = make_queue(Mechanisms().without("fencing"))
    stale, current = await stale_and_current(queue, submission)
    assert await queue.succeed_many([stale, current]) == [True, True]
    assert [a["outcome"] for a in await queue.attempts_of(current.id)] == ["succeeded", "succeeded"]


async def test_a_lease_that_ran_out_is_never_renewed(make_queue, submission):
    """A renewal that comes after the lease ran out is refused, even though nobody reclaimed the job:
    a fleet claim may already have counted its slot as free. Until someone does reclaim it, the claim
    still owns the job, and its finalize wins."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, "slow-worker", lease_seconds=0.2)
    await wait_until_lease_ran_out(queue, job)
    assert await queue.renew(job, LEASE) is False
    assert (await queue.get(job.id)).lease_expires_at == job.lease_expires_at
    assert await queue.succeed(job) is True
    assert [a["outcome"] for a in await queue.attempts_of(job.id)] == ["succeeded"]


async def test_a_finalize_reads_what_its_claim_already_recorded(make_queue, submission):
    """What a retried finalize asks first: nothing yet, then the operation its first try committed and
    whether it won (a renewal's refusal or an expiry is not a finalize)."""
    queue = make_queue()
    stale, current = await stale_and_current(queue, submission)
    assert await queue.finalize_recorded(stale) is None  # `expired`: reclaimed, but it finalized nothing
    assert await queue.retry(stale, 0, "transient: 503") is False
    assert await queue.finalize_recorded(stale) == ("retry", False)
    assert await queue.finalize_recorded(current) is None
    assert await queue.succeed(current) is True
    assert await queue.finalize_recorded(current) == ("succeed", True)


async def test_a_repeated_finalize_never_rewrites_a_recorded_win(make_queue, submission):
    """A finalize retried after an error it did not see succeed loses, and the first win stays on record."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, "w", LEASE)
    assert await queue.succeed(job) is True
    assert await queue.succeed(job) is False
    assert [a["outcome"] for a in await queue.attempts_of(job.id)] == ["succeeded"]


async def test_retry_eligibility_uses_database_time(make_queue, submission):
    """A retried job is due `delay` after PostgreSQL's now(), whatever the caller's clock says."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, worker_name(), LEASE)
    assert await queue.retry(job, delay_seconds=60, error="transient: 503") is True
    stored = await queue.get(job.id)
    db_now = await queue.database_now()
    assert timedelta(seconds=59) < stored.run_at - db_now <= timedelta(seconds=60)
    assert await queue.claim(1, worker_name(), LEASE) == []
    assert await queue.claim(1, worker_name(), LEASE, now=db_now + timedelta(seconds=59)) == []
    (again,) = await queue.claim(1, worker_name(), LEASE, now=db_now + timedelta(seconds=61))
    assert again.attempts == 2


async def test_a_won_retry_records_its_delay_and_a_lost_one_none(make_queue, submission):
    """The attempt history says how long each retry made its job wait; a stale owner's retry, which changed
    nothing, has no delay on record."""
    queue = make_queue()
    stale, current = await stale_and_current(queue, submission)
    assert await queue.retry(stale, 5.0, "transient: 503") is False
    assert await queue.retry(current, 0.25, "transient: 503") is True
    assert [(a["outcome"], a["retry_delay_seconds"]) for a in await queue.attempts_of(current.id)] == [
        ("lost_retry", None), ("retried", 0.25)]


async def test_lease_expiring_on_the_final_attempt_makes_the_job_dead(make_queue, submission):
    """Budget: a job whose last allowed attempt was lost becomes DEAD instead of running again."""
    queue = make_queue()
    await queue.submit(submission(max_attempts=1))
    (job,) = await queue.claim(1, "lost-worker", lease_seconds=1)
    later = await queue.database_now() + timedelta(seconds=2)
    assert await queue.claim(1, "rescuer", LEASE, now=later) == []
    stored = await queue.get(job.id)
    assert stored.status == "DEAD" and stored.attempts == 1
    assert "attempt 1 of 1" in stored.last_error


async def test_claims_make_lapsed_last_attempts_dead_once_a_second(make_queue, submission, monkeypatch):
    """No claim takes a job whose last attempt's lease ran out; sweeping it to DEAD is the claims' chore,
    done by one claim per SWEEP_SECONDS (the queue's first included), not by every claim."""
    clock = SimpleNamespace(monotonic=lambda: 0.0)
    monkeypatch.setattr(queue_module, "time", clock)
    queue = make_queue()
    await queue.submit(submission(max_attempts=1))
    (job,) = await queue.claim(1, "lost-worker", lease_seconds=0.2)  # swept: nothing to sweep yet
    await wait_until_lease_ran_out(queue, job)
    clock.monotonic = lambda: queue_module.SWEEP_SECONDS - 0.01
    assert await queue.claim(1, "rescuer", LEASE) == []
    assert (await queue.get(job.id)).status == "RUNNING"
    clock.monotonic = lambda: queue_module.SWEEP_SECONDS
    assert await queue.claim(1, "rescuer", LEASE) == []
    assert (await queue.get(job.id)).status == "DEAD"


async def test_without_dead_an_exhausted_job_is_claimed_again(make_queue, submission):
    """With the dead mechanism off, budgets are not enforced: the job runs again and again."""
    queue = make_queue(Mechanisms().without("dead"))
    await queue.submit(submission(max_attempts=1))
    await queue.claim(1, "lost-worker", lease_seconds=1)
    later = await queue.database_now() + timedelta(seconds=2)
    (again,) = await queue.claim(1, "rescuer", LEASE, now=later)
    assert again.attempts == 2 > again.max_attempts


async def test_replay_keeps_id_and_key_and_grants_a_fresh_budget(make_queue, submission):
    """DEAD -> PENDING with the same id and idempotency key, recorded in the job's history."""
    queue = make_queue()
    await queue.submit(submission(max_attempts=1))
    (job,) = await queue.claim(1, worker_name(), LEASE)
    assert await queue.dead(job, "permanent failure: card rejected") is True
    assert await queue.replay(job.id, budget=3) is not None
    replayed = await queue.get(job.id)
    assert (replayed.id, replayed.idempotency_key) == (job.id, job.idempotency_key)
    assert replayed.status == "PENDING" and replayed.max_attempts == 4
    events = await queue.events_of(job.id)
    assert [e["event"] for e in events] == ["submitted", "replayed"]
    assert events[1]["detail"] == "permanent failure: card rejected"
    (again,) = await queue.claim(1, worker_name(), LEASE)
    assert again.attempts == 2
    assert await queue.replay(job.id, budget=3) is None  # not DEAD any more


async def test_every_history_begins_with_one_submission_however_it_was_recorded(make_queue, submission, databases):
    """A job submitted without a key has no event row (its own row records it); one with a key has its
    event, as has a job an older release stored with its event: each history shows one `submitted`."""
    queue = make_queue()
    plain = await queue.submit(submission())
    (keyed,) = await queue.submit_keyed([replace(submission(), key="order-1")], [uuid.uuid4()], 60,
                                        all_or_none=True)
    older = await queue.submit(submission())
    with psycopg.connect(databases.queue_url, autocommit=True) as conn:
        conn.execute("INSERT INTO job_events (job_id, event) VALUES (%s, 'submitted')", [older.id])
        stored = conn.execute("SELECT job_id FROM job_events ORDER BY job_id").fetchall()
    assert sorted(stored) == sorted([(keyed.job_id,), (older.id,)])
    for job_id in (plain.id, keyed.job_id, older.id):
        assert [e["event"] for e in await queue.events_of(job_id)] == ["submitted"]
    assert (await queue.events_of(plain.id))[0]["at"] == (await queue.get(plain.id)).created_at


async def test_dead_error_is_sanitised(make_queue, submission):
    """Errors stored on DEAD jobs carry no credentials or control characters and are bounded."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, worker_name(), LEASE)
    raw = "boom\nat postgresql://app:hunter2@db/x password=hunter2 " + "x" * 2000
    await queue.dead(job, raw)
    stored = (await queue.get(job.id)).last_error
    assert "hunter2" not in stored and "\n" not in stored and len(stored) <= 500


async def test_grouped_successes_are_fenced_one_by_one(make_queue, submission):
    """One statement finalizes a group: the owners win, the stale owner in the same group loses and
    its attempt says so; a crash during the group's commit rolls back every success in it."""
    queue = make_queue()
    stale, current = await stale_and_current(queue, submission)
    await queue.submit(submission())
    (fresh,) = await queue.claim(1, "w", LEASE)
    won = await queue.succeed_many([fresh, stale])
    assert won == [True, False]
    assert [a["outcome"] for a in await queue.attempts_of(stale.id)] == ["lost_succeed", None]
    assert (await queue.get(current.id)).status == "RUNNING"

    faults = FaultPlan()
    faults.arm_crash("during_finalize")
    crashing = make_queue(faults=faults)
    await queue.submit(submission())
    (other,) = await queue.claim(1, "w", LEASE)
    with pytest.raises(SimulatedCrash):
        await crashing.succeed_many([current, other])
    assert {(await queue.get(j.id)).status for j in (current, other)} == {"RUNNING"}


async def test_a_success_and_the_next_claim_commit_together(make_queue, submission, databases):
    """succeed_and_claim finalizes and claims in one commit: the claimed jobs are leased like any claim's,
    the commit that claimed them can be found again, and a claim that fails takes the success with it."""
    queue = make_queue()
    for _ in range(4):
        await queue.submit(submission())
    (first,) = await queue.claim(1, "w", LEASE)
    won, claimed = await queue.succeed_and_claim([first], 2, "w", LEASE)
    assert won == [True] and len(claimed) == 2 and first.id not in {job.id for job in claimed}
    assert all(job.status == "RUNNING" and job.attempts == 1 and job.worker_id == "w" for job in claimed)
    assert (await queue.get(first.id)).status == "SUCCEEDED"
    (by_itself,) = await queue.claim(1, "w", LEASE)
    found = await queue.claimed_with_success(first, "w")
    assert sorted(job.id for job in found) == sorted(job.id for job in claimed)  # not the one claimed alone
    assert await queue.claimed_with_success(first, "another worker") == []

    with pytest.raises(psycopg.errors.DatetimeFieldOverflow):  # a lease no interval holds: the claim fails
        await queue.succeed_and_claim([by_itself], 1, "w", 1e300)
    assert (await queue.get(by_itself.id)).status == "RUNNING"
    assert (await queue.counts())["PENDING"] == 0 and (await queue.counts())["SUCCEEDED"] == 1

    with pytest.raises(ValueError, match="skip_locked"):
        await make_queue(Mechanisms().with_flags(skip_locked=False)).succeed_and_claim([by_itself], 1, "w", LEASE)


async def test_the_jobs_a_refused_success_claimed_are_found_by_its_commit(make_queue, submission):
    """A success refused by the fence still claims in its commit, and what it claimed is found by that
    commit: not by the last commit that wrote the job's row (here the reclaim that took the job back with
    another job, for the same worker)."""
    queue = make_queue()
    await queue.submit(submission())
    (stale,) = await queue.claim(1, "w", lease_seconds=1)
    await queue.submit(submission())
    later = await queue.database_now() + timedelta(seconds=2)
    retaken = await queue.claim(2, "w", LEASE, now=later)
    assert stale.id in {job.id for job in retaken} and len(retaken) == 2
    await queue.submit(submission())
    won, claimed = await queue.succeed_and_claim([stale], 1, "w", LEASE)
    assert won == [False] and len(claimed) == 1
    assert [job.id for job in await queue.claimed_with_success(stale, "w")] == [claimed[0].id]


async def test_a_finalize_is_planned_once_per_connection(databases, submission):
    """PostgreSQL keeps job_succeed's generic plan after its first few runs, rather than planning each
    finalize afresh (a third of its time: sql/migrations/queue/0008)."""
    from reliableq import db

    pool = await db.open_pool_checked(databases.queue_url, max_size=1)
    try:
        queue = Queue(pool)
        # A table of some size, as the queue's is: on a handful of rows any plan costs next to nothing.
        await queue.submit_many([submission() for _ in range(2000)])
        for _ in range(20):  # psycopg prepares a statement on its 6th run; PostgreSQL plans its first 5 itself
            assert await queue.succeed_many(await queue.claim(1, "w", LEASE)) == [True]
        async with pool.connection() as conn:
            plans = await (await conn.execute(
                # job_succeed, as psycopg prepared it (its parameters numbered): the one naming this outcome.
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%''lost_succeed''%'")).fetchall()
        assert len(plans) == 1 and plans[0][0] >= 10 and plans[0][1] <= 5, plans
    finally:
        await pool.close()


async def test_a_pool_can_end_transactions_left_idle(databases):
    """A worker's pool ends a transaction left idle past its limit (a stopped worker's), so the row it
    locked is free again for the next claimer."""
    from reliableq import db

    pool = await db.open_pool_checked(databases.queue_url, max_size=1, idle_in_transaction_seconds=0.2)
    try:
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout|connection"):
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT 1")
                await asyncio.sleep(0.6)  # the stall itself, not synchronisation: the server must see it idle
                await conn.execute("SELECT 1")
    finally:
        await pool.close()
