"""A worker crashed at each named fault point, end to end (real PostgreSQL, the API and the charge service
over real HTTP on loopback, workers in this process): another worker recovers the job once its lease runs
out, charging it once; without leases it is stranded; a stalled worker's late finalize is fenced out, and
a success waiting for its commit keeps its lease."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import pytest

from reliableq.config import Mechanisms
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.worker import Worker
from tests.integration.ledger_counts import abhcf, counts_by_job, only_counts

LEASE = 0.5  # seconds; short, so a crashed worker's job is reclaimable quickly


def count_claims(worker: Worker) -> list[int]:
    """Wrap the worker's claim so the test can tell how many times its loop polled the queue."""
    calls = [0]
    claim = worker.queue.claim

    async def counted(*args, **kwargs):
        calls[0] += 1
        return await claim(*args, **kwargs)

    worker.queue.claim = counted
    return calls


async def crash_then_recover(system: LocalSystem, point: str) -> tuple[uuid.UUID, str | None]:
    """Submit one job, let a first worker crash at `point`, start a second worker; return (job, crash)."""
    settings = fast_settings(lease_seconds=LEASE)
    job_id = await system.submit_http(1250)
    faults = FaultPlan()
    faults.arm_crash(point)
    first = await asyncio.wait_for(system.worker(settings.with_id("worker-1"), faults).run(), 10)
    system.start_worker(system.worker(settings.with_id("worker-2")))
    await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
    return job_id, first.crashed_at


# -- crashes at each fault point ---------------------------------------------------------------------

async def test_crash_after_charge_reclaimed_and_charged_once(databases):
    """A crash after the charge and before the finalize runs the job twice but charges it once."""
    async with local_system(databases=databases) as system:
        job_id, crashed_at = await crash_then_recover(system, "after_effect_before_finalize")
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert crashed_at == "after_effect_before_finalize"
    assert c.status == "SUCCEEDED"
    assert abhcf(c) == (2, 2, 1, 1), c.short()
    assert [a["outcome"] for a in attempts] == ["expired", "succeeded"]
    assert [a["worker_id"] for a in attempts] == ["worker-1", "worker-2"]


async def test_crash_after_charge_without_idempotency_charges_twice(databases):
    """With idempotency off, the same crash after the charge makes the retry charge a second time."""
    async with local_system(Mechanisms().without("idempotency"), databases=databases) as system:
        _, crashed_at = await crash_then_recover(system, "after_effect_before_finalize")
        c = await only_counts(system)
    assert crashed_at == "after_effect_before_finalize"
    assert c.status == "SUCCEEDED"
    assert abhcf(c) == (2, 2, 2, 1), c.short()


async def test_crash_before_charge_retried_with_one_handler_run(databases):
    """A crash after the claim and before the charge costs an attempt but no handler run."""
    async with local_system(databases=databases) as system:
        _, crashed_at = await crash_then_recover(system, "after_claim_before_effect")
        c = await only_counts(system)
    assert crashed_at == "after_claim_before_effect"
    assert c.status == "SUCCEEDED"
    assert abhcf(c) == (2, 1, 1, 1), c.short()


async def test_crash_during_finalize_rolls_the_finalize_back(databases):
    """A crash inside the finalize transaction rolls it back; the retry finalizes once, charged once."""
    async with local_system(databases=databases) as system:
        job_id, crashed_at = await crash_then_recover(system, "during_finalize")
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert crashed_at == "during_finalize"
    assert c.status == "SUCCEEDED"
    assert abhcf(c) == (2, 2, 1, 1), c.short()
    # The first attempt's `succeeded` was never committed: its lease simply expired.
    assert [a["outcome"] for a in attempts] == ["expired", "succeeded"]


# -- leases ---------------------------------------------------------------------------------------

