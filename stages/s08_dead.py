"""Stage 8, dead: a job that cannot succeed must stop, be kept, and be replayable.

Failure: the charge service rejects the card (a permanent 422). Without a DEAD state the worker
treats it like any failure and retries it forever, far past its attempt budget: load that never
pays off, and a job no operator is told about.
Invariant: a job ends DEAD at a permanent failure or when its attempt budget is spent, with a one-line
sanitised last_error; an operator can inspect it and replay it (same id, same idempotency key,
a fresh budget) once the cause is fixed, and the replay still charges at most once.
Boundary: DEAD is a decision, not a fix. Misclassify a transient error as permanent and good jobs die;
the replay is manual.
"""

from __future__ import annotations

from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.harness import SETTLED_STATUSES
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "dead"
MECHANISM = "dead"
FAILURE = "a permanent failure is retried forever, past the attempt budget"
INVARIANT = "a job ends DEAD at a permanent failure or after max_attempts, and replays to one charge"
OWN_KNOBS = ("failure_rate",)
PREDICTION = Prediction(
    question="With the DEAD state on, how many attempts will each job have made when it goes DEAD? (Its budget is 3.)",
    options=[
        "1",
        "3",
        "6",
    ],
    answer="1",
    why=(
        "A 422 is a permanent failure: the same request gets the same answer, so the worker does not spend the "
        "budget on it. The budget is for transient failures, which might succeed on a later try."
    ),
)
BUDGET = 3  # max_attempts of every job in this stage
OBSERVE_ATTEMPTS = 2 * BUDGET  # without dead: how many attempts we watch a job make before stopping


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Cards rejected (422 with probability params.failure_rate); off: watch the retries climb;
    on: inspect the DEAD jobs over the API, fix the cause, replay them over the API. Either way, watch
    until each job has settled or made OBSERVE_ATTEMPTS attempts."""
    faults = ChargeFaults(permanent_rate=params.failure_rate, seed=params.seed)
    async with experiment(NAME, MECHANISM, on, params, charge_faults=faults) as run:
        system = run.system
        ids = await run.submit(max_attempts=BUDGET)
        system.start_worker(run.worker("worker-1"))
        api = f"{system.api_url}/v1/jobs"

        async def settled_or_past_budget() -> bool:
            jobs = [await system.queue.get(job_id) for job_id in ids]
            return all(j.status in SETTLED_STATUSES or j.attempts >= OBSERVE_ATTEMPTS for j in jobs)
        await run.wait_for(settled_or_past_budget, f"every job to settle or make {OBSERVE_ATTEMPTS} attempts")
        statuses = [(await system.queue.get(job_id)).status for job_id in ids]
        if not run.mechanisms.dead or any(status not in SETTLED_STATUSES for status in statuses):
            # Off (or on, with a decision that never gives up: exercise 08's starter): jobs still retrying.
            result = await run.result()
            result.measurements = {
                "budget": BUDGET,
                "dead_jobs": statuses.count("DEAD"),
                "attempts_past_budget": sum(max(c.attempts - BUDGET, 0) for c in result.jobs),
            }
            return result

        dead = [job_id for job_id, status in zip(ids, statuses, strict=True) if status == "DEAD"]
        inspected = [(await system.http.get(f"{api}/{job_id}")).json() for job_id in dead]
        faults.permanent_rate = 0.0  # the operator fixed the cause (a new card on file)
        replayed = [(await system.http.post(f"{api}/{job_id}/replay")).json() for job_id in dead]
        await run.wait_settled(ids)
        result = await run.result()
        labels = result.labels()
        result.measurements = {
            "budget": BUDGET,
            "dead_jobs": len(dead),
            "attempts_when_dead": {labels[job["id"]]: job["attempts"] for job in inspected},
            "last_error": inspected[0]["last_error"] if inspected else None,
            "replayed": len(replayed),
            "replay_kept_id_and_key": all(
                (r["id"], r["idempotency_key"]) == (i["id"], i["idempotency_key"])
                for r, i in zip(replayed, inspected, strict=True)),
        }
        return result
