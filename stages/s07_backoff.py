"""Stage 7, backoff: retries must slow down while a dependency is failing.

Failure: the charge service has an outage (every request answered 503). Without backoff a failed job
is due again at once, so the worker retries as fast as HTTP and PostgreSQL allow (about 80 requests
a second for 4 jobs on a 2-core laptop, growing with the backlog) at a service that is already down:
work that helps nobody and can keep it down.
Invariant: retry pressure stays bounded; the n-th retry waits Uniform(0, min(max, base * 2^(n-1)))
seconds, measured from PostgreSQL's now(), so jobs that failed together spread out instead of
returning in lockstep.
Boundary: backoff spaces retries, it does not stop them: a job that can never succeed is retried
forever (stage dead). And it costs latency: after recovery a job may still sleep out its delay.
"""

from __future__ import annotations

import time
from datetime import timedelta

from reliableq.backoff import Backoff
from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "backoff"
MECHANISM = "backoff"
FAILURE = "during a charge-service outage, immediate retries hammer it"
INVARIANT = "retries during an outage are spread by capped, jittered exponential delays"
OWN_KNOBS = ("failure_rate",)
PREDICTION = Prediction(
    question=(
        "During the 1.5-second outage, with backoff off, roughly how many charge requests will the four jobs "
        "send?"
    ),
    options=[
        "4 — one each, then they wait",
        "about 10",
        "more than 50",
    ],
    answer="more than 50",
    why=(
        "Nothing makes a failed job wait: it is due again the instant it fails, so each job loops claim → request → "
        "503 → retry as fast as the machine allows. The bar chart below shows the rate."
    ),
)
OUTAGE_SECONDS = 1.5  # how long the charge service fails, from the moment the worker starts
BACKOFF_BASE_SECONDS = 0.05  # first retry delay cap
BACKOFF_MAX_SECONDS = 1.0  # cap on any retry delay
SCHEDULE_ATTEMPTS = 8  # how many retry delays per job the measurements list


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """An outage of OUTAGE_SECONDS (503 with probability params.failure_rate), then recovery."""
    faults = ChargeFaults(transient_rate=params.failure_rate, seed=params.seed)
    async with experiment(NAME, MECHANISM, on, params, charge_faults=faults) as run:
        ids = await run.submit()
        worker = run.worker("worker-1", backoff_base_seconds=BACKOFF_BASE_SECONDS,
                            backoff_max_seconds=BACKOFF_MAX_SECONDS)
        outage_began = run.seconds()
        began = time.monotonic()
        run.system.start_worker(worker)

        async def outage_over() -> bool:  # the outage is a length of time; nothing else marks its end
            return time.monotonic() - began >= OUTAGE_SECONDS
        await run.wait_for(outage_over, "the outage to run its course", OUTAGE_SECONDS + 10)
        faults.transient_rate = 0.0  # the service recovers; the app reads this object on every request
        outage_ended = run.seconds()
        recovered = time.monotonic()
        await run.wait_settled(ids)
        recovery_seconds = time.monotonic() - recovered

        result = await run.result()
        during = [e for e in result.events
                  if e.kind == "charge" and outage_began <= e.seconds <= outage_ended]
        outage_end = run.started + timedelta(seconds=outage_ended)
        schedule, drawn, outage_waits = {}, {}, {}
        for label, job_id in zip(result.labels().values(), ids, strict=False):
            attempts = await run.system.queue.attempts_of(job_id)
            retried = [(a, b) for a, b in zip(attempts, attempts[1:], strict=False) if a["outcome"] == "retried"]
            schedule[label] = [round((b["claimed_at"] - a["finished_at"]).total_seconds(), 3)
                               for a, b in retried][:SCHEDULE_ATTEMPTS]
            drawn[label] = [round(a["retry_delay_seconds"], 3) for a, _ in retried][:SCHEDULE_ATTEMPTS]
            outage_waits[label] = round(sum(
                min(a["retry_delay_seconds"], (outage_end - a["finished_at"]).total_seconds())
                for a, _ in retried if a["finished_at"] <= outage_end), 3)
        ceiling = Backoff(BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS).ceiling
        result.measurements = {
            "outage_seconds": round(outage_ended - outage_began, 3),
            "outage_requests": len(during),
            "attempts_per_second": round(len(during) / max(outage_ended - outage_began, 1e-9), 1),
            "recovery_seconds": round(recovery_seconds, 3),
            "retry_ceilings": [ceiling(n) if run.mechanisms.backoff else 0.0
                               for n in range(1, SCHEDULE_ATTEMPTS + 1)],
            "retry_schedule": schedule,  # observed seconds from each failed attempt to the next claim
            "retry_delays": drawn,  # the delays the worker chose, as each retry recorded them
            # Seconds of the outage each job spent waiting on purpose (its retries' delays, up to the outage's
            # end): 0 means every retry was due at once, so the request rate is whatever the machine manages.
            "outage_wait_seconds": outage_waits,
        }
        return result
