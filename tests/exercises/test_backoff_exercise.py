"""Exercise 07 (backoff) graded by the real checker: the reference and right answers spelt differently pass,
and the wrong answers a learner would plausibly write fail first on the direct checks, on the invariant
each breaks, with a message naming the mistake. The direct checks of a policy need no database; one
whole check runs the real system (stage 07's outage on real PostgreSQL and HTTP, then seeded chaos),
and one runs the stage's scenario alone with the starter."""

from __future__ import annotations

import asyncio
import time

import pytest

from reliableq.lab.exercises import backoff
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

SIGNATURE = "import math\nimport random\nimport time\n\ndef retry_delay(attempt, base, cap, rng):\n"
CEILING = "min(cap, base * 2 ** min(attempt - 1, 64))"


def returning(expression: str) -> str:
    return SIGNATURE + f"    return {expression}\n"


NO_JITTER = returning(CEILING)
EQUAL_JITTER = returning(f"{CEILING} / 2 + rng.uniform(0, {CEILING} / 2)")
# AWS's decorrelated jitter, each delay drawn from base to three times the one before: above the ceiling.
DECORRELATED = (SIGNATURE + "    delay = base\n    for _ in range(attempt):\n"
                "        delay = min(cap, rng.uniform(base, delay * 3))\n    return delay\n")
JITTER_ONLY_ABOVE_THE_CAP = returning("rng.uniform(0, cap) if base * 2 ** min(attempt - 1, 64) > cap "
                                      "else base * 2 ** (attempt - 1)")
EXPONENT_ONE_TOO_LARGE = returning("rng.uniform(0, min(cap, base * 2 ** min(attempt, 64)))")
EXPONENT_ONE_TOO_SMALL = returning("rng.uniform(0, min(cap, base * 2 ** min(attempt - 2, 64)))")
CAP_IGNORED_PAST_ATTEMPT_10 = returning("rng.uniform(0, base * 2 ** min(attempt - 1, 64) if attempt > 10 "
                                        f"else {CEILING})")
UNCAPPED = returning("rng.uniform(0, base * 2 ** min(attempt - 1, 64))")
MILLISECONDS = returning(f"1000 * rng.uniform(0, {CEILING})")
GLOBAL_RANDOM = returning(f"random.uniform(0, {CEILING})")
FROM_THE_CLOCK = returning(f"time.time() * 1e6 % 1000 / 1000 * {CEILING}")
CLIPPED_NORMAL = returning(f"min({CEILING}, max(0.0, rng.gauss({CEILING} / 2, {CEILING} / 4)))")
SEEDED_BY_ATTEMPT = returning(f"random.Random(attempt).uniform(0, {CEILING})")  # every job the same delay
EXPONENT_OVERFLOWS = returning("rng.uniform(0, min(cap, base * 2 ** (attempt - 1)))")  # the hint, uncapped exponent
# Doubling from base: right unless the cap is below base, where attempt 1 still waits up to base.
DOUBLING_FROM_BASE = (SIGNATURE + "    ceiling = base\n    for _ in range(attempt - 1):\n"
                      "        ceiling = min(cap, ceiling * 2)\n    return rng.uniform(0.0, ceiling)\n")
# Right, and spelt differently from the reference.
SCALED = returning(f"rng.random() * {CEILING}")
SWAPPED = returning("rng.uniform(min(base * 2 ** min(attempt - 1, 64), cap), 0)")  # draws 1 - U: also uniform
LDEXP = returning("rng.uniform(0, cap if attempt > 64 else min(cap, math.ldexp(base, attempt - 1)))")
FLOAT_POWER = returning("rng.uniform(0, cap if attempt > 1000 else min(cap, base * 2.0 ** (attempt - 1)))")
DOUBLING_UP_TO_THE_CAP = (SIGNATURE + "    ceiling = base\n    for _ in range(attempt - 1):\n"
                          "        if ceiling >= cap:\n            break\n        ceiling *= 2\n"
                          "    return rng.uniform(0, min(ceiling, cap))\n")

BOUNDS = "every delay is between 0 and min(cap, base·2^(n-1)), at every attempt 1 to 100"
SPREAD = "delays are spread evenly over the whole window, 0 to the ceiling (full jitter): Kolmogorov-Smirnov"
REPLAYED = "retry_delay draws from the rng it is given: the same seed gives the same delay"
WHOLE_RANGE = "across the whole range, attempts 1 to 1100 and base and cap from 1e-06 s to 1e+09 s"


