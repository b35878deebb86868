"""Stage 2, commit-before-ack: an acknowledged job must already be durable.

Failure: the naive API sends 202 Accepted and only then inserts the job. If it crashes in between,
the client holds a job id the database never heard of: an acknowledged job is lost, and nobody will
ever run it or know to resubmit it.
Invariant: every job the API acknowledged is stored (lost_jobs = 0).
Boundary: durability of the acknowledgement only. A crash before the commit still loses the request,
but the client got no 202 and can retry; what happens to the stored job afterwards is later stages'.
"""

from __future__ import annotations

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "commit-before-ack"
MECHANISM = "commit_before_ack"
FAILURE = "the API crashes between sending 202 and committing the insert: an acknowledged job is lost"
INVARIANT = "every acknowledged job is in the database (lost_jobs = 0)"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "The API crashes right after sending job-1's 202 Accepted, before the insert. With commit_before_ack off, "
        "what will the table show for job-1?"
    ),
    options=[
        "SUCCEEDED, A = H = C = F = 1: the worker picks it up anyway",
        "PENDING: it waits for the API to come back",
        "LOST, A = H = C = F = 0: the database has no such job",
        "DEAD after five failed attempts",
    ],
    answer="LOST, A = H = C = F = 0: the database has no such job",
    why=(
        "The insert never ran, so there is no row for any worker to find. The only trace of job-1 is the id in the "
        "client's hand. The other three ran normally, which is what makes this failure so hard to notice in "
        "production: almost everything works."
    ),
)
# The notebook's second question: the window commit-before-ack leaves to the client.
LOST_ANSWER_PREDICTION = Prediction(
    question=(
        "The API commits request-1's job and is killed before its 202 leaves. The client retries every request "
        "it never heard answered, sending no key. How many jobs does the database hold after six requests?"
    ),
    options=[
        "Six: the retry finds the job request-1 already made",
        "Seven: request-1 became two jobs",
        "Five: request-1's job died with the API",
    ],
    answer="Seven: request-1 became two jobs",
    why=(
        "request-1's first try committed and only its answer was lost; the retry is a new submission, which "
        "the API cannot tell from a new order. Each of the two jobs is charged once (C = 1 holds per job: the "
        "charge service's key is the job's id). The API committed before answering and the client retried "
        "what went unanswered: both did right. Neither had a name for the request that survives a retry."
    ),
)
CRASH_POINT = "after_ack_before_commit"  # the API's only fault point; not taken from params


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Arm the API crash for the first job, submit `params.jobs` jobs over HTTP, run a worker, count."""
    async with experiment(NAME, MECHANISM, on, params) as run:
        system = run.system
        system.api_faults.arm_crash(CRASH_POINT)
        crashed = system.api_faults.triggered

        async def stored_or_crashed(job_ids) -> bool:
            # Without commit-before-ack each insert runs after its 202; wait until each has
            # either committed or died at the crash point before reading the verdict.
            crashed_ids = {t.job_id for t in crashed}
            for job_id in job_ids:
                if job_id not in crashed_ids and await system.queue.get(job_id) is None:
                    return False
            return True

        first = await run.submit_http(1000)
        # The crash is taken by job-1 and by no other: the rest are submitted only once job-1's
        # insert has crashed or committed. With the mechanism on, the point is never reached.
        await run.wait_for(lambda: stored_or_crashed([first]), "job-1's insert to commit or crash")
        for i in range(1, params.jobs):
            await run.submit_http(1000 + i)
        await run.wait_for(lambda: stored_or_crashed(run.submitted), "every acknowledged insert to settle")

        stored = [job_id for job_id in run.submitted if await system.queue.get(job_id) is not None]
        system.start_worker(run.worker("worker-1"))
        await run.wait_settled(stored)
        return await run.result({
            "acknowledged": len(run.submitted),
            "stored": len(stored),
            "lost_jobs": len(run.submitted) - len(stored),
            "api_crashes": sum(t.action == "crash" for t in crashed),
        })
