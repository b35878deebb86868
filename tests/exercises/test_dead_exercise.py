"""Exercise 08 (dead) graded by the real checker: the reference (the shipped decision) and right answers
spelt differently pass, and the wrong answers a learner would plausibly write fail first on the direct
checks, under the invariant each breaks, with its smallest wrong case. The direct checks of a decision
need no database; one whole check runs the real system (stage 08 on real PostgreSQL and HTTP, then
seeded chaos), and one runs the stage's scenario alone with the starter."""

from __future__ import annotations

import asyncio

import pytest

from reliableq import finalize_decision
from reliableq.lab.exercises import dead, learner_code
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

SIGNATURE = "def decide(outcome_kind, attempts, max_attempts):\n"
OK = '    if outcome_kind == "ok":\n        return "succeed"\n'


def dies_when(condition: str) -> str:
    """A decision right but for when a transient or ambiguous failure goes DEAD."""
    return (SIGNATURE + OK + f'    if outcome_kind == "permanent" or {condition}:\n        return "dead"\n'
            '    return "retry"\n')


OFF_BY_ONE = dies_when("attempts > max_attempts")
ONLY_AT_THE_BUDGET = dies_when("attempts == max_attempts")  # a job asked past its budget (DEAD off) retries
SMALL_BUDGETS_ONLY = dies_when("attempts >= min(max_attempts, 10)")
OFF_BY_ONE_ABOVE_5 = dies_when("attempts >= max_attempts + (max_attempts > 5)")
API_BUDGETS_ONLY = dies_when("attempts >= min(max_attempts, 100)")  # wrong only for budgets replays make
ONLY_OK_RETRIED = SIGNATURE + OK + '    return "dead"\n'  # every failure dies at once: a hiccup kills a good job
AMBIGUOUS_DIES = (SIGNATURE + OK + '    if outcome_kind != "transient" or attempts >= max_attempts:\n'
                  '        return "dead"\n    return "retry"\n')
PERMANENT_RETRIED = SIGNATURE + OK + '    return "dead" if attempts >= max_attempts else "retry"\n'
OK_PAST_THE_BUDGET_DIES = (SIGNATURE + '    if outcome_kind == "ok" and attempts <= max_attempts:\n'
                           '        return "succeed"\n    return "dead" if outcome_kind == "permanent" or '
                           'attempts >= max_attempts else "retry"\n')
# Right, and spelt differently from the reference.
BY_BUDGET_FIRST = (SIGNATURE + OK + '    budget_left = max_attempts - attempts\n'
                   '    if outcome_kind in ("transient", "ambiguous") and budget_left > 0:\n        return "retry"\n'
                   '    return "dead"\n')
TABLE = ('RETRIED = {"transient", "ambiguous"}\n\n' + SIGNATURE
         + '    return {True: "succeed"}.get(outcome_kind == "ok") or (\n'
           '        "retry" if outcome_kind in RETRIED and attempts + 1 <= max_attempts else "dead")\n')
MATCH = (SIGNATURE + '    match outcome_kind:\n        case "ok":\n            return "succeed"\n'
         '        case "transient" | "ambiguous" if attempts < max_attempts:\n            return "retry"\n'
         '        case _:\n            return "dead"\n')


def broken(text: str, seed: int = 1) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(dead.direct(dead.load(text), seed)) if not c.held]


def test_the_reference_is_the_shipped_decision():
    assert finalize_decision.decide.__doc__ in dead.REFERENCE
    decision = dead.load(dead.REFERENCE).decision
    assert all(decision(*case) == finalize_decision.decide(*case) for case in dead.cases())


def test_every_outcome_attempt_and_budget_the_api_accepts_is_asked():
    assert len(dead.cases()) == 4 * sum(budget + dead.PAST_BUDGET for budget in range(1, 101)) == 21_400
    assert dead.cases()[0] == ("ok", 1, 1) and dead.cases()[-1] == ("ambiguous", 103, 100)


@pytest.mark.parametrize("text", [dead.REFERENCE, BY_BUDGET_FIRST, TABLE, MATCH])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant, smallest", [
    (OFF_BY_ONE, "a transient or ambiguous failure on the last attempt",
     "outcome transient, attempt 1, max_attempts 1, yours retry, right dead, wrong in 100 case(s), "
     "max_attempts 1 to 100"),
    (ONLY_AT_THE_BUDGET, "a transient or ambiguous failure on the last attempt",
     "outcome transient, attempt 2, max_attempts 1, yours retry, right dead, wrong in 300 case(s)"),
    (SMALL_BUDGETS_ONLY, "a transient or ambiguous failure is retried while budget remains",
     "outcome transient, attempt 10, max_attempts 11, yours dead, right retry, wrong in 4095 case(s), "
     "max_attempts 11 to 100"),
    (OFF_BY_ONE_ABOVE_5, "a transient or ambiguous failure on the last attempt",
     "outcome transient, attempt 6, max_attempts 6, yours retry, right dead, wrong in 95 case(s), "
     "max_attempts 6 to 100"),
    (ONLY_OK_RETRIED, "a transient or ambiguous failure is retried while budget remains",
     "outcome transient, attempt 1, max_attempts 2, yours dead, right retry"),
    (AMBIGUOUS_DIES, "a transient or ambiguous failure is retried while budget remains",
     "outcome ambiguous, attempt 1, max_attempts 2, yours dead, right retry"),
    (PERMANENT_RETRIED, "a permanent failure goes DEAD at once",
     "outcome permanent, attempt 1, max_attempts 2, yours retry, right dead"),
    (OK_PAST_THE_BUDGET_DIES, "an ok outcome succeeds",
     "outcome ok, attempt 2, max_attempts 1, yours dead, right succeed"),
    (dead.STARTER, "a permanent failure goes DEAD at once",
     "outcome permanent, attempt 1, max_attempts 1, yours retry, right dead, wrong in 5350 case(s)"),
], ids=["off-by-one", "only-at-the-budget", "small-budgets-only", "off-by-one-above-5", "every-failure-dies",
        "ambiguous-dies", "permanent-retried", "ok-past-the-budget-dies", "starter"])