def broken(text: str, seed: int = 1) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(backoff.direct(backoff.load(text), seed)) if not c.held]


@pytest.mark.parametrize("text", [backoff.REFERENCE, SCALED, SWAPPED, LDEXP, FLOAT_POWER, DOUBLING_UP_TO_THE_CAP],
                         ids=["reference", "scaled", "swapped", "ldexp", "float-power", "doubling-up-to-the-cap"])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant, said", [
    (backoff.STARTER, SPREAD, "base 0.5 s, cap 60 s, attempts 1 to 100, yours the same delay for every job: "
                              "no jitter"),
    (NO_JITTER, SPREAD, "yours the same delay for every job: no jitter"),
    (SEEDED_BY_ATTEMPT, SPREAD, "yours the same delay for every job: no jitter"),
    (JITTER_ONLY_ABOVE_THE_CAP, SPREAD, "base 0.5 s, cap 60 s, attempts 1 to 7 (ceiling below the cap), yours the "
                                        "same delay for every job"),
    (EQUAL_JITTER, SPREAD, "yours never below 0.50 of the ceiling: the bottom of the window is never used "
                           "(equal jitter?)"),
    (EXPONENT_ONE_TOO_SMALL, SPREAD, "attempts 1 to 8, yours never above 0.52 of the ceiling: the top of the window "
                                     "is never used (an exponent one too small?)"),
    (CLIPPED_NORMAL, SPREAD, "all delays 19,200 as fractions of their ceiling, yours 16%, 34%, 33%, 16% of the "
                             "delays in the window's four quarters, where full jitter puts 25% in each"),
    (EXPONENT_ONE_TOO_LARGE, BOUNDS, "base 0.5 s, cap 60 s, attempts 1 to 7, first attempt 1: delays up to "
                                     "0.96928 s, above the ceiling 0.5 s and within twice it: an exponent one too "
                                     "large"),
    (DECORRELATED, BOUNDS, "first attempt 1: delays up to 1.46928 s, 2.94 times the ceiling 0.5 s"),
    (CAP_IGNORED_PAST_ATTEMPT_10, BOUNDS, "attempts 11 to 100, first attempt 11: delays up to 486.863 s, above the "
                                          "cap 60 s: the cap is not applied"),
    (UNCAPPED, BOUNDS, "base 2 s, cap 0.5 s, attempts 1 to 100, first attempt 1: delays up to 1.93856 s, above the "
                       "cap 0.5 s: the cap is not applied"),
    (DOUBLING_FROM_BASE, BOUNDS, "base 2 s, cap 0.5 s, attempts 1, first attempt 1: delays up to 1.93856 s, above "
                                 "the cap 0.5 s"),
    (MILLISECONDS, BOUNDS, "969 times the ceiling 0.5 s: milliseconds, where seconds are asked"),
    (GLOBAL_RANDOM, REPLAYED, "take every random number from rng (not the random module, not the clock)"),
    # How many of the 300 cases differ is the clock's to say (two readings a microsecond apart can agree).
    (FROM_THE_CLOCK, REPLAYED, "not the clock), and keep nothing from one call to the next"),
    (EXPONENT_OVERFLOWS, WHOLE_RANGE, "smallest case attempt 1025, base 1.0 s, cap 1.0 s, yours backoff.py, line 6: "
                                      "OverflowError: int too large to convert to float"),
], ids=["starter", "no-jitter", "seeded-by-attempt", "jitter-only-above-the-cap", "equal-jitter",
        "exponent-one-too-small", "clipped-normal", "exponent-one-too-large", "decorrelated",
        "cap-ignored-past-attempt-10", "uncapped", "doubling-from-base", "milliseconds", "global-random",
        "from-the-clock", "exponent-overflows"])
