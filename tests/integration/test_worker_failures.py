"""A worker meeting failures it survives, end to end (real PostgreSQL, the API and the charge service over
real HTTP on loopback): the charge service's transient, permanent and ambiguous failures, retried with the
same key or made DEAD within the attempt budget, and a finalize whose COMMIT answer was lost."""

from __future__ import annotations

import uuid

import pytest

from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import fast_settings, local_system
from reliableq.payload import Submission
from reliableq.queue import MAX_ERROR_CHARS
from tests.integration.ledger_counts import abhcf, counts_by_job, only_counts


def fixed_ids(label: str, n: int) -> list[uuid.UUID]:
    """Job ids that are the same on every run, so the charge service's seeded draws are too."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"reliableq-test/{label}/{i}") for i in range(n)]


# -- a finalize whose COMMIT answer was lost ---------------------------------------------------------

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


@pytest.mark.slow
async def test_ambiguous_outcome_retried_safely_with_the_same_key(databases):
    """A charge committed whose answer was lost is retried with the same key: two requests, one charge."""
    (job_id,) = fixed_ids("ambiguous", 1)
    seed = next(s for s in range(10_000)
                if ChargeFaults(lost_response_rate=0.5, seed=s).draw(str(job_id), 0) == "lost_response"
                and ChargeFaults(lost_response_rate=0.5, seed=s).draw(str(job_id), 1) is None)
    faults = ChargeFaults(lost_response_rate=0.5, hang_seconds=2, seed=seed)
    async with local_system(charge_faults=faults, databases=databases) as system:
        await system.submit_direct(Submission({"amount_cents": 1250, "currency": "USD"}, kind="charge"), job_id)
        worker = system.worker(fast_settings(), charge_timeout_seconds=0.3)
        system.start_worker(worker)
        job = await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=10)
        c = await only_counts(system)
        attempts = await system.queue.attempts_of(job_id)
    assert job.status == "SUCCEEDED"
    assert abhcf(c) == (2, 2, 1, 1), c.short()
    assert [a["outcome"] for a in attempts] == ["retried", "succeeded"]
    assert "ambiguous" in attempts[0]["error"]
