"""A worker running jobs end to end (real PostgreSQL, the API and the charge service over real HTTP on
loopback, workers in this process): every job charged and finalized once, handlers chosen by kind,
successes sharing a commit, the semaphore's bound on jobs in flight, a graceful stop, and the counters the
benchmark reads."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.handlers import JobContext, Outcome
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.payload import Submission
from tests.conftest import recording_handlers
from tests.integration.ledger_counts import abhcf, counts_by_job, only_counts

# -- the happy path --------------------------------------------------------------------------------

async def test_happy_path_every_job_charged_and_finalized_once(databases):
    """Five jobs submitted over HTTP all succeed, each with A=1 H=1 C=1 F=1."""
    async with local_system(databases=databases) as system:
        ids = [await system.submit_http(1000 + i) for i in range(5)]
        worker = system.worker(fast_settings())
        system.start_worker(worker)
        await system.wait_settled(timeout=10)
        counts = await counts_by_job(system)
    assert set(counts) == set(ids)
    for c in counts.values():
        assert c.status == "SUCCEEDED"
        assert abhcf(c) == (1, 1, 1, 1), c.short()
    assert worker.stats.succeeded == 5
    assert worker.stats.lost_finalizes == 0


async def test_successes_finishing_together_share_a_commit(databases):
    """Six successes arriving at once, with four permits: two commits (four, then two), and all win."""
    async with local_system(databases=databases) as system:
        for amount in range(1000, 1006):
            await system.submit_http(amount)
        worker = system.worker(fast_settings(concurrency=4))
        jobs = await system.queue.claim(6, worker.worker_id, 30)
        assert await asyncio.gather(*(worker.successes.submit(job) for job in jobs)) == [True] * 6
        assert worker.stats.success_commits == 2
        assert (await system.queue.counts())["SUCCEEDED"] == 6


async def test_jobs_are_handled_by_kind(databases):
    """A `noop` job succeeds without any charge request; a kind no handler knows (stored straight through
    the queue, past the API's check) goes DEAD saying so."""
    async with local_system(databases=databases) as system:
        for kind in ("noop", "mystery"):
            await system.submit_direct(Submission({"amount_cents": 1250, "currency": "USD"}, kind=kind))
        system.start_worker(system.worker(fast_settings()))
        await system.wait_settled(timeout=10)
        outcomes = {c.status: c for c in await system.counts()}
        (mystery,) = await system.queue.list("DEAD")
    assert abhcf(outcomes["SUCCEEDED"]) == (1, 0, 0, 1)
    assert abhcf(outcomes["DEAD"]) == (1, 0, 0, 0)  # F counts successful finalizes
    assert "no handler for job kind 'mystery'" in mystery.last_error



async def test_a_registered_handler_runs_its_kind(databases):
    """A kind registered by the caller runs with the job's payload, attempt and idempotency key."""
    handlers, seen = recording_handlers("record", Outcome("ok", "recorded"))
    async with local_system(databases=databases) as system:
        await system.submit_direct(Submission({"n": 7}, kind="record"))
        system.start_worker(system.worker(fast_settings(), handlers=handlers))
        await system.wait_settled(timeout=10)
        (job,) = await system.queue.list("SUCCEEDED")
    assert seen == [JobContext(job.id, {"n": 7}, 1, job.idempotency_key)]


# -- the semaphore ------------------------------------------------------------------------------------

async def submit_many(system: LocalSystem, n: int) -> list[uuid.UUID]:
    return list(await asyncio.gather(*(system.submit_http(1000 + i) for i in range(n))))


@pytest.mark.slow
async def test_semaphore_bounds_jobs_in_flight(databases):
    """With the semaphore on, a worker with concurrency 3 never has more than 3 charges in flight."""
    async with local_system(charge_faults=ChargeFaults(latency_seconds=0.2), databases=databases) as system:
        await submit_many(system, 12)
        worker = system.worker(fast_settings(concurrency=3))
        system.start_worker(worker)
        await system.wait_settled(timeout=20)
        service = await system.charge_stats()
        counts = await system.counts()
    assert worker.stats.in_flight_peak == 3
    assert 1 <= service["in_flight_peak"] <= 3
    assert [c.status for c in counts] == ["SUCCEEDED"] * 12


async def test_without_semaphore_a_worker_starts_everything_due(databases):
    """With the semaphore off, the same worker claims and starts all 12 due jobs at once."""
    mechanisms = Mechanisms().without("semaphore")
    async with local_system(mechanisms, ChargeFaults(latency_seconds=0.2), databases=databases) as system:
        await submit_many(system, 12)
        worker = system.worker(fast_settings(concurrency=3))
        system.start_worker(worker)
        await system.wait_settled(timeout=20)
        service = await system.charge_stats()
    assert worker.stats.in_flight_peak == 12
    assert service["in_flight_peak"] > 3


# -- graceful stop ------------------------------------------------------------------------------------

async def wait_for_charge_in_flight(system: LocalSystem) -> None:
    async def in_charge() -> bool:
        return (await system.charge_stats())["in_flight"] >= 1
    await system.wait_until(in_charge, 10, "a charge request to be in flight")


async def test_stop_within_grace_lets_the_handler_finish(databases):
    """request_stop during a slow charge lets the handler finish within the grace: the job SUCCEEDS."""
    async with local_system(charge_faults=ChargeFaults(latency_seconds=0.5), databases=databases) as system:
        job_id = await system.submit_http(1250)
        worker = system.worker(fast_settings(shutdown_grace_seconds=5.0))
        task = system.start_worker(worker)
        await wait_for_charge_in_flight(system)
        worker.request_stop()
        stats = await asyncio.wait_for(task, 10)
        job = await system.queue.get(job_id)
        c = await only_counts(system)
    assert job.status == "SUCCEEDED"
    assert stats.abandoned == 0
    assert stats.succeeded == 1
    assert abhcf(c) == (1, 1, 1, 1), c.short()


@pytest.mark.slow
async def test_stop_past_grace_abandons_the_job_to_lease_expiry(databases):
    """A handler still charging when the grace runs out is abandoned, never marked SUCCEEDED, and reclaimed."""
    async with local_system(charge_faults=ChargeFaults(latency_seconds=1.0), databases=databases) as system:
        job_id = await system.submit_http(1250)
        settings = fast_settings(lease_seconds=1.0, shutdown_grace_seconds=0.05)
        worker = system.worker(settings.with_id("worker-1"))
        task = system.start_worker(worker)
        await wait_for_charge_in_flight(system)
        worker.request_stop()
        stats = await asyncio.wait_for(task, 10)
        job = await system.queue.get(job_id)
        assert stats.abandoned == 1
        assert stats.succeeded == 0
        assert job.status == "RUNNING"
        assert job.worker_id == "worker-1"
        assert job.lease_expires_at is not None and job.lease_expires_at > await system.queue.database_now()
        assert (await only_counts(system)).finalizations == 0

        # The lease then expires and another worker finishes the job, charged once.
        system.start_worker(system.worker(settings.with_id("worker-2")))
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        c = await only_counts(system)
    assert job.status == "SUCCEEDED"
    assert (c.attempts, c.charges, c.finalizations) == (2, 1, 1), c.short()


async def test_worker_counts_its_claims_charges_and_finalizes(databases):
    """The timing counters the benchmark reads: one charge call and one finalize per job run."""
    async with local_system(databases=databases) as system:
        for i in range(3):
            await system.submit_http(1000 + i)
        worker = system.worker(fast_settings())
        system.start_worker(worker)
        await system.wait_settled(timeout=20)
        (stats,) = await system.stop_workers()
    assert (stats.handler_calls, stats.finalize_calls, stats.succeeded) == (3, 3, 3)
    assert stats.claim_calls >= 1 and stats.handler_seconds_total > 0 and stats.finalize_seconds_total > 0
