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
# Right, and enforcing its own contract: taken(n) only for what the last free() offered, never a release
# more than was taken. The worker must honour it whatever else is switched on or off.
CONTRACT = (CLASS + "        self.limit, self.in_flight, self.offered = limit, 0, None\n\n"
            "    def free(self):\n        self.offered = self.limit - self.in_flight\n        return self.offered\n\n"
            "    def taken(self, n):\n        if self.offered is None or n > self.offered:\n"
            "            raise RuntimeError(f'took {n}, offered {self.offered}')\n"
            "        self.in_flight, self.offered = self.in_flight + n, None\n\n"
            "    def released(self):\n        if self.in_flight <= 0:\n"
            "            raise RuntimeError('released a permit never taken')\n        self.in_flight -= 1\n")
ONE_SHORT = changed("return self.limit - self.in_flight", "return self.limit - self.in_flight - 1")
# Right for the limits a stage uses (2, 4), wrong above 8.
SMALL_ONLY = changed("return self.limit - self.in_flight", "return min(self.limit, 8) - self.in_flight")
ONE_AT_A_TIME = (CLASS + "        self.limit, self.running = limit, []\n\n"
                 "    def free(self):\n        return 1 if len(self.running) < self.limit else 0\n\n"
                 "    def taken(self, n):\n        self.running.extend(range(n))\n\n"
                 "    def released(self):\n        self.running.pop()\n")


def broken(text: str) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(semaphore.direct(semaphore.load(text), seed=1)) if not c.held]


def test_the_reference_is_the_shipped_permits():
    assert permits.Permits.free.__doc__ in REFERENCE and "self.in_flight -= 1" in REFERENCE


@pytest.mark.parametrize("text", [REFERENCE, COUNTDOWN, ONE_AT_A_TIME, CONTRACT],
                         ids=["reference", "countdown", "one-at-a-time", "contract"])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant", [
    (semaphore.STARTER, "free() never lets a worker have more than `limit` jobs in flight"),
    (OFF_BY_ONE, "free() never lets a worker have more than `limit` jobs in flight"),
    (ONE_PER_CLAIM, "free() never lets a worker have more than `limit` jobs in flight"),
    (NEVER_RELEASED, "a finished job gives its permit back"),
    (RELEASE_TAKES, "a finished job gives its permit back"),
    (ONE_SHORT, "a finished job gives its permit back"),
    (SMALL_ONLY, "while a permit is free, free() says so"),
], ids=["starter", "off-by-one", "one-permit-per-claim", "never-released", "release-takes", "one-short",
        "small-limits-only"])
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


@pytest.mark.slow
@pytest.mark.parametrize("text", [ONE_AT_A_TIME, CONTRACT], ids=["one-at-a-time", "contract"])
async def test_right_answers_pass_the_scenario_and_chaos(text):
    """One job in flight per worker leaves three jobs to meet chaos's outage: its bound is on each job's
    requests, so so few jobs cannot break it by chance. The contract's own checks hold in the real worker:
    one free() per decision, taken(n) never for more than it said."""
    result = await check(semaphore.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 09's scenario (seed 1)", "chaos seed 1"]


async def test_a_permits_that_enforces_its_contract_passes_the_earlier_stages_run_again():
    """With the semaphore off (every earlier stage) the worker does not drive the permits at all, so a
    Permits that raises on misuse is never misused there."""
    from reliableq.lab.exercises import dead
    result = await check(semaphore.EXERCISE, CONTRACT, seeds=0, earlier=[(dead.EXERCISE, dead.REFERENCE)])
    assert result.outcome is Outcome.PASSED, result.text()


async def test_the_starter_fails_on_the_stages_own_failure_and_says_how_to_replay_it():
    result = await check(semaphore.EXERCISE, semaphore.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: free() never lets a worker have more than `limit` jobs in flight")
    assert "limit 1, in flight 0, free() said 1000, right 1" in result.text()
    assert "Replay it: reliableq exercise check semaphore --seed 1 --seeds 1" in result.text()


async def test_the_stage_shows_the_starters_overload_when_the_forced_schedules_pass():
    """The stage's scenario on its own: the starter's worker has all four jobs in flight."""
    check_, _ = await semaphore.scenario(semaphore.load(semaphore.STARTER), 1)
    assert not check_.held and check_.name.startswith("stage 09's burst: at most 2 jobs in flight")
    assert {"jobs in flight at the worker's peak": 4, "limit": 2} in check_.violations


async def test_one_permit_too_many_fails_on_the_in_flight_peak():
    check_, _ = await semaphore.scenario(semaphore.load(OFF_BY_ONE), 1)
    assert {"jobs in flight at the worker's peak": 3, "limit": 2} in check_.violations


async def test_permits_never_released_name_the_jobs_that_never_ran_well_within_the_deadline():
    """The worker claims its two jobs and then never again: the stage stops waiting at once (no timeout),
    and the verdict names the jobs left behind."""
    check_, run = await semaphore.scenario(semaphore.load(NEVER_RELEASED), 1)
    assert "the worker stopped claiming with no job in flight: 2 job(s) never ran" in check_.note
    assert {"job": "job-3", "status": "PENDING", "attempts": 0} in check_.violations
    assert {"job": "job-4", "status": "PENDING", "attempts": 0} in check_.violations


def test_only_the_earlier_exercises_whose_stages_run_a_changed_piece_are_run_again():
    """The permits are asked only with the semaphore on (stage 09), so no earlier stage sees them; a
    learner's passed fencing runs in every stage that finalizes a job, so the stages before it run again
    when a later check brings it; a reference is graded with every stage by the lab's own tests."""
    from reliableq.lab import exercises
    from reliableq.lab.exercises.checker import _may_have_changed

    def again(earlier_code):
        earlier = [(before, earlier_code(before)) for before in exercises.EXERCISES.values()
                   if before.stage_number < semaphore.EXERCISE.stage_number]
        return [before.name for before, _ in earlier if _may_have_changed(before, semaphore.EXERCISE, earlier)]
    assert again(lambda before: before.reference) == []
    assert again(lambda before: "mine" if before.name == "fencing" else before.reference) == [
        "commit-before-ack", "skip-locked", "leases"]
    assert again(lambda before: "mine" if before.name == "dead" else before.reference) == []


async def test_a_check_says_which_earlier_exercises_it_did_not_run_again_and_each_step_as_it_begins():
    from reliableq.lab.exercises import dead
    steps = []
    result = await check(semaphore.EXERCISE, REFERENCE, seeds=0, earlier=[(dead.EXERCISE, dead.REFERENCE)],
                         progress=steps.append)
    assert result.outcome is Outcome.PASSED, result.text()
    assert steps == ["step 1/2: forced schedules", "step 2/2: stage 09's scenario (seed 1)"]
    assert result.lines[-1] == ("  Not run again, as nothing that may have changed since they passed runs in "
                                "their stages: dead.")
