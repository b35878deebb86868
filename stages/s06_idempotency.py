"""Stage 6, idempotency: a job that runs twice must charge once.

Failure: the charge commits, then the worker crashes before finalizing. The lease expires, another
worker runs the job again, and without an idempotency key the charge service cannot tell the retry
from a new payment: A=2, H=2, C=2. Leases and fencing did their part (F=1); the customer still paid
twice.
Invariant: C=1 per job. Every attempt sends the job's stable key; the service creates one charge per
key (INSERT ... ON CONFLICT) and answers a repeat with the original.
Boundary: the handler still runs twice (H=2): at-least-once execution, exactly-once effect only for
effects that honour a key. An email, or a service that ignores keys, still happens twice.
"""

from __future__ import annotations

import asyncio

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, arm_crash_all, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "idempotency"
MECHANISM = "idempotency"
FAILURE = "a worker crashes after the charge committed; the retry charges again"
INVARIANT = "each job commits at most one charge (C=1), however often it runs"
OWN_KNOBS = ("crash_point",)
PREDICTION = Prediction(
    question="With idempotency off, how many committed charges (C) will each job end with?",
    options=[
        "0 — the crash rolled the charge back",
        "1 — leases and fencing already prevent duplicates",
        "2 — one per handler run",
    ],
    answer="2 — one per handler run",
    why=(
        "The charge committed in the charge service's database before the crash, and nothing in the queue can roll "
        "it back. Leases and fencing decide who may finalize a job (once each, here); they know nothing about "
        "effects already made. Without a key, worker-2's retry looks like a brand-new payment, and the charge "
        "service answers it created (201)."
    ),
)
CRASH_POINT = "after_effect_before_finalize"  # default; params.crash_point overrides


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """worker-1 charges every job and crashes before finalizing; worker-2 reclaims and finishes them."""
    point = params.crash_point or CRASH_POINT
    async with experiment(NAME, MECHANISM, on, params) as run:
        ids = await run.submit()
        faults = run.faults()
        arm_crash_all(faults, point, len(ids))
        first = await asyncio.wait_for(run.worker("worker-1", faults).run(), 20)
        run.system.start_worker(run.worker("worker-2"))
        await run.wait_settled(ids)
        result = await run.result()
        result.measurements = {
            "crashed_at": first.crashed_at,
            "duplicate_charges": sum(max(c.charges - 1, 0) for c in result.jobs),
            "handler_runs": sum(c.handler_runs for c in result.jobs),
        }
        return result
