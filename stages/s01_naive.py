"""Stage 1, naive: the happy path, with every reliability mechanism off.

Failure: none is staged here. With nothing failing, the naive queue looks correct: every job is
claimed, charged and finalized once. Invariant shown: A=H=C=F=1 per job on the happy path.
Boundary: it holds only while nothing crashes, pauses, races or fails; each later stage breaks one
of those assumptions and adds the mechanism that survives it.
"""

from __future__ import annotations

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "naive"
MECHANISM = None
FAILURE = "none staged: on the happy path even the naive queue charges and finalizes each job once"
INVARIANT = "every submitted job ends SUCCEEDED with A=H=C=F=1"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "Every mechanism off, one worker, nothing failing. Then the same four jobs on the full system, every "
        "mechanism on. How do the two tables compare?"
    ),
    options=[
        "The naive queue charges at least one job twice",
        "The full system shows more attempts (A), because of its extra machinery",
        "They are identical: A = H = C = F = 1 for every job in both",
        "The naive queue loses at least one job",
    ],
    answer="They are identical: A = H = C = F = 1 for every job in both",
    why=(
        "Mechanisms only act when something goes wrong. Nothing went wrong here, so nothing tells the two queues "
        "apart: correct-looking output on the happy path is no evidence at all. To see what a mechanism is for, you "
        "have to make the thing it guards against happen."
    ),
)


def mechanisms(on: bool) -> Mechanisms:
    """Everything off, whichever way `on` points: there is nothing to turn on yet."""
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Submit `params.jobs` jobs through the API, run one worker until all are final."""
    async with experiment(NAME, MECHANISM, on, params) as run:
        ids = [await run.submit_http(1000 + i) for i in range(params.jobs)]
        worker = run.worker("worker-1")
        run.system.start_worker(worker)
        # Waits per id, not on "nothing pending": without commit-before-ack an acknowledged job
        # may not be stored yet, and an empty queue would look finished.
        await run.wait_settled(ids)
        return await run.result({"submitted": len(ids), "succeeded": worker.stats.succeeded})
