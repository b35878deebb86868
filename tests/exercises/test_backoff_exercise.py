"""Exercise 07 (backoff) graded by the real checker: the reference and other right answers pass, the
starter fails on the stage's own failure, and the wrong answers a learner would plausibly write fail on
the invariant each breaks. The direct checks of a policy need no database; whole checks run the real
system (stage 07's outage on real PostgreSQL and HTTP, then seeded chaos)."""

from __future__ import annotations

import asyncio

import pytest

from reliableq.lab.exercises import backoff
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

SIGNATURE = "import random\n\ndef retry_delay(attempt, base, cap, rng):\n"
NO_JITTER = SIGNATURE + "    return min(cap, base * 2 ** (attempt - 1))\n"
UNCAPPED = SIGNATURE + "    return rng.uniform(0, base * 2 ** (attempt - 1))\n"
EQUAL_JITTER = (SIGNATURE + "    ceiling = min(cap, base * 2 ** (attempt - 1))\n"
                "    return ceiling / 2 + rng.uniform(0, ceiling / 2)\n")
NOT_EXPONENTIAL = SIGNATURE + "    return rng.uniform(0, base)\n"
OWN_RANDOMNESS = ("import random as r\n\ndef retry_delay(attempt, base, cap, rng):\n"
                  "    return r.uniform(0, min(cap, base * 2 ** (attempt - 1)))\n")
# Right, and spelt differently from the reference.
SCALED = SIGNATURE + "    return rng.random() * min(cap, base * 2 ** (attempt - 1))\n"
DOUBLING = (SIGNATURE + "    ceiling = base\n    for _ in range(attempt - 1):\n"
            "        ceiling = min(cap, ceiling * 2)\n    return rng.uniform(0.0, ceiling)\n")


def broken(text: str) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(backoff.direct(backoff.load(text), seed=1)) if not c.held]


@pytest.mark.parametrize("text", [backoff.REFERENCE, SCALED, DOUBLING])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant", [
    (NO_JITTER, "full jitter"), (EQUAL_JITTER, "full jitter"), (UNCAPPED, "between 0 and min(cap"),
    (NOT_EXPONENTIAL, "full jitter"),
])
def test_wrong_answers_break_the_invariant_they_miss(text, invariant):
    assert any(invariant in name for name in broken(text)), broken(text)


def test_randomness_not_taken_from_rng_is_still_judged_by_its_delays():
    """The module's own random is not seeded by the check, but its delays are still full jitter: the
    check grades the delays, not the spelling."""
    assert broken(OWN_RANDOMNESS) == []


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + "    return min(cap base)\n", "backoff.py, line 4: invalid syntax"),
    (SIGNATURE + "    return 1 / (attempt - attempt)\n", "backoff.py, line 4: ZeroDivisionError: division by zero"),
    (SIGNATURE + "    return None\n", "retry_delay must return a number of seconds; for attempt 1 it returned None"),
    (SIGNATURE + "    while True: attempt += 1\n", "line 4: still running after 1 s (a loop that never ends?)"),
    ("import random\n\ndef retry(attempt, base, cap, rng):\n    return 0.0\n", "define a function named retry_delay"),
])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        backoff.load(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


async def test_the_starter_fails_on_the_stages_own_failure_and_says_how_to_replay_it():
    result = await check(backoff.EXERCISE, backoff.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 07's outage: retries backed off")
    assert "Replay it: reliableq exercise check backoff --seed 1 --seeds 1" in result.text()


async def test_a_policy_without_jitter_survives_the_outage_but_fails_full_jitter():
    result = await check(backoff.EXERCISE, NO_JITTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == ["stage 07's scenario (seed 1)"]
    assert "full jitter" in result.lines[0]


async def test_code_that_cannot_be_loaded_fails_with_one_line():
    result = await check(backoff.EXERCISE, SIGNATURE + "    return min(cap base)\n")
    assert result.outcome is Outcome.FAILED
    assert result.lines == ["✗ Your code could not be used: backoff.py, line 4: invalid syntax. "
                            "Perhaps you forgot a comma?"]


async def test_a_check_without_a_database_could_not_run_and_grades_nothing(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://127.0.0.1:1/nowhere")
    result = await check(backoff.EXERCISE, backoff.REFERENCE, seeds=1)
    assert result.outcome is Outcome.COULD_NOT_RUN and result.outcome.exit_code == 2
    assert result.lines[0].startswith("? The check could not run (nothing was graded): cannot connect to PostgreSQL")
    assert result.checked == []


async def test_the_reference_passes_with_the_earlier_exercise_run_again_and_a_regression_is_named():
    """Checking backoff (stage 07) runs fencing's (stage 05) checks again with both pieces in place: with
    fencing's reference it passes every part and says so; with fencing's starter the regression is named.
    The passing check is this exercise's whole-checker pass (scenario, direct checks, chaos)."""
    from reliableq.lab.exercises import fencing
    passed = await check(backoff.EXERCISE, backoff.REFERENCE, seed=1, seeds=1,
                         earlier=[(fencing.EXERCISE, fencing.REFERENCE)])
    assert passed.outcome is Outcome.PASSED, passed.text()
    assert passed.checked == ["stage 07's scenario (seed 1)", "direct checks", "exercise fencing again (stage 05)",
                              "chaos seed 1"]
    assert passed.text().startswith("✓ backoff passed: stage 07's scenario (seed 1), direct checks, "), passed.text()
    assert passed.text().rstrip().endswith("chaos seed 1.")
    regressed = await check(backoff.EXERCISE, backoff.REFERENCE, seeds=1, earlier=[(fencing.EXERCISE, fencing.STARTER)])
    assert regressed.outcome is Outcome.FAILED
    assert regressed.lines[0] == "✗ Regressed: exercise fencing (stage 05) no longer holds with your new code."


def test_earlier_code_is_the_learners_once_passed_and_the_reference_before(tmp_path):
    from reliableq.lab import exercises
    from reliableq.lab.exercises import fencing
    from reliableq.lab.exercises.workspace import Workspace
    workspace = Workspace(tmp_path)

    def earlier(exercise):
        return {before.name: code for before, code in exercises.earlier_code(exercise, workspace)}
    assert list(earlier(backoff.EXERCISE)) == [before.name for before in exercises.EXERCISES.values()
                                               if before.stage_number < backoff.EXERCISE.stage_number]
    assert earlier(backoff.EXERCISE)["fencing"] == fencing.REFERENCE
    path, _ = workspace.start(fencing.EXERCISE)
    path.write_text("my fencing")
    assert earlier(backoff.EXERCISE)["fencing"] == fencing.REFERENCE
    workspace.record(fencing.EXERCISE, state="passed")
    assert earlier(backoff.EXERCISE)["fencing"] == "my fencing"
    assert all(before.stage_number < fencing.EXERCISE.stage_number
               for before, _ in exercises.earlier_code(fencing.EXERCISE, workspace))
