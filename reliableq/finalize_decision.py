"""What the worker does with a job once its handler has answered: succeed, retry, or give up (DEAD).

The decision reads only the handler's classified outcome (reliableq/handlers.py) and the job's attempt
count and budget; the worker carries it out with a fenced update. With the DEAD state switched off the
worker retries where this says dead. What this does not do: classify failures (the handler does, and
a transient failure misclassified as permanent kills a good job here).
"""

from __future__ import annotations

from typing import Literal, Protocol

Decision = Literal["succeed", "retry", "dead"]
DECISIONS: tuple[Decision, ...] = ("succeed", "retry", "dead")


class FinalizeDecision(Protocol):
    def __call__(self, outcome_kind: str, attempts: int, max_attempts: int) -> Decision: ...


def decide(outcome_kind: str, attempts: int, max_attempts: int) -> Decision:
    """'succeed', 'retry' or 'dead' for a job whose attempt number `attempts` (1 for the first) ended
    with `outcome_kind` (ok, transient, permanent or ambiguous); `max_attempts` is its budget."""
    if outcome_kind == "ok":
        return "succeed"
    if outcome_kind == "permanent":  # the same request gets the same answer: retrying cannot help
        return "dead"
    if attempts >= max_attempts:  # that was its last attempt
        return "dead"
    return "retry"  # transient or ambiguous, budget left: a later try may succeed (with the same key)
