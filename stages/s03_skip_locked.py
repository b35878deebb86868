"""Stage 3, skip-locked: a claim must be one atomic step, or two workers take the same job.

Failure: the naive claim reads the due jobs, then updates them in a separate statement. Two workers
that both read before either updates each take every job: each job runs twice, with no crash at all
(A=2, H=2, and with idempotency and fencing still off, C=2 and F=2).
Invariant: one claim per job at a time; with SELECT ... FOR UPDATE SKIP LOCKED the read and the
update are one transaction and a row another claimer holds is skipped, not waited for.
Boundary: it only serialises claims. A worker that crashes holding its claim keeps the job forever
(stage leases).
"""

from __future__ import annotations

import asyncio

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "skip-locked"
MECHANISM = "skip_locked"
FAILURE = "two workers read the same due job before either marks it: it runs twice without any crash"
INVARIANT = "each job is claimed by one worker at a time (A=1 when nothing fails)"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "Two workers use the naive read-then-update claim, and both read the four due jobs before either updates "
        "them. Nothing crashes. How many times is each job charged?"
    ),
    options=[
        "Once: the second UPDATE fails because the job is already RUNNING",
        "Once: PostgreSQL serializes the two UPDATEs",
        "Twice: both workers believe they own every job",
        "Zero: the two workers deadlock",
    ],
    answer="Twice: both workers believe they own every job",
    why=(
        "The naive UPDATE marks the job RUNNING without checking it was still PENDING, so both updates succeed. "
        "PostgreSQL does serialize them, but serializing two updates that both succeed does not help. Each worker's "
        "own view is perfectly consistent, which is why neither logs anything."
    ),
)


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Two real workers over one queue, their claims made to meet: the naive claim is held open between
    its read and its update; the one-statement claim meets rows held locked as a third claim would."""
    async with experiment(NAME, MECHANISM, on, params) as run:
        ids = await run.submit()
        both_read = asyncio.Event()
        faults = run.faults()
        faults.arm_pause("before_claim_update", until=both_read, times=2)
        workers = [run.worker(f"worker-{n}", faults) for n in (1, 2)]

        async def both_paused() -> bool:
            return sum(t.action == "pause" for t in faults.triggered) == 2

        async def both_met_the_held_jobs() -> bool:
            returned = sum(worker.stats.claim_calls > 0 for worker in workers)
            return returned + await run.lock_waiters() >= 2

        if not run.mechanisms.skip_locked:
            for worker in workers:
                run.system.start_worker(worker)
            # Pin the race open: both have read the due jobs, neither has updated them yet.
            await run.wait_for(both_paused, "both workers to read the due jobs")
        else:
            # One statement has no point between its read and its update to pause at. Make the two
            # claims meet instead: the jobs' rows are held locked, as a third claim would hold them, from
            # before the workers start until both claims have met them (skipped every one, or wait for
            # one), so the two claims run at the same moment every time.
            async with run.jobs_held(ids):
                for worker in workers:
                    run.system.start_worker(worker)
                await run.wait_for(both_met_the_held_jobs, "both workers' claims to meet the held jobs")
        both_read.set()
        await run.wait_settled(ids)
        result = await run.result()
        result.measurements = {
            "claims_by_worker": {w.worker_id: w.stats.claimed for w in workers},
            "jobs_claimed_twice": sum(c.attempts > 1 for c in result.jobs),
        }
        return result
