"""A fleet-wide concurrency limit, enforced in PostgreSQL: it holds across worker processes, and a
crashed worker's slots come back when its leases expire."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab import invariants, processes
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import local_system
from reliableq.lab.invariants import Check
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue
from tests.conftest import wait_until_lease_ran_out


async def test_concurrent_claims_never_exceed_the_fleet_limit(make_queue, submission):
    """Ten claimers asking for 2 jobs each while 3 slots exist fleet-wide: at most 3 jobs are taken (a claim
    that finds the gate held takes nothing this time, so how many of the ten got it is the race's), and
    claims one after another fill the fleet to 3 and no further."""
    queue = make_queue()
    for _ in range(20):
        await queue.submit(submission())
    batches = await asyncio.gather(*(queue.claim(2, f"w{i}", 30.0, fleet_limit=3) for i in range(10)))
    assert 2 <= sum(len(b) for b in batches) <= 3  # the first to hold the gate found 3 free slots
    for later in range(2):
        await queue.claim(2, f"later-{later}", 30.0, fleet_limit=3)
    assert (await queue.counts())["RUNNING"] == 3
    assert await queue.claim(2, "late", 30.0, fleet_limit=3) == []


async def test_slots_of_expired_leases_come_back(make_queue, submission):
    """A crashed worker holds its slots only until its leases expire by the database's clock."""
    queue = make_queue()
    for _ in range(4):
        await queue.submit(submission())
    assert len(await queue.claim(4, "crashed", lease_seconds=5, fleet_limit=2)) == 2
    later = await queue.database_now() + timedelta(seconds=6)
    # Both expired jobs and two fresh ones are due; only two slots exist.
    assert len(await queue.claim(4, "survivor", 30.0, now=later, fleet_limit=2)) == 2


async def _claim_runs_into(claim: asyncio.Task, databases) -> None:
    """Wait until `claim` has finished, or waits for the fleet lock: it must not (it finds the lock taken
    and claims nothing), and a claim that did fails the test instead of hanging it."""
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
        async def finished_or_waiting() -> bool:
            waiting = await (await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).fetchone()
            return claim.done() or waiting[0] > 0
        await wait_until(finished_or_waiting, 5, "the fleet claim to finish or wait for the fleet lock", 0.01)


async def _live_leases(queue: Queue) -> int:
    async with queue.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM jobs WHERE status = 'RUNNING' AND lease_expires_at > now()")
        return (await cur.fetchone())[0]


@pytest.mark.parametrize("renewal_checks", ["while the lease is live", "after the lease ran out"])
async def test_a_renewal_in_flight_never_lets_a_fleet_claim_exceed_the_limit(make_queue, submission, databases,
                                                                          renewal_checks):
    """Fleet limit 1. Worker A's renewal is held inside its transaction while its lease, as committed,
    runs out, and worker B's fleet claim comes in then. Checked while live, the renewal will commit a
    longer lease; checked after, it must not revive the lease. Either way B must not count A's slot free
    and take a second job beside a lease that turns out live: B finds the fleet lock taken (the renewal
    holds it, shared) and claims nothing; its next claim, after the renewal's commit, counts what it
    committed."""
    faults, resume = FaultPlan(), asyncio.Event()
    faults.arm_pause("during_renewal", until=resume)
    worker_a, worker_b = make_queue(faults=faults), make_queue()
    for _ in range(2):
        await worker_b.submit(submission())
    (job_a,) = await worker_a.claim(1, "worker-A", lease_seconds=0.5, fleet_limit=1)
    if renewal_checks == "after the lease ran out":
        await wait_until_lease_ran_out(worker_a, job_a)
    renewal = asyncio.create_task(worker_a.renew(job_a, 30.0, fleet_limited=True))
    await wait_until(lambda: faults.pauses_in_progress > 0, 5, "worker A's renewal to be held", 0.01)
    await wait_until_lease_ran_out(worker_b, job_a)
    claim_b = asyncio.create_task(worker_b.claim(1, "worker-B", 30.0, fleet_limit=1))
    await _claim_runs_into(claim_b, databases)
    resume.set()
    renewed = await renewal
    assert renewed is (renewal_checks == "while the lease is live")
    assert await claim_b == []
    assert len(await worker_b.claim(1, "worker-B", 30.0, fleet_limit=1)) == (0 if renewed else 1)
    assert await _live_leases(worker_b) == 1
    assert (await invariants.fleet_limit_check(databases, 1)).held


async def test_fleet_limit_needs_leases(make_queue):
    """Without leases a crashed worker's slot would never come back: refused."""
    with pytest.raises(ValueError, match="fleet limit"):
        await make_queue(Mechanisms().without("leases")).claim(1, "w", 30.0, fleet_limit=1)


async def _fleet_run(databases, fleet_args: list[str], tmp_path) -> tuple[int, list[Check]]:
    """Three worker processes of 3 permits each. The first claims 3 slow jobs (a 5 s lease) and dies by
    SIGKILL after its first charge, holding its slots; once the other two are both idle, 9 more jobs come
    in one commit, so both are woken together however loaded the machine is. Returns the charge
    service's in-flight peak and the invariant checks."""
    def charges(first: int, count: int) -> list[Submission]:
        return [Submission({"amount_cents": 100 + i, "currency": "USD"}, kind="charge") for i in range(first, count)]
    async with local_system(databases=databases, servers="processes", api=False, charge_args=["--latency", "0.5"],
                            worker_pool_size=0, logs=tmp_path) as system:
        await system.queue.submit_many(charges(0, 3))
        args = ["--concurrency", "3", *fleet_args]
        doomed = system.spawn_worker("doomed", 5.0, *args, "--crash-at", "after_effect_before_finalize")
        assert await processes.wait_exit(doomed, 30) == -9
        survivors = [f"worker-{i}" for i in (1, 2)]
        for worker_id in survivors:
            system.spawn_worker(worker_id, 1.0, *args)
        await wait_until(lambda: _all_idle(system.queue, survivors), 30, "both workers to be idle", 0.05)
        await system.queue.submit_many(charges(3, 12))
        try:
            await system.wait_settled(timeout=60)
        except TimeoutError as error:
            now = await system.queue.database_now()
            stuck = [(j.status, j.worker_id, j.attempts, j.lease_expires_at and (j.lease_expires_at - now))
                     for j in await system.queue.list() if j.status not in ("SUCCEEDED", "DEAD")]
            raise AssertionError(f"{error}; unfinished: {stuck}") from None
        peak = (await system.charge_stats())["in_flight_peak"]
        return peak, await invariants.check_stored(databases)


async def _all_idle(queue: Queue, worker_ids: list[str]) -> bool:
    async with queue.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM idle_workers WHERE worker_id = ANY(%s) "
                                 "AND until > clock_timestamp()", [worker_ids])
        return (await cur.fetchone())[0] == len(worker_ids)


