"""What an exercise is: the learner's file (its starter and the reference), how it plugs into the real
system, hints and the why, and the checks only this exercise makes. The checker (checker.py) runs
every exercise the same way; an exercise only says what differs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from reliableq.config import Mechanisms
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioResult


@dataclass(frozen=True)
class Exercise:
    name: str  # the CLI's name for it, and the stage it belongs to
    stage_number: int
    filename: str  # the learner's file in the workspace
    summary: str  # one line: what the learner writes
    starter: str  # the mechanism-off code the stage already shows failing
    reference: str
    why: str  # why the reference works, shown with the solution
    hints: tuple[str, ...]  # from gentle to nearly the answer
    # The learner's text -> the pieces it replaces; raises LearnerError for code that cannot be used
    # (it may try the code once, so that an exception is said here rather than met inside a worker).
    load: Callable[[str], Pieces]
    # The stage's failure scenario run with the pieces (its seed given): one check of its invariant, and
    # the run itself (for its table and timeline).
    scenario: Callable[[Pieces, int], Awaitable[tuple[Check, ScenarioResult]]]
    # The forced schedules, run first: the learner's code under the interleavings, clocks and inputs that
    # break each class of mistake (SQL forced one step at a time, as PostgreSQL's isolation tester does; a
    # policy over its whole range), each Check naming the mistake it shows.
    direct: Callable[[Pieces, int], Awaitable[list[Check]]] | None = None
    # An exercise whose file holds an earlier one's answer: (that exercise's name, its file, the starter made
    # from the learner's file once it passed, or None if it cannot be). The learner then goes on from their
    # own code, not the reference's.
    builds_on: tuple[str, str, Callable[[str], str | None]] | None = None


# The exercises whose piece runs whatever the stage's switches say: the four owner updates run wherever a
# job is finalized, and the charge service's insert wherever a job charges.
ALWAYS_IN_PLAY = ("fencing", "idempotency")
# The claim the skip-locked and leases exercises write is the claim only with skip_locked on and fairness
# off (without skip_locked, the claim is job_select_due then job_mark_claimed; with fairness, the fair claim).
CLAIM_EXERCISES = ("skip-locked", "leases")


def in_play(exercise: Exercise, mechanisms: Mechanisms) -> bool:
    """Whether a run with `mechanisms` on runs `exercise`'s piece at all. A policy (the submission order,
    the retry delay, the decision, the permits) is asked only with its own mechanism on."""
    if exercise.name in ALWAYS_IN_PLAY:
        return True
    if exercise.name in CLAIM_EXERCISES:
        return mechanisms.skip_locked and not mechanisms.fairness
    return getattr(mechanisms, exercise.name.replace("-", "_"))
