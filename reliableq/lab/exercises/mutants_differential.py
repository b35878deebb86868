"""The differential run that confirms a mutant listed as equivalent (mutants_equivalent.py): mutant and
reference run side by side, and must agree everywhere. A pure piece's whole input domain as the system
calls it (the decision, the retry delay, the permits, the submission order against every kind of store);
for SQL, the exercise's forced schedules, every check saying the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import product

from reliableq.config import WorkerSettings
from reliableq.lab.exercises import commit_before_ack, dead
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError

# The exercises whose file is SQL: their mutants are mutants_sql.py's, their differential the forced schedules.
SQL_EXERCISES = ("skip-locked", "leases", "fencing", "idempotency", "sync-standby", "fairness")
# A mutant's check runs with this seed (mutants.py), and the differential's forced schedules with the same:
# what the check saw is what the mutant is compared on.
CHECK_SEED = 1


async def _differential_python(exercise: Exercise, reference: str, mutant: str) -> str | None:
    """The first input on which the mutant's answer differs from the reference's, over the piece's whole
    input domain as the system calls it; None if there is none."""
    def answers(text: str) -> list:
        pieces = exercise.load(text)
        if exercise.name == "dead":
            return [_outcome(pieces.decision, kind, attempts, budget) for kind in dead.KINDS
                    for budget in range(1, 101) for attempts in range(1, budget + 2)]  # the API's budgets
        if exercise.name == "backoff":
            return [_outcome(pieces.retry_delays(WorkerSettings(backoff_base_seconds=base, backoff_max_seconds=cap,
                                                                 backoff_seed=0)).delay, attempt, "job")
                    for base, cap in product((0.001, 0.05, 0.5, 1.0, 30.0), (0.01, 1.0, 60.0, 3600.0))
                    for attempt in (*range(1, 201), 1_000, 10_000, 10**6)]
        if exercise.name == "semaphore":
            return [_permits_life(pieces.permits, limit, steps) for limit in range(1, 5)
                    for steps in product(("free", "taken 1", "taken 2", "released"), repeat=5)]
        raise ValueError(f"no input domain for {exercise.name}")

    if exercise.name == "commit-before-ack":
        return await _differential_accept(reference, mutant)
    for n, (right, yours) in enumerate(zip(answers(reference), answers(mutant), strict=True)):
        if right != yours:
            return f"input #{n}: the reference {right}, the mutant {yours}"
    return None


def _outcome(function: Callable, *args: object) -> object:
    try:
        return function(*args)
    except (LearnerError, ArithmeticError) as error:
        return f"raised {type(error).__name__}"


def _permits_life(make: Callable, limit: int, steps: tuple[str, ...]) -> list[object]:
    """What free() says after each step of a worker's life (claims of 1 or 2, releases) on fresh permits."""
    permits, said = _outcome(make, limit), []
    for step in steps:
        if step == "free":
            said.append(_outcome(permits.free))
        elif step == "released":
            _outcome(permits.released)
        else:
            _outcome(permits.taken, int(step.split()[1]))
    return said


async def _differential_accept(reference: str, mutant: str) -> str | None:
    """accept's whole domain: a store that commits at once, one held, one that fails; what it did in each."""
    for store in commit_before_ack.STORES:
        right, yours = [await commit_before_ack.trial(commit_before_ack.load(text).submission_order, store)
                        for text in (reference, mutant)]
        if replace(right, waiting_at=None) != replace(yours, waiting_at=None):  # its lines may be numbered apart
            return f"{store} store: the reference {right}, the mutant {yours}"
    return None


async def _differential_sql(exercise: Exercise, reference: str, mutant: str) -> str | None:
    """The exercise's forced schedules run on both: every check must say the same."""
    said = [[(one.name, one.held, one.violations) for one in await exercise.direct(exercise.load(text), CHECK_SEED)]
            for text in (reference, mutant)]
    for right, yours in zip(*said, strict=True):
        if right != yours:
            return f"{right[0]}: the reference {right[1:]}, the mutant {yours[1:]}"
    return None


async def differential(exercise: Exercise, reference: str, mutant: str) -> str | None:
    if exercise.name in SQL_EXERCISES:
        return await _differential_sql(exercise, reference, mutant)
    return await _differential_python(exercise, reference, mutant)
