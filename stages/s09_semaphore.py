"""Stage 9, semaphore: a worker must not start more work than its dependencies can take.

Failure: the worker claims and starts everything that is due. The charge service can take
CHARGE_CAPACITY requests at once (each takes CHARGE_LATENCY_SECONDS); the rest are refused with
503 overloaded, so jobs burn attempts on refusals, and a bigger backlog makes it worse.
Invariant: at most `concurrency` jobs in flight per worker: it claims only as many jobs as it has
free permits, so with concurrency <= capacity nothing is refused.
Boundary: a permit bounds one worker. N workers still send N * concurrency requests; a shared bound
needs coordination: `--fleet-limit` counts live leases in PostgreSQL for the whole fleet, but neither
bound knows the dependency's real capacity, which can shrink while the limits stay put.
"""

from __future__ import annotations

from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.harness import SETTLED_STATUSES
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "semaphore"
MECHANISM = "semaphore"
FAILURE = "a worker that starts everything due overloads a charge service of limited capacity"
INVARIANT = "a worker has at most `concurrency` jobs in flight; with concurrency <= capacity none is refused"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "With the semaphore off, four jobs due and a service that takes two at a time, what happens to the "
        "requests?"
    ),
    options=[
        "none is refused — the service queues them",
        "some are refused — all four start at once and the extras are turned away",
        "all four are refused",
    ],
    answer="some are refused — all four start at once and the extras are turned away",
    why=(
        "The worker claims all four and sends four requests together. The service serves two and refuses the rest "
        "with 503; those jobs retry, and may be refused again while others are in flight."
    ),
)
CHARGE_CAPACITY = 2  # requests the charge service handles at once (K); the default concurrency matches
CHARGE_LATENCY_SECONDS = 0.2  # how long each charge takes, so requests overlap
BUDGET = 10  # attempts per job: refusals are retried; the budget is not this stage's subject


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """params.jobs due at once, one worker with params.concurrency permits, a service of capacity K; until
    every job settled, or the worker stalled (permits that are never released: exercise 09's mistake)."""
    faults = ChargeFaults(capacity=CHARGE_CAPACITY, latency_seconds=CHARGE_LATENCY_SECONDS, seed=params.seed)
    async with experiment(NAME, MECHANISM, on, params, charge_faults=faults) as run:
        ids = await run.submit(max_attempts=BUDGET)
        worker = run.worker("worker-1")
        run.system.start_worker(worker)

        async def settled_or_stalled() -> bool:
            # A worker with no permit free and nothing in flight never claims again: its jobs never run.
            jobs = [await run.system.queue.get(job_id) for job_id in ids]
            return worker.stalled or all(job.status in SETTLED_STATUSES for job in jobs)
        await run.wait_for(settled_or_stalled, f"{len(ids)} job(s) to be SUCCEEDED or DEAD")
        service = await run.system.charge_stats()
        result = await run.result()
        result.measurements = {
            "capacity": CHARGE_CAPACITY,
            "concurrency": params.concurrency,
            "in_flight_peak": worker.stats.in_flight_peak,
            "service_in_flight_peak": service["in_flight_peak"],
            "refused": sum(e.kind == "charge" and e.detail.startswith("overloaded") for e in result.events),
        }
        return result
