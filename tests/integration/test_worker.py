"""The worker end to end: real PostgreSQL, the API and the charge service over real HTTP on loopback,
workers in this process, crashes simulated at the named fault points. Every claim is checked against
what the databases recorded afterwards: A attempts, H handler runs, C charges, F finalizations."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import pytest

from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.handlers import JobContext, Outcome
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.lab.ledger import JobCounts
from reliableq.payload import Submission
from reliableq.queue import MAX_ERROR_CHARS
from reliableq.worker import Worker
from tests.conftest import recording_handlers

LEASE = 0.5  # seconds; short, so a crashed worker's job is reclaimable quickly


def fixed_ids(label: str, n: int) -> list[uuid.UUID]:
    """Job ids that are the same on every run, so the charge service's seeded draws are too."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"reliableq-test/{label}/{i}") for i in range(n)]


async def counts_by_job(system: LocalSystem) -> dict[uuid.UUID, JobCounts]:
    return {c.job_id: c for c in await system.counts()}


async def only_counts(system: LocalSystem) -> JobCounts:
    (counts,) = await system.counts()
    return counts


def abhcf(c: JobCounts) -> tuple[int, int, int, int]:
    return c.attempts, c.handler_runs, c.charges, c.finalizations


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


@pytest.mark.parametrize("finalize", ["succeed", "retry", "dead"])
async def test_a_finalize_whose_commit_answer_was_lost_reports_what_it_committed(databases, caplog, finalize):
    """The COMMIT of the first finalize succeeds but its answer is lost: the worker tries again, first
    reads what its claim recorded, and reports the win it made. Retrying blindly, the fence refused the
    worker's own success and it logged "lease lost" and counted a lost finalize for a finalize it won."""
    charge_faults = {"succeed": ChargeFaults(), "retry": ChargeFaults(transient_rate=1.0),
                     "dead": ChargeFaults(permanent_rate=1.0)}[finalize]
    async with local_system(charge_faults=charge_faults, databases=databases) as system:
        job_id = await system.submit_http(1250, max_attempts=2)
        faults = FaultPlan()
        faults.arm_lost_answer()
        worker = system.worker(fast_settings(), faults)
        system.start_worker(worker)
        await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        outcomes = [a["outcome"] for a in await system.queue.attempts_of(job_id)]
        stats = (await system.stop_workers())[0]
    assert [t.action for t in faults.triggered] == ["lose_answer"]
    expected = {"succeed": ["succeeded"], "retry": ["retried", "dead"], "dead": ["dead"]}[finalize]
    assert outcomes == expected
    assert (stats.succeeded, stats.retried, stats.dead, stats.lost_finalizes) == (
        outcomes.count("succeeded"), outcomes.count("retried"), outcomes.count("dead"), 0)
    assert "refused" not in caplog.text and "answer was lost" in caplog.text


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


# -- failures of the charge service -------------------------------------------------------------------

async def test_transient_failures_are_retried_until_charged_once(databases):
    """Seeded 503s are retried with backoff; every job succeeds with one charge, one request per attempt."""
    faults = ChargeFaults(transient_rate=0.5, seed=3)
    ids = fixed_ids("transient", 10)
    # The draws are seeded by (seed, job, request number): the failures each job meets are known now.
    expected_attempts = {}
    for job_id in ids:
        n = 0
        while faults.draw(str(job_id), n) is not None:
            n += 1
        expected_attempts[job_id] = n + 1
    assert sum(expected_attempts.values()) > len(ids), "the seed should make some jobs fail at least once"

    async with local_system(charge_faults=faults, databases=databases) as system:
        for job_id in ids:
            charge = Submission({"amount_cents": 1250, "currency": "USD"}, max_attempts=20, kind="charge")
            await system.submit_direct(charge, job_id)
        worker = system.worker(fast_settings())
        system.start_worker(worker)
        await system.wait_settled(timeout=20)
        counts = await counts_by_job(system)
        attempts = {job_id: await system.queue.attempts_of(job_id) for job_id in ids}

    for job_id in ids:
        c = counts[job_id]
        assert c.status == "SUCCEEDED"
        assert (c.charges, c.finalizations) == (1, 1), c.short()
        assert c.attempts == c.handler_runs == expected_attempts[job_id], c.short()
        outcomes = [a["outcome"] for a in attempts[job_id]]
        assert outcomes == ["retried"] * (c.attempts - 1) + ["succeeded"]
        assert all("transient" in a["error"] for a in attempts[job_id][:-1])
    assert worker.stats.retried == sum(expected_attempts.values()) - len(ids)