async def test_without_leases_a_crashed_workers_job_is_stranded(databases):
    """With leases off, a job whose worker crashed stays RUNNING however often another worker polls."""
    async with local_system(Mechanisms().without("leases"), databases=databases) as system:
        job_id = await system.submit_http(1250)
        faults = FaultPlan()
        faults.arm_crash("after_claim_before_effect")
        settings = fast_settings(lease_seconds=LEASE)
        first = await asyncio.wait_for(system.worker(settings.with_id("worker-1"), faults).run(), 10)
        assert first.crashed_at == "after_claim_before_effect"
        crashed = time.monotonic()

        second = system.worker(settings.with_id("worker-2"))
        claims = count_claims(second)
        system.start_worker(second)

        async def polled_long_enough() -> bool:
            return claims[0] >= 10 and time.monotonic() - crashed >= 2 * LEASE
        await system.wait_until(polled_long_enough, 10, "worker-2 to poll for twice the lease")
        job = await system.queue.get(job_id)
        c = await only_counts(system)
    assert job.status == "RUNNING"
    assert job.worker_id == "worker-1"
    assert job.lease_expires_at is None
    assert second.stats.claimed == 0
    assert abhcf(c) == (1, 0, 0, 0), c.short()


async def test_with_leases_a_crashed_workers_job_is_reclaimed(databases):
    """With leases on, the same stranded job is reclaimed by another worker once its lease expires."""
    async with local_system(databases=databases) as system:
        job_id = await system.submit_http(1250)
        faults = FaultPlan()
        faults.arm_crash("after_claim_before_effect")
        settings = fast_settings(lease_seconds=LEASE)
        await asyncio.wait_for(system.worker(settings.with_id("worker-1"), faults).run(), 10)
        second = system.worker(settings.with_id("worker-2"))
        system.start_worker(second)
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
    assert job.status == "SUCCEEDED"
    assert job.worker_id == "worker-2"
    assert second.stats.claimed == 1


async def test_stale_worker_finalize_is_fenced_out(databases):
    """A worker stalled past its lease loses its finalize to the worker that reclaimed the job."""
    async with local_system(databases=databases) as system:
        job_id = await system.submit_http(1250)
        resume = asyncio.Event()
        faults = FaultPlan()
        faults.arm_pause("after_effect_before_finalize", until=resume)
        settings = fast_settings(lease_seconds=LEASE)
        # One permit, held by the stalled handler: worker-1 cannot reclaim the job itself.
        stale = system.worker(replace(settings, concurrency=1).with_id("worker-1"), faults)
        system.start_worker(stale)

        async def stalled() -> bool:
            return bool(faults.triggered)
        await system.wait_until(stalled, 10, "worker-1 to stall after its charge")
        system.start_worker(system.worker(settings.with_id("worker-2")))
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        assert job.worker_id == "worker-2"
        resume.set()

        async def refused() -> bool:
            return stale.stats.lost_finalizes == 1
        await system.wait_until(refused, 10, "worker-1's finalize to be refused")
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert stale.stats.succeeded == 0
    assert abhcf(c) == (2, 2, 1, 1), c.short()
    assert [(a["worker_id"], a["outcome"]) for a in attempts] == [("worker-1", "lost_succeed"),
                                                                  ("worker-2", "succeeded")]


@pytest.mark.slow
async def test_a_success_keeps_its_lease_while_its_commit_is_held_back(databases):
    """The lease is renewed until the finalize is recorded, not only while the effect runs: two successes
    whose group commit is held back for three lease lengths keep their leases, so a second worker polling
    all along reclaims neither and nothing runs twice (A=1 H=1 C=1 F=1)."""
    async with local_system(databases=databases) as system:
        ids = [await system.submit_http(amount) for amount in (1000, 1001)]
        faults, release = FaultPlan(), asyncio.Event()
        faults.arm_pause("before_group_commit", until=release, times=2)
        settings = fast_settings(lease_seconds=LEASE, concurrency=2)
        holder = system.worker(settings.with_id("worker-1"), faults)
        system.start_worker(holder)
        await system.wait_until(_paused(faults), 10, "worker-1's successes to wait for their commit")
        system.start_worker(system.worker(settings.with_id("worker-2")))
        held_since = await system.queue.database_now()

        async def three_leases_passed() -> bool:
            return (await system.queue.database_now() - held_since).total_seconds() > 3 * LEASE
        await system.wait_until(three_leases_passed, 10, "three lease lengths")
        release.set()
        await system.wait_settled(timeout=10)
        counts = await counts_by_job(system)
    assert [abhcf(counts[job_id]) for job_id in ids] == [(1, 1, 1, 1)] * 2
    assert holder.stats.succeeded == 2 and holder.stats.lost_renewals == 0


def _paused(faults: FaultPlan):
    async def check() -> bool:
        return faults.pauses_in_progress > 0
    return check
