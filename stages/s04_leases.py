"""Stage 4, leases: a claim must expire, or a dead worker's job is stranded forever.

Failure: without leases RUNNING is just a flag. A worker that dies after claiming (here at
after_claim_before_effect) leaves its jobs RUNNING; another worker polling for two whole lease
lengths and more never sees them due again.
Invariant: every claimed job is eventually finished or claimed again; a claim is a lease with an
expiry on PostgreSQL's clock, renewed while the handler works, and an expired lease makes the job due.
Boundary: expiry cannot tell a dead worker from a slow one. A paused worker whose lease was taken
over still believes it owns the job (stage fencing).
"""

from __future__ import annotations

import asyncio

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, arm_crash_all, experiment, stage_mechanisms
from reliableq.lab.harness import SETTLED_STATUSES
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "leases"
MECHANISM = "leases"
FAILURE = "a worker dies after claiming: without an expiry its jobs stay RUNNING forever"
INVARIANT = "a claimed job whose worker died is claimed again once its lease expires"
OWN_KNOBS = ("crash_point",)
PREDICTION = Prediction(
    question=(
        "worker-1 claims all four jobs and dies before charging. worker-2 keeps polling for 2.5 lease lengths. With "
        "leases off, what happens to the jobs?"
    ),
    options=[
        "worker-2 picks them up after a while",
        "They go back to PENDING when worker-1's database connection closes",
        "They stay RUNNING: no worker will ever claim them again",
        "They become DEAD",
    ],
    answer="They stay RUNNING: no worker will ever claim them again",
    why=(
        "The claim was committed before worker-1 died; closing its connection releases no row, because no lock is "
        "held any more. RUNNING is just a column value, and nothing is responsible for changing it back: waiting "
        "longer would not help."
    ),
)
CRASH_POINT = "after_claim_before_effect"  # default; params.crash_point overrides
WAIT_LEASES = 2.5  # without leases, how many lease lengths the second worker polls before we look


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """worker-1 claims every job and crashes; worker-2 polls; see whether the jobs come back."""
    point = params.crash_point or CRASH_POINT
    async with experiment(NAME, MECHANISM, on, params) as run:
        system = run.system
        ids = await run.submit()
        faults = run.faults()
        arm_crash_all(faults, point, len(ids))
        first = await asyncio.wait_for(run.worker("worker-1", faults).run(), 20)
        crashed_at = await system.queue.database_now()
        second = run.worker("worker-2")
        system.start_worker(second)

        async def settled_or_stranded() -> bool:
            # Until every job is finished, or nothing is left to wait for: WAIT_LEASES lease lengths have
            # passed by the database's clock (the clock leases are measured by) and no job is held under a
            # live lease. Without leases (or with a claim that never reclaims) nothing changes however
            # long we wait; this waits long enough to show it.
            jobs = [await system.queue.get(job_id) for job_id in ids]
            if all(job.status in SETTLED_STATUSES for job in jobs):
                return True
            now = await system.queue.database_now()
            held = any(job.lease_expires_at is not None and job.lease_expires_at > now for job in jobs)
            return not held and (now - crashed_at).total_seconds() >= WAIT_LEASES * params.lease_seconds
        await run.wait_for(settled_or_stranded, f"every job to finish, or {WAIT_LEASES} leases to pass",
                           20 + WAIT_LEASES * params.lease_seconds)
        jobs = [await system.queue.get(job_id) for job_id in ids]
        waited = (await system.queue.database_now() - crashed_at).total_seconds()
        finished = [job.finalized_at for job in jobs if job.finalized_at]
        return await run.result({
            "crashed_at": first.crashed_at,
            "stranded": sum(job.status == "RUNNING" for job in jobs),
            "leases_waited": round(waited / params.lease_seconds, 2),
            "reclaimed_by_worker_2": second.stats.claimed,
            "recovery_seconds": round((max(finished) - crashed_at).total_seconds(), 3) if finished else None,
        })
