"""Stage 5, fencing: a worker whose lease was taken over must not be able to finalize.

Failure: worker-1 charges its jobs and pauses (a GC pause, a frozen VM) before finalizing. Its lease
expires, worker-2 reclaims the jobs, runs and finalizes them. worker-1 wakes up, still believing it
owns them, and its finalize, which checks nothing, wins as well: F=2, the attempt row says
`succeeded` twice. Had its outcome been a retry, it would have sent a finished job back to PENDING.
Invariant: only the current lease holder changes a job; every renew/succeed/retry/dead carries the
lease token, a stale token matches zero rows, and the loss is recorded (`lost_succeed`, F=1).
Boundary: fencing guards the queue's rows, not the outside world. The stale worker's charge already
happened: with idempotency still off, C=2 either way (stage idempotency).
"""

from __future__ import annotations

import asyncio

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "fencing"
MECHANISM = "fencing"
FAILURE = "a paused worker wakes after its lease was reclaimed and its stale finalize overwrites the job"
INVARIANT = "only the current lease token can finalize a job (F=1); a stale finalize changes nothing"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "worker-1 charges the four jobs, then freezes. Its lease expires; worker-2 reclaims, charges and finalizes "
        "every job. Then worker-1 wakes up and finalizes too. With fencing off, what is F (successful finalizations) "
        "for each job?"
    ),
    options=[
        "1: worker-1's update fails because the job is already SUCCEEDED",
        "1: the database keeps only the latest write",
        "2: both finalizes succeed and both are recorded",
        "0: the two finalizes conflict and both roll back",
    ],
    answer="2: both finalizes succeed and both are recorded",
    why=(
        "Without the token in its WHERE clause, the update matches the row whatever its state, so it succeeds; both "
        "attempts end as 'succeeded'. The queue's own history now claims two different workers each completed the "
        "job."
    ),
)
PAUSE_POINT = "after_effect_before_finalize"


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Pause worker-1 after its charges until worker-2 has reclaimed and finished every job; resume."""
    async with experiment(NAME, MECHANISM, on, params) as run:
        system = run.system
        ids = await run.submit()
        resume = asyncio.Event()
        faults = run.faults()
        faults.arm_pause(PAUSE_POINT, until=resume, times=len(ids))
        # A long grace: once told to stop, worker-1 still waits for its stalled handlers to finish.
        stale = run.worker("worker-1", faults, shutdown_grace_seconds=60.0)
        system.start_worker(stale)

        async def all_paused() -> bool:
            return sum(t.action == "pause" for t in faults.triggered) == len(ids)
        await run.wait_for(all_paused, "worker-1 to charge every job and pause")
        # The pause stalls only its handlers; a frozen process would not claim either. Without this
        # its own claim loop could take the expired jobs back before worker-2 does.
        stale.request_stop()

        # Started only now, so it cannot take a job before worker-1 has claimed it.
        rescuer = run.worker("worker-2")
        system.start_worker(rescuer)

        async def finished_by_rescuer() -> bool:
            jobs = [await system.queue.get(job_id) for job_id in ids]
            return all(job.status == "SUCCEEDED" and job.worker_id == "worker-2" for job in jobs)
        await run.wait_for(finished_by_rescuer, "worker-2 to reclaim and finish every job")

        resume.set()

        async def stale_finalized() -> bool:
            s = stale.stats
            return s.succeeded + s.retried + s.dead + s.lost_finalizes == len(ids)
        await run.wait_for(stale_finalized, "worker-1 to attempt its stale finalizes")

        outcomes = [a["outcome"] for a in await system.queue.attempts_of(ids[0])]
        return await run.result({
            "stale_finalizes_won": stale.stats.succeeded,
            "stale_finalizes_refused": stale.stats.lost_finalizes,
            "job_1_attempt_outcomes": outcomes,
        })
