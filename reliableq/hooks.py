"""The core's fault hook: named points the worker, the queue and the API pass through, and a no-op.

At each point the core calls `await hook.reach(point, subject, worker_id)`. In production the hook is
a `FaultHook`, which does nothing. The lab's harness installs its own (`reliableq.lab.faults.FaultPlan`)
to crash, pause or lose an answer there; the switches live in the lab, never in this package. What the
core knows of a fault is only what a hook may do at a point: return (at once, or after a pause), raise
an error the caller would meet anyway (a `psycopg.Error` for a lost COMMIT answer), or raise
`SimulatedCrash`, after which the caller must stop as a killed process would.
"""

from __future__ import annotations

from typing import Any

# Every point, with where it is reached. Worker points come in the order a job passes them.
POINTS = {
    "after_claim_before_effect": "worker: a job claimed, its effect not started",
    "during_effect": "worker: inside the job's effect (a slow dependency)",
    "after_effect_before_finalize": "worker: the effect done, its finalize not sent",
    "before_group_commit": "worker: a group of successes about to be committed",
    "during_finalize": "queue: a finalize's update sent, its transaction not committed",
    "after_finalize_commit": "queue: a finalize committed, its answer not yet heard",
    "during_renewal": "queue: a lease renewal's update sent, its transaction not committed",
    "before_claim_update": "queue: a naive claimer between its read and its update (skip_locked off)",
    "after_ack_before_commit": "api: a 202 sent, the insert not committed (an order that stores after it)",
    "after_commit_before_ack": "api: a submission committed, its 202 not sent (a client that never hears)",
}


class SimulatedCrash(BaseException):
    """Raised by a hook at a point: the caller must stop as a killed process would (no finalize, no
    lease release, its open transaction rolled back). A BaseException so that no `except Exception`
    on the way up can swallow it; the core defines it so that the worker and the API can recognise a
    crash without knowing who staged it."""

    def __init__(self, point: str, job_id: Any = None) -> None:
        super().__init__(f"simulated crash at {point}")
        self.point = point
        self.job_id = job_id


class FaultHook:
    """The hook the core calls at every point; this one does nothing (production)."""

    # Whether this hook may stop its caller at a point inside a finalize's or a renewal's transaction
    # (during_finalize, during_renewal). Only then does the queue open a transaction around that one
    # fenced statement, so that a crash there rolls it back; a lone statement commits by itself, two
    # round trips (BEGIN, COMMIT) fewer per finalize.
    stops_inside_transactions = False

    async def reach(self, point: str, subject: Any = None, worker_id: str = "") -> None:
        """`subject`: the job (or the claimer's ids, or the API's acknowledged id or ids)."""