async def test_wrong_answers_fail_first_on_the_invariant_they_break_with_their_smallest_case(text, invariant, smallest):
    """The direct checks run before the stage's scenario, so the first line names the mistake and no
    database is needed to say it."""
    result = await check(dead.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert result.lines[0].startswith(f"✗ Broken: {invariant}"), result.text()
    assert result.lines[1].startswith(f"  {smallest}"), result.text()
    assert result.lines[-1] == "  Replay it: reliableq exercise check dead --seed 1 --seeds 1"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_decision_wrong_only_for_budgets_replays_make_is_found_at_its_smallest_case_at_any_seed(seed):
    """A replay sets max_attempts past what a submission may ask: the seeded search finds the mistake there
    and shrinks it to the budget just past the API's largest."""
    [failed] = [c for c in asyncio.run(dead.direct(dead.load(API_BUDGETS_ONLY), seed)) if not c.held]
    assert failed.name.startswith("a transient or ambiguous failure is retried while budget remains")
    assert failed.violations == [{"outcome": "transient", "attempt": 100, "max_attempts": 101, "yours": "dead",
                                  "right": "retry", "found by": "a seeded search of 200 cases with max_attempts "
                                                                "past 100, as replays make"}]


def test_an_exception_the_search_meets_is_said_at_the_learners_line_naming_the_case():
    one_retry_per_budget = (SIGNATURE + OK + '    if outcome_kind == "permanent" or attempts >= max_attempts:\n'
                            '        return "dead"\n    return (["retry"] * 100)[max_attempts - 1]\n')
    with pytest.raises(LearnerError) as raised:
        broken(one_retry_per_budget)
    assert str(raised.value).startswith("dead.py, line 6: IndexError: list index out of range "
                                        "(asked decide('transient', ")


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + '    return "retry" if attempts < max_attempts else "dead\n', "dead.py, line 2: unterminated string"),
    (SIGNATURE + "    return max_attempts // (attempts - attempts)\n",
     "dead.py, line 2: ZeroDivisionError: integer division or modulo by zero (asked decide('ok', 1, 1))"),
    (SIGNATURE + '    return "DEAD"\n',
     "decide must return \"succeed\", \"retry\" or \"dead\"; for ('ok', 1, 1) it returned 'DEAD'"),
    (SIGNATURE + "    while True: attempts += 1\n", "line 2: still running after 1 s (a loop that never ends?)"),
    ("def decision(outcome_kind, attempts, max_attempts):\n    return 'retry'\n", "define a function named decide"),
])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        dead.load(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


def test_a_call_held_up_without_computing_is_not_taken_for_an_endless_loop():
    """The deadline counts the learner's own CPU time: a right answer descheduled on a loaded machine (here,
    asleep for longer than the deadline) still answers, where a wall-clock deadline once failed it."""
    decide = dead.load("import time\n\n\n" + SIGNATURE.replace("\n", "\n    time.sleep(1.2)\n", 1)
                       + '    return "succeed" if outcome_kind == "ok" else "retry"\n').decision
    assert decide("ok", 1, 5) == "succeed"


def test_a_loop_that_waits_rather_than_computes_is_stopped_by_the_clock_at_its_line(monkeypatch):
    """Asleep in place it spends no CPU time; the clock's backstop stops it, though the clocks are read only
    every so many of its opcodes."""
    monkeypatch.setattr(learner_code, "CALL_WALL_SECONDS", 0.3)  # the deadline's 1 s then bounds the clock too
    with pytest.raises(LearnerError) as raised:
        dead.load("import time\n\n\n" + SIGNATURE + "    while True: time.sleep(0.01)\n")
    assert "dead.py, line 5: still running after 1 s (a loop that never ends?)" in str(raised.value)


@pytest.mark.slow
async def test_the_reference_passes_the_forced_schedules_the_scenario_and_chaos():
    result = await check(dead.EXERCISE, dead.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 08's scenario (seed 1)", "chaos seed 1"]


async def test_the_stages_scenario_fails_the_starter_and_names_the_jobs():
    """It never gives up: the rejected cards are retried past their budget and never go DEAD (the scenario
    alone, as the checker runs it after the direct checks)."""
    failed, _ = await dead.scenario(dead.load(dead.STARTER), 1)
    assert not failed.held and failed.name.startswith("stage 08's rejected cards: each job went DEAD after 1 attempt")
    assert failed.note == "0 of 4 jobs went DEAD"
    assert [row["but"] for row in failed.violations] == ["never went DEAD"] * 4
    assert failed.violations[0]["job"] == "job-1"
