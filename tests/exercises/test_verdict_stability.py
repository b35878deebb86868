"""Same file, same verdict: every reference and every right answer the exercise tests write is checked
ten times in a row with two CPU-burning processes beside it, and must pass every time (the checker's own
deadlines and forced schedules, not the machine's speed, decide a verdict). A reference gets the whole
check a learner gets (the default chaos seeds); a right answer spelt differently gets its forced
schedules, its stage's scenario and one chaos seed, which is where a spelling can make a difference.

Long (about an hour on 2 cores), so deselected from the default run: `python -m pytest -n 0 -m stability
tests/exercises/test_verdict_stability.py` (`-k semaphore` for one exercise's answers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reliableq.lab import exercises
from reliableq.lab.exercises.checker import DEFAULT_SEEDS, Outcome, check
from tests.exercises import (
    test_backoff_exercise,
    test_commit_before_ack_exercise,
    test_dead_exercise,
    test_fairness_exercise,
    test_fencing_exercise,
    test_idempotency_exercise,
    test_leases_exercise,
    test_semaphore_exercise,
    test_skip_locked_exercise,
    test_sync_standby_exercise,
)

pytestmark = [pytest.mark.stability, pytest.mark.timeout(3600)]

RUNS = 10
RIGHT_SPELLINGS = {
    "commit-before-ack": test_commit_before_ack_exercise.RIGHT,
    "skip-locked": {"no-key-in-subquery": test_skip_locked_exercise.NO_KEY_IN_SUBQUERY},
    "leases": {"plain-now": test_leases_exercise.PLAIN_NOW, "clock-timestamp": test_leases_exercise.CLOCK_TIMESTAMP},
    "fencing": {"token-only": test_fencing_exercise.TOKEN_ONLY, "not-distinct": test_fencing_exercise.NOT_DISTINCT,
                "no-key-lock-and-join": test_fencing_exercise.NO_KEY_LOCK_AND_JOIN},
    "idempotency": test_idempotency_exercise.RIGHT,
    "backoff": {name: getattr(test_backoff_exercise, name) for name in
                ("SCALED", "SWAPPED", "LDEXP", "FLOAT_POWER", "DOUBLING_UP_TO_THE_CAP")},
    "dead": {name: getattr(test_dead_exercise, name) for name in ("BY_BUDGET_FIRST", "TABLE", "MATCH")},
    "semaphore": {name: getattr(test_semaphore_exercise, name) for name in
                  ("COUNTDOWN", "ONE_AT_A_TIME", "CONTRACT")},
    "sync-standby": test_sync_standby_exercise.RIGHT,
    "fairness": {"mod": test_fairness_exercise.WITH_MOD, "jump-by-claim-size": test_fairness_exercise.JUMP_BY_CLAIM,
                 "no-key-lock": test_fairness_exercise.NO_KEY_LOCK,
                 "one-each-then-oldest": test_fairness_exercise.ONE_EACH_THEN_OLDEST},
}
ANSWERS = [(name, "reference", exercises.get(name).reference, DEFAULT_SEEDS) for name in exercises.EXERCISES] + [
    (name, label, text, 1) for name, spellings in RIGHT_SPELLINGS.items() for label, text in spellings.items()]


@pytest.fixture(scope="module")
def two_cpu_burners():
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for burner in burners:
        burner.kill()
        burner.wait()


@pytest.mark.parametrize("name, label, text, seeds", ANSWERS, ids=[f"{a[0]}-{a[1]}" for a in ANSWERS])
async def test_a_right_answer_passes_ten_times_in_a_row_under_load(name, label, text, seeds, two_cpu_burners):
    exercise = exercises.get(name)
    earlier = [(before, before.reference) for before in exercises.EXERCISES.values()
               if before.stage_number < exercise.stage_number]
    verdicts = []
    for _ in range(RUNS):
        result = await check(exercise, text, seed=1, seeds=seeds, earlier=earlier)
        verdicts.append((result.outcome, result.text() if result.outcome is not Outcome.PASSED else ""))
    assert verdicts == [(Outcome.PASSED, "")] * RUNS
