"""Exercise 08 (dead) graded by the real checker: the reference (the shipped decision) and right answers
spelt differently pass, the starter fails on the stage's rejected cards, and the wrong answers a learner
would plausibly write fail on the invariant each breaks. The direct checks of a decision need no
database; whole checks run the real system (stage 08 on real PostgreSQL and HTTP, then seeded chaos)."""

from __future__ import annotations

import asyncio

import pytest

from reliableq import finalize_decision
from reliableq.lab.exercises import dead
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

SIGNATURE = "def decide(outcome_kind, attempts, max_attempts):\n"
OK = '    if outcome_kind == "ok":\n        return "succeed"\n'
OFF_BY_ONE = (SIGNATURE + OK + '    if outcome_kind == "permanent" or attempts > max_attempts:\n        return "dead"\n'
              '    return "retry"\n')
ONLY_OK_RETRIED = SIGNATURE + OK + '    return "dead"\n'  # every failure dies at once: a hiccup kills a good job
AMBIGUOUS_DIES = (SIGNATURE + OK + '    if outcome_kind != "transient" or attempts >= max_attempts:\n'
                  '        return "dead"\n    return "retry"\n')
PERMANENT_RETRIED = SIGNATURE + OK + '    return "dead" if attempts >= max_attempts else "retry"\n'
# Right, and spelt differently from the reference.
BY_BUDGET_FIRST = (SIGNATURE + '    if outcome_kind == "ok":\n        return "succeed"\n'
                   '    budget_left = max_attempts - attempts\n'
                   '    if outcome_kind in ("transient", "ambiguous") and budget_left > 0:\n        return "retry"\n'
                   '    return "dead"\n')
TABLE = ('RETRIED = {"transient", "ambiguous"}\n\n' + SIGNATURE
         + '    return {True: "succeed"}.get(outcome_kind == "ok") or (\n'
           '        "retry" if outcome_kind in RETRIED and attempts + 1 <= max_attempts else "dead")\n')


def broken(text: str) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(dead.direct(dead.load(text), seed=1)) if not c.held]


def test_the_reference_is_the_shipped_decision():
    assert finalize_decision.decide.__doc__ in dead.REFERENCE
    assert all(dead.load(dead.REFERENCE).decision(*case) == finalize_decision.decide(*case) for case in dead.cases())


@pytest.mark.parametrize("text", [dead.REFERENCE, BY_BUDGET_FIRST, TABLE])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant", [
    (OFF_BY_ONE, "a transient or ambiguous failure on the last attempt"),
    (ONLY_OK_RETRIED, "a transient or ambiguous failure is retried while budget remains"),
    (AMBIGUOUS_DIES, "a transient or ambiguous failure is retried while budget remains"),
    (PERMANENT_RETRIED, "a permanent failure goes DEAD at once"),
    (dead.STARTER, "a permanent failure goes DEAD at once"),
], ids=["off-by-one", "every-failure-dies", "ambiguous-dies", "permanent-retried", "starter"])
def test_wrong_answers_break_the_invariant_they_miss(text, invariant):
    assert broken(text)[0].startswith(invariant), broken(text)


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + '    return "retry" if attempts < max_attempts else "dead\n', "dead.py, line 2: unterminated string"),
    (SIGNATURE + "    return max_attempts // (attempts - attempts)\n",
     "dead.py, line 2: ZeroDivisionError: integer division or modulo by zero"),
    (SIGNATURE + '    return "DEAD"\n',
     "decide must return \"succeed\", \"retry\" or \"dead\"; for ('ok', 1, 1) it returned 'DEAD'"),
    (SIGNATURE + "    while True: attempts += 1\n", "line 2: still running after 1 s (a loop that never ends?)"),
    ("def decision(outcome_kind, attempts, max_attempts):\n    return 'retry'\n", "define a function named decide"),
])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        dead.load(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


async def test_the_reference_passes_the_scenario_and_chaos():
    result = await check(dead.EXERCISE, dead.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["stage 08's scenario (seed 1)", "direct checks", "chaos seed 1"]


async def test_the_starter_fails_on_the_stages_own_failure_and_names_the_jobs():
    """It never gives up: the rejected cards are retried past their budget and never go DEAD."""
    result = await check(dead.EXERCISE, dead.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 08's rejected cards: each job went DEAD after 1 attempt")
    assert "[0 of 4 jobs went DEAD]" in result.lines[0]
    assert "job job-1, status PENDING" in result.text() and "never went DEAD" in result.text()
    assert "Replay it: reliableq exercise check dead --seed 1 --seeds 1" in result.text()


async def test_retrying_a_permanent_failure_until_the_budget_fails_the_scenario():
    result = await check(dead.EXERCISE, PERMANENT_RETRIED, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert "job job-1, went DEAD after 3 attempts, but its card was rejected" in result.text()


async def test_a_budget_off_by_one_passes_the_stage_but_fails_the_direct_check():
    """The stage's cards are all rejected (permanent), so only the direct checks reach the budget."""
    result = await check(dead.EXERCISE, OFF_BY_ONE, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == ["stage 08's scenario (seed 1)"]
    assert result.lines[0].startswith("✗ Broken: a transient or ambiguous failure on the last attempt")
    assert "outcome transient, attempt 1, max_attempts 1, yours retry, right dead" in result.text()