@pytest.mark.slow
async def test_wrong_answers_fail_first_on_the_invariant_they_break_naming_the_mistake(text, invariant, said):
    """The direct checks run before the stage's scenario, so the first line names the mistake and no
    database is needed to say it."""
    result = await check(backoff.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert result.lines[0].startswith(f"✗ Broken: {invariant}"), result.text()
    assert said in result.text(), result.text()


def test_a_policy_looping_over_its_attempts_is_timed_without_a_clock_read_per_opcode(monkeypatch):
    """The deadline reads the clocks once every hundred of the learner's lines and opcodes: read at each,
    decorrelated jitter's loop over the attempts took 1.4 ms a call and its check 30 s."""
    reads = []
    thread_time = time.thread_time
    monkeypatch.setattr(time, "thread_time", lambda: reads.append(1) or thread_time())
    policy = backoff.load(DECORRELATED).retry_delays(backoff._settings(0.5, 60.0, 1))
    reads.clear()
    policy.delay(1000)  # a thousand turns of the learner's loop: 18,000 opcodes, each once a clock read
    assert 1 <= len(reads) <= 200


@pytest.mark.parametrize("text", [GLOBAL_RANDOM, FROM_THE_CLOCK])
def test_randomness_not_drawn_from_rng_is_told_so_every_time(text):
    """Its delays cannot be judged the same way twice, so nothing else is judged: the verdict is the same
    on every run."""
    verdicts = [broken(text) for _ in range(3)]
    assert verdicts == [verdicts[0]] * 3 and len(verdicts[0]) == 1 and verdicts[0][0].startswith(REPLAYED)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_search_shrinks_an_overflow_to_the_first_attempt_past_float_range_at_any_seed(seed):
    [failed] = [c for c in asyncio.run(backoff.direct(backoff.load(EXPONENT_OVERFLOWS), seed)) if not c.held]
    assert failed.violations[0]["smallest case"].startswith("attempt 1025, ")


def test_the_significance_and_the_draws_are_stated():
    [*_, spread] = asyncio.run(backoff.direct(backoff.load(backoff.REFERENCE), seed=1))
    assert spread.held and "at significance 1e-06 for the whole check" in spread.name
    assert spread.note.startswith("301 tests at 3.3e-09 each: every attempt's 64 draws at each pair, then all "
                                  "19,200 together")


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + "    return min(cap base)\n", "backoff.py, line 6: invalid syntax"),
    (SIGNATURE + "    return 1 / (attempt - attempt)\n",
     "backoff.py, line 6: ZeroDivisionError: division by zero (asked retry_delay(1, 0.05, 1.0, rng))"),
    (SIGNATURE + "    return None\n", "retry_delay must return a number of seconds; for attempt 1 it returned None"),
    (SIGNATURE + "    while True: attempt += 1\n", "line 6: still running after 1 s (a loop that never ends?)"),
    ("import random\n\ndef retry(attempt, base, cap, rng):\n    return 0.0\n", "define a function named retry_delay"),
])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        backoff.load(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


async def test_code_that_cannot_be_loaded_fails_with_one_line():
    result = await check(backoff.EXERCISE, SIGNATURE + "    return min(cap base)\n")
    assert result.outcome is Outcome.FAILED
    assert result.lines == ["✗ Your code could not be used: backoff.py, line 6: invalid syntax. "
                            "Perhaps you forgot a comma?"]


@pytest.mark.slow
async def test_the_stages_scenario_fails_the_starter():
    """Retrying at once hammers the charge service through its outage (the scenario alone, as the checker
    runs it after the direct checks)."""
    failed, _ = await backoff.scenario(backoff.load(backoff.STARTER), 1)
    assert not failed.held and failed.name.startswith("stage 07's outage: retries backed off")
    assert failed.violations[0]["requests"] > backoff.OUTAGE_REQUESTS_PER_JOB * failed.violations[0]["jobs"]


async def test_a_check_without_a_database_could_not_run(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://127.0.0.1:1/nowhere")
    result = await check(backoff.EXERCISE, backoff.REFERENCE, seeds=1)
    assert result.outcome is Outcome.COULD_NOT_RUN and result.outcome.exit_code == 2
    # The policy's own checks need no database and held; the stage's scenario could not start.
    assert result.lines[0].startswith("? The check could not run stage 07's scenario (seed 1) (no verdict: forced "
                                      "schedules held before it): cannot connect to PostgreSQL")


@pytest.mark.slow
async def test_the_reference_passes_and_an_earlier_exercise_its_piece_cannot_change_is_not_run_again():
    """The whole-checker pass (forced schedules, scenario, chaos). Fencing's stage (05) runs with backoff
    off, so the retry delay cannot change what fencing's checks see: it is said, not run again."""
    from reliableq.lab.exercises import fencing
    passed = await check(backoff.EXERCISE, backoff.REFERENCE, seed=1, seeds=1,
                         earlier=[(fencing.EXERCISE, fencing.REFERENCE)])
    assert passed.outcome is Outcome.PASSED, passed.text()
    assert passed.checked == ["forced schedules", "stage 07's scenario (seed 1)", "chaos seed 1"]
    assert passed.lines == ["✓ backoff passed: forced schedules, stage 07's scenario (seed 1), chaos seed 1.",
                            "  Not run again, as nothing that may have changed since they passed runs in their "
                            "stages: fencing."]


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
