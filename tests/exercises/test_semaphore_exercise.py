"""Exercise 09 (semaphore) graded by the real checker: the reference (the shipped Permits) and right
answers spelt differently pass, the starter fails on the stage's overloaded charge service, and the wrong
answers a learner would plausibly write fail on the invariant each breaks; permits never released end
with the jobs that never ran named, not a timeout. The direct checks need no database; whole checks run
the real system (stage 09 on real PostgreSQL and HTTP, then seeded chaos)."""

from __future__ import annotations

import asyncio

import pytest

from reliableq import permits
from reliableq.lab.exercises import semaphore
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

REFERENCE = semaphore.REFERENCE


def changed(old: str, new: str) -> str:
    assert old in REFERENCE
    return REFERENCE.replace(old, new)


NEVER_RELEASED = changed("        self.in_flight -= 1", "        pass")
OFF_BY_ONE = changed("return self.limit - self.in_flight", "return self.limit - self.in_flight + 1")
ONE_PER_CLAIM = changed("self.in_flight += n", "self.in_flight += 1")  # a claim of 2 jobs takes 1 permit
RELEASE_TAKES = changed("        self.in_flight -= 1", "        self.in_flight += 1")  # free() goes negative
CLASS = "class Permits:\n    def __init__(self, limit):\n"
# Right, and spelt differently from the reference.
COUNTDOWN = (CLASS + "        self.available = limit\n\n    def free(self):\n        return self.available\n\n"
             "    def taken(self, n):\n        self.available -= n\n\n"
             "    def released(self):\n        self.available += 1\n")
ONE_AT_A_TIME = (CLASS + "        self.limit, self.running = limit, []\n\n"
                 "    def free(self):\n        return 1 if len(self.running) < self.limit else 0\n\n"
                 "    def taken(self, n):\n        self.running.extend(range(n))\n\n"
                 "    def released(self):\n        self.running.pop()\n")


def broken(text: str) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(semaphore.direct(semaphore.load(text), seed=1)) if not c.held]


def test_the_reference_is_the_shipped_permits():
    assert permits.Permits.free.__doc__ in REFERENCE and "self.in_flight -= 1" in REFERENCE


@pytest.mark.parametrize("text", [REFERENCE, COUNTDOWN, ONE_AT_A_TIME])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant", [
    (semaphore.STARTER, "free() never lets a worker have more than `limit` jobs in flight"),
    (OFF_BY_ONE, "free() never lets a worker have more than `limit` jobs in flight"),
    (ONE_PER_CLAIM, "free() never lets a worker have more than `limit` jobs in flight"),
    (NEVER_RELEASED, "a finished job gives its permit back"),
    (RELEASE_TAKES, "a finished job gives its permit back"),
], ids=["starter", "off-by-one", "one-permit-per-claim", "never-released", "release-takes"])
def test_wrong_answers_break_the_invariant_they_miss(text, invariant):
    assert broken(text)[0].startswith(invariant), broken(text)


@pytest.mark.parametrize("text, said", [
    (CLASS + "        self.limit = limit\n    def free(self)\n        return 1\n",
     "semaphore.py, line 4: expected ':'"),
    (CLASS + "        self.limit = limit\n    def free(self):\n        return self.used\n"
             "    def taken(self, n): pass\n    def released(self): pass\n",
     "semaphore.py, line 5: AttributeError: 'Permits' object has no attribute 'used'"),
    (CLASS + "        pass\n    def free(self):\n        return 0.5\n    def taken(self, n): pass\n"
             "    def released(self): pass\n", "free() must return a whole number of jobs; it returned 0.5"),
    (CLASS + "        pass\n    def free(self):\n        return 1\n    def taken(self, n): pass\n",
     "Permits needs a method named released"),
    (CLASS + "        pass\n    def free(self):\n        while True: pass\n    def taken(self, n): pass\n"
             "    def released(self): pass\n", "line 5: still running after 1 s (a loop that never ends?)"),
    ("def Semaphore(limit):\n    return limit\n", "semaphore.py: define a class named Permits"),
], ids=["syntax", "exception", "not-a-whole-number", "missing-method", "endless-loop", "no-class"])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        semaphore.load(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


@pytest.mark.parametrize("text", [REFERENCE, ONE_AT_A_TIME], ids=["reference", "one-at-a-time"])
async def test_right_answers_pass_the_scenario_and_chaos(text):
    """One job in flight per worker leaves three jobs to meet chaos's outage: its bound is on each job's
    requests, so so few jobs cannot break it by chance."""
    result = await check(semaphore.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["stage 09's scenario (seed 1)", "direct checks", "chaos seed 1"]


async def test_the_starter_fails_on_the_stages_own_failure_and_says_how_to_replay_it():
    result = await check(semaphore.EXERCISE, semaphore.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 09's burst: at most 2 jobs in flight")
    assert "jobs in flight at the worker's peak 4, limit 2" in result.text()
    assert "Replay it: reliableq exercise check semaphore --seed 1 --seeds 1" in result.text()


async def test_one_permit_too_many_fails_on_the_in_flight_peak():
    result = await check(semaphore.EXERCISE, OFF_BY_ONE, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert "jobs in flight at the worker's peak 3, limit 2" in result.text()


async def test_permits_never_released_name_the_jobs_that_never_ran_well_within_the_deadline():
    """The worker claims its two jobs and then never again: the stage stops waiting at once (no timeout),
    and the verdict names the jobs left behind."""
    result = await check(semaphore.EXERCISE, NEVER_RELEASED, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.seconds < 15, result.text()
    assert "the worker stopped claiming with no job in flight: 2 job(s) never ran" in result.lines[0]
    assert "  job job-3, status PENDING, attempts 0" in result.lines
    assert "  job job-4, status PENDING, attempts 0" in result.lines


async def test_a_check_of_semaphore_runs_the_dead_exercise_again_with_both_pieces_in_place():
    """The learner's decision and permits reach the same workers: with dead's starter beside the reference
    permits, dead's own scenario (run again) names the regression."""
    from reliableq.lab.exercises import dead
    result = await check(semaphore.EXERCISE, REFERENCE, seeds=1, earlier=[(dead.EXERCISE, dead.STARTER)])
    assert result.outcome is Outcome.FAILED
    assert result.lines[0] == "✗ Regressed: exercise dead (stage 08) no longer holds with your new code."
    assert result.checked == ["stage 09's scenario (seed 1)", "direct checks"]
