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
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.permits import Permits
from reliableq.worker import Worker
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
        finalized = await asyncio.gather(*(worker.successes.submit((job, False)) for job in jobs))
        assert finalized == [(True, None)] * 6
        assert worker.stats.success_commits == 2
        assert (await system.queue.counts())["SUCCEEDED"] == 6


async def test_a_success_hands_its_permit_to_a_job_claimed_in_its_commit(databases):
    """One permit, twelve jobs: after the loop's first claim each success claims the next job in its own
    commit; every job runs once. With permits given from outside (a learner's, in the lab) the loop claims
    each job, after asking them."""
    noop = Submission({}, kind="noop")
    async with local_system(databases=databases) as system:
        for _ in range(12):
            await system.submit_direct(noop)
        # No polls: a claim is made only when a permit is free.
        chained = system.worker(fast_settings(concurrency=1, wake_on_submit=False, poll_seconds=60))
        system.start_worker(chained)
        await system.wait_settled(timeout=20)
        (chained_stats,) = await system.stop_workers()
        assert (chained_stats.claimed, chained_stats.succeeded, chained_stats.success_commits) == (12, 12, 12)
        # The loop's claims: the first, and perhaps (if it came before the stop) one that found nothing.
        assert chained_stats.claim_calls <= 2
        assert (chained_stats.claimed_with_a_success, chained_stats.in_flight_peak) == (11, 1)
        assert [c.attempts for c in await system.counts()] == [1] * 12

        for _ in range(12):
            await system.submit_direct(noop)
        made = system.worker(fast_settings(concurrency=1, wake_on_submit=False, poll_seconds=60))
        asked = Worker(made.queue, made.handlers, made.settings, permits=Permits(1))
        system.start_worker(asked)
        await system.wait_settled(timeout=20)
        (asked_stats,) = await system.stop_workers()
        assert (asked_stats.succeeded, asked_stats.claimed_with_a_success) == (12, 0)
        assert asked_stats.claim_calls >= 12


async def test_a_stopping_worker_claims_nothing_in_its_last_commit(databases):
    """Asked to stop while its success waits to be committed, a worker commits it and claims nothing: the
    next job stays PENDING."""
    async with local_system(databases=databases) as system:
        first = await system.submit_direct(Submission({}, kind="noop"))
        second = await system.submit_direct(Submission({}, kind="noop"))
        finish = asyncio.Event()
        faults = FaultPlan()
        faults.arm_pause("before_group_commit", until=finish)
        worker = system.worker(fast_settings(concurrency=1, wake_on_submit=False), faults)
        system.start_worker(worker)
        await wait_until(lambda: faults.pauses_in_progress == 1, 10, "the first job paused")
        worker.request_stop()
        finish.set()
        (stats,) = await system.stop_workers()
        assert stats.succeeded == 1
        assert {(await system.queue.get(job.id)).status for job in (first, second)} == {"SUCCEEDED", "PENDING"}


async def test_a_lost_answer_to_a_success_and_claim_still_runs_the_job_it_claimed(databases, caplog):
    """The commit that finalized one job and claimed the next committed, but its answer was lost: the
    worker reads what it committed and runs the claimed job at once, not after its lease runs out."""
    async with local_system(databases=databases) as system:
        first = await system.submit_direct(Submission({}, kind="noop"))
        second = await system.submit_direct(Submission({}, kind="noop"))
        faults = FaultPlan()
        # Only an answer lost after the commit: no point inside a transaction, so the success and the claim
        # commit together as they do without a plan (under one, the claim would follow the lost answer).
        faults.stops_inside_transactions = False
        faults.arm_lost_answer(job_filter=lambda job: job.id == first.id)
        # A lease far longer than the test's deadline: the claimed job can only finish if it is found.
        worker = system.worker(fast_settings(concurrency=1, wake_on_submit=False, lease_seconds=60, poll_seconds=60),
                               faults)
        system.start_worker(worker)
        await system.wait_settled(timeout=20)
        (stats,) = await system.stop_workers()
        assert [t.action for t in faults.triggered] == ["lose_answer"]
        assert [(await system.queue.get(job.id)).attempts for job in (first, second)] == [1, 1]
        assert (stats.succeeded, stats.lost_finalizes, stats.claimed_with_a_success) == (2, 0, 1)
    assert "answer was lost; the commit is on record, with 1 job(s) claimed" in caplog.text


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
