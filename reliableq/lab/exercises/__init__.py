"""Exercise mode: the learner writes a mechanism, and the lab's own checker grades it in the real system.

Layout
    exercise      what an exercise is: the learner's file, its starter and reference, hints, checks
    learner_code  loading the learner's Python or SQL, with errors at the learner's line
    checker       the one checker (forced schedules, the stage's scenario, earlier exercises, seeded chaos)
    schedules     forcing interleavings in PostgreSQL: barriers, held transactions, blocked writes
    virtual_clock an event loop whose clock the check controls (commit-before-ack's held store)
    properties    whole-range checks of a pure policy: exhaustive, hypothesis, goodness of fit
    mutant, mutants, mutants_sql, mutants_python  the grader's own test: mutants of each reference, graded
    mutants_equivalent, mutants_differential  the mutants reviewed as equivalent, and the run confirming each
    workspace     the learner's files, backups and progress, outside any notebook
    commit_before_ack  exercise 02: the order of storing a submission and acknowledging it (Python)
    skip_locked   exercise 03: the claim's lock (SQL)
    leases        exercise 04: the claim's lease, its expiry and the reclaim of an expired one (SQL)
    fencing       exercise 05: the lease-token condition of the four owner updates (SQL)
    idempotency   exercise 06: the charge service's insert, one charge per idempotency key (SQL)
    backoff       exercise 07: the retry delay (Python)
    dead          exercise 08: the finalize decision, succeed, retry or dead (Python)
    semaphore     exercise 09: the worker's permits, taken at claim and released when a job is done (Python)
    sync_standby  exercise 10: what the API's sessions commit with, so a 202 survives the primary's death (SQL)
    fairness      exercise 11: the fair claim, due jobs tenant by tenant in turn (SQL)

The learner's piece reaches the real worker, API and queue through reliableq/lab/pieces.py, never through
a copy of the core.
"""

from __future__ import annotations

from reliableq.lab.exercises import (
    backoff,
    commit_before_ack,
    dead,
    fairness,
    fencing,
    idempotency,
    leases,
    semaphore,
    skip_locked,
    sync_standby,
)
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.workspace import Workspace

# In stage order, as `reliableq exercise list` shows them.
EXERCISES: dict[str, Exercise] = {exercise.name: exercise for exercise in sorted(
    (module.EXERCISE for module in (commit_before_ack, skip_locked, leases, fencing, idempotency, backoff, dead,
                                    semaphore, sync_standby, fairness)),
    key=lambda exercise: exercise.stage_number)}


def get(name: str) -> Exercise:
    try:
        return EXERCISES[name]
    except KeyError:
        raise ValueError(f"no exercise named {name!r}; there are: {', '.join(EXERCISES)}") from None


def earlier_code(exercise: Exercise, workspace: Workspace) -> list[tuple[Exercise, str]]:
    """The exercises of earlier stages, each with the code a check of `exercise` runs beside its own: the
    learner's solution once it passed, otherwise the reference (an unfinished exercise must not fail a
    later one)."""
    return [(before, workspace.read(before) if workspace.state(before) == "passed" else before.reference)
            for before in sorted(EXERCISES.values(), key=lambda e: e.stage_number)
            if before.stage_number < exercise.stage_number]