async def test_permanent_failure_goes_dead_after_one_attempt(databases):
    """A permanent failure (422) makes the job DEAD at once, with a one-line, bounded last_error."""
    async with local_system(charge_faults=ChargeFaults(permanent_rate=1.0), databases=databases) as system:
        job_id = await system.submit_http(1250)
        system.start_worker(system.worker(fast_settings()))
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert job.status == "DEAD"
    assert job.attempts == 1
    assert job.last_error == "permanent failure: injected permanent failure: card rejected"
    assert "\n" not in job.last_error and len(job.last_error) <= MAX_ERROR_CHARS
    assert job.finalized_at is not None
    assert abhcf(c) == (1, 1, 0, 0), c.short()
    assert [a["outcome"] for a in attempts] == ["dead"]


async def test_without_dead_a_permanent_failure_is_retried_forever(databases):
    """With dead off, a permanently failing job is retried past its budget and never becomes DEAD."""
    mechanisms = Mechanisms().without("dead")
    async with local_system(mechanisms, ChargeFaults(permanent_rate=1.0), databases=databases) as system:
        job_id = await system.submit_http(1250, max_attempts=2)
        system.start_worker(system.worker(fast_settings()))
        seen: set[str] = set()

        async def past_budget() -> bool:
            job = await system.queue.get(job_id)
            seen.add(job.status)
            return job.attempts >= 4
        await system.wait_until(past_budget, 10, "the job to be attempted 4 times")
        job = await system.queue.get(job_id)
        attempts = await system.queue.attempts_of(job_id)
    assert "DEAD" not in seen
    assert job.status in {"PENDING", "RUNNING"}
    assert job.attempts > job.max_attempts == 2
    assert "dead" not in {a["outcome"] for a in attempts}
    assert [a["outcome"] for a in attempts[:3]] == ["retried"] * 3


async def test_attempt_budget_makes_a_failing_job_dead(databases):
    """A job that fails transiently every time goes DEAD after exactly max_attempts attempts."""
    async with local_system(charge_faults=ChargeFaults(transient_rate=1.0), databases=databases) as system:
        job_id = await system.submit_http(1250, max_attempts=3)
        system.start_worker(system.worker(fast_settings()))
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert job.status == "DEAD"
    assert job.attempts == 3
    assert "3 attempts" in job.last_error
    assert "transient" in job.last_error
    assert abhcf(c) == (3, 3, 0, 0), c.short()
    assert [a["outcome"] for a in attempts] == ["retried", "retried", "dead"]


async def test_ambiguous_outcome_retried_safely_with_the_same_key(databases):
    """A charge committed whose answer was lost is retried with the same key: two requests, one charge."""
    (job_id,) = fixed_ids("ambiguous", 1)
    seed = next(s for s in range(10_000)
                if ChargeFaults(lost_response_rate=0.5, seed=s).draw(str(job_id), 0) == "lost_response"
                and ChargeFaults(lost_response_rate=0.5, seed=s).draw(str(job_id), 1) is None)
    faults = ChargeFaults(lost_response_rate=0.5, hang_seconds=2, seed=seed)
    async with local_system(charge_faults=faults, databases=databases) as system:
        await system.submit_direct(Submission({"amount_cents": 1250, "currency": "USD"}, kind="charge"), job_id)
        worker = system.worker(fast_settings(charge_timeout_seconds=0.3))
        system.start_worker(worker)
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert job.status == "SUCCEEDED"
    assert abhcf(c) == (2, 2, 1, 1), c.short()
    assert [a["outcome"] for a in attempts] == ["retried", "succeeded"]
    assert "ambiguous" in attempts[0]["error"]


# -- the semaphore ------------------------------------------------------------------------------------

async def submit_many(system: LocalSystem, n: int) -> list[uuid.UUID]:
    return list(await asyncio.gather(*(system.submit_http(1000 + i) for i in range(n))))


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