@pytest.mark.slow
async def test_fleet_limit_holds_across_three_worker_processes_and_a_crash(databases, tmp_path):
    """--fleet-limit 3 over three processes of 3 permits: never more than 3 charges in flight, even
    while a killed worker's slot waits for its lease; every job finishes, each charged once."""
    peak, checks = await _fleet_run(databases, ["--fleet-limit", "3"], tmp_path)
    assert peak <= 3
    assert all(check.held for check in checks), [c.line() for c in checks]


@pytest.mark.slow
async def test_without_a_fleet_limit_the_fleet_exceeds_it(databases, tmp_path):
    """The same fleet without the limit: each worker's own permits are the only bound (up to 6 here)."""
    peak, _ = await _fleet_run(databases, [], tmp_path)
    assert peak > 3


async def test_a_claim_that_finds_the_gate_taken_claims_nothing_until_it_is_free(make_queue, submission,
                                                                                databases):
    """Another claim holds the fleet's lock: a claim does not wait for it but claims nothing (its worker
    tries again at the next poll); once the lock is free, the next claim takes the job."""
    queue = make_queue()
    await queue.submit(submission())
    with psycopg.connect(databases.queue_url) as holder:
        assert holder.execute(sql.queries("queue")["job_fleet_claim_gate"]).fetchone()[0]  # held until commit
        assert await asyncio.wait_for(queue.claim(1, "poller", 30.0, fleet_limit=5), 5) == []
        holder.commit()
    assert len(await queue.claim(1, "poller", 30.0, fleet_limit=5)) == 1


async def test_a_held_renewal_never_makes_a_healthy_renewal_wait_behind_a_fleet_claim(make_queue, submission,
                                                                                    databases):
    """Fleet limit 3, two jobs running. Worker A's renewal is held inside its transaction (holding the gate
    shared) while worker C's fleet claim comes in, then worker B's renewal. Had the claim queued for the
    gate, B's renewal (shared) would queue behind it (PostgreSQL's lock queue is fair) until A's renewal
    ended, and B, a healthy worker, would lose its lease. The claim must skip this poll instead: B's
    renewal commits at once and the free slot is claimed once the gate is free."""
    faults, resume = FaultPlan(), asyncio.Event()
    worker_a, worker_b, worker_c = make_queue(faults=faults), make_queue(), make_queue()
    for _ in range(3):
        await worker_c.submit(submission())
    (job_a,) = await worker_a.claim(1, "worker-A", lease_seconds=30.0, fleet_limit=3)
    (job_b,) = await worker_b.claim(1, "worker-B", lease_seconds=1.0, fleet_limit=3)
    faults.arm_pause("during_renewal", until=resume, job_filter=lambda job: job.id == job_a.id)
    renewal_a = asyncio.create_task(worker_a.renew(job_a, 30.0, fleet_limited=True))
    await wait_until(lambda: faults.pauses_in_progress > 0, 5, "worker A's renewal to be held", 0.01)
    claim_c = asyncio.create_task(worker_c.claim(1, "worker-C", 30.0, fleet_limit=3))
    await _claim_runs_into(claim_c, databases)
    renewal_b = asyncio.create_task(worker_b.renew(job_b, 30.0, fleet_limited=True))
    await wait_until_lease_ran_out(worker_b, job_b)  # B's lease as claimed; renewed, it runs on
    resume.set()
    assert await renewal_a is True
    assert await renewal_b is True, "worker B's renewal waited behind the fleet claim and lost its lease"
    assert await claim_c == []  # the gate was taken: nothing claimed this poll
    assert len(await worker_c.claim(1, "worker-C", 30.0, fleet_limit=3)) == 1  # the next poll takes the slot
    assert await _live_leases(worker_c) == 3
    assert (await invariants.fleet_limit_check(databases, 3)).held
