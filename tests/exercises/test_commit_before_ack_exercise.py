"""Exercise 02 (commit-before-ack) graded by the real checker: the reference and right answers spelt
differently pass, the starter fails on the stage's own failure (job-1 LOST), and the wrong answers a
learner would plausibly write fail on the invariant each breaks. The direct checks need no database; the
whole checks run the real API on real PostgreSQL (stage 02's crash, then seeded chaos). A learner's
exception or endless loop is said at their line, and the API answers it with a JSON 500, never a hang."""

from __future__ import annotations

import ast
import asyncio
import warnings
from dataclasses import replace

import pytest

from reliableq import api
from reliableq.lab.exercises import commit_before_ack as exercise
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError
from tests.conftest import serve

SIGNATURE = "import asyncio\n\n\nasync def accept(store, acknowledge):\n"  # the body starts at line 5
FIRE_AND_FORGET = SIGNATURE + "    asyncio.create_task(store())\n    await acknowledge()\n"
NOT_AWAITED = SIGNATURE + "    store()\n    await acknowledge()\n"
NEVER_ACKNOWLEDGED = SIGNATURE + "    await store()\n"
WAITS_FOR_EVER = SIGNATURE + "    await store()\n    await asyncio.Event().wait()\n    await acknowledge()\n"
TWICE = SIGNATURE + "    await store()\n    await acknowledge()\n    await acknowledge()\n"
ACKNOWLEDGED_WHATEVER_HAPPENED = (SIGNATURE + "    try:\n        await store()\n    finally:\n"
                                  "        await acknowledge()\n")
SIDE_BY_SIDE = SIGNATURE + "    await asyncio.gather(store(), acknowledge())\n"
SLEEPS_ON_IT = SIGNATURE + "    asyncio.create_task(store())\n    await asyncio.sleep(0.05)\n    await acknowledge()\n"
# Right, and spelt differently from the reference.
STORED_FIRST = SIGNATURE + "    stored = await store()\n    await acknowledge()\n"
ONLY_IF_STORED = (SIGNATURE + "    stored = False\n    try:\n        await store()\n        stored = True\n"
                  "    finally:\n        if stored:\n            await acknowledge()\n")
AWAITS_ITS_TASK = SIGNATURE + "    insert = asyncio.create_task(store())\n    await insert\n    await acknowledge()\n"


def broken(text: str) -> list[str]:
    """The names of the direct checks `text` breaks."""
    return [c.name for c in asyncio.run(exercise.direct(exercise.load(text), seed=1)) if not c.held]


def accept_body(text: str) -> str:
    """accept's statements, without its docstring and comments, as the AST reads them."""
    function = ast.parse(text).body[-1]
    return ast.dump(ast.Module([s for s in function.body if not isinstance(s, ast.Expr) or not isinstance(
        s.value, ast.Constant)], []))


def test_the_starter_and_the_reference_are_the_apis_own_orders():
    """The starter is what the API runs with commit_before_ack off, the reference what it runs with it on."""
    import inspect
    assert accept_body(exercise.STARTER) == accept_body(inspect.getsource(api.acknowledge_then_store))
    assert accept_body(exercise.REFERENCE) == accept_body(inspect.getsource(api.store_then_acknowledge))


@pytest.mark.parametrize("text", [exercise.REFERENCE, STORED_FIRST, ONLY_IF_STORED, AWAITS_ITS_TASK],
                         ids=["reference", "stored-first", "only-if-stored", "awaits-its-task"])
def test_right_answers_pass_the_direct_checks(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant", [
    (exercise.STARTER, exercise.ACK_AFTER_COMMIT), (FIRE_AND_FORGET, exercise.ACK_AFTER_COMMIT),
    (SIDE_BY_SIDE, exercise.ACK_AFTER_COMMIT), (SLEEPS_ON_IT, exercise.ACK_AFTER_COMMIT),
    (ACKNOWLEDGED_WHATEVER_HAPPENED, exercise.ACK_AFTER_COMMIT), (NOT_AWAITED, exercise.STORED_ONCE),
    (NEVER_ACKNOWLEDGED, exercise.ANSWERED_ONCE), (WAITS_FOR_EVER, exercise.ANSWERED_ONCE),
    (TWICE, exercise.ANSWERED_ONCE),
], ids=["starter", "fire-and-forget", "side-by-side", "sleeps-on-it", "acknowledged-whatever-happened",
        "not-awaited", "never-acknowledged", "waits-for-ever", "twice"])
def test_wrong_answers_break_the_invariant_they_miss(text, invariant):
    assert broken(text)[0] == invariant


def test_a_store_never_awaited_is_said_as_a_lost_job_not_a_runtime_warning():
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        checks = asyncio.run(exercise.direct(exercise.load(NOT_AWAITED), seed=1))
    assert not [warning for warning in warned if "never awaited" in str(warning.message)]
    assert checks[0].violations == [{"store()": "never ran, so the acknowledged job is lost"}]


def test_accept_that_never_acknowledges_is_said_within_the_deadline_with_the_line_it_waited_at():
    [stored, answered, _] = asyncio.run(exercise.direct(exercise.load(WAITS_FOR_EVER), seed=1))
    assert stored.held
    assert answered.violations == [{"acknowledge()": "never called (after 1 s accept was still waiting at line 6): "
                                                     "the client would wait for ever for its 202"}]


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + "    await store(\n", "commit_before_ack.py, line 5: '(' was never closed"),
    (SIGNATURE + "    await store()\n    1 / 0\n", "commit_before_ack.py, line 6: ZeroDivisionError: division by zero"),
    (SIGNATURE + "    while True: pass\n", "line 5: still running after 1 s (a loop that never ends?)"),
    ("def accept(store, acknowledge):\n    pass\n", "define accept with `async def`"),
    ("async def accept(store):\n    await store()\n", "accept() takes 1 positional argument but 2 were given"),
    ("async def store_then_ack(store, acknowledge):\n    pass\n", "define a function named accept"),
], ids=["syntax", "exception", "endless-loop", "not-async", "one-argument", "misnamed"])
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        asyncio.run(exercise.direct(exercise.load(text), seed=1))
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


BROKEN_IN_THE_API = [
    (SIGNATURE + "    raise ValueError('no')\n", "failed before it was acknowledged: LearnerError"),
    (NEVER_ACKNOWLEDGED, "not acknowledged: the API's order ended without answering"),
    (WAITS_FOR_EVER, "failed before it was acknowledged: Late"),
    (SIGNATURE + "    while True: pass\n", "failed before it was acknowledged: LearnerError"),
]


async def test_the_api_answers_a_learners_broken_accept_with_a_json_500_not_a_hang(databases):
    """The API's own thread meets the learner's mistake (an exception, no answer, a wait or a loop that
    never ends): the client gets a JSON 500 within the deadline (shortened here), and the mistake is
    kept, at the learner's line, for the check to say."""
    for text, said in BROKEN_IN_THE_API:
        order = replace(exercise.load(text).submission_order, deadline_seconds=0.5)
        async with serve(api.create_api_app(databases.queue_url, order=order)) as client:
            response = await client.post("/v1/jobs", json={"amount_cents": 1250})
        assert response.status_code == 500 and said in response.json()["error"], (text, response.text)
        assert all(str(error).startswith("commit_before_ack.py, line ") for error in order.errors)


async def test_the_reference_passes_the_scenario_and_chaos():
    result = await check(exercise.EXERCISE, exercise.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["stage 02's scenario (seed 1)", "direct checks", "chaos seed 1"]


async def test_a_right_answer_spelt_differently_passes_the_stages_crash_too():
    """Its direct checks passed above; chaos is the reference's test (it grades no spelling)."""
    held, run = await exercise.scenario(exercise.load(ONLY_IF_STORED), seed=1)
    assert held.held and run.measurements["lost_jobs"] == 0


@pytest.mark.parametrize("text", [exercise.STARTER, FIRE_AND_FORGET], ids=["starter", "fire-and-forget"])
async def test_the_starter_and_a_fire_and_forget_store_lose_job_1_in_the_stages_crash(text):
    result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 02's API crash right after job-1's 202: every "
                                      "acknowledged job is stored (lost_jobs = 0)")
    assert result.lines[1] == "  job job-1, status LOST"
    assert "Replay it: reliableq exercise check commit-before-ack --seed 1 --seeds 1" in result.text()


async def test_answers_the_stage_cannot_show_wrong_fail_on_the_direct_check_they_break():
    """Both store before their 202 goes out, so the stage's crash after the 202 finds nothing to lose;
    the direct check still sees a 202 sent before the commit, or for an insert that failed."""
    for text in (SIDE_BY_SIDE, ACKNOWLEDGED_WHATEVER_HAPPENED):
        result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
        assert result.outcome is Outcome.FAILED and result.checked == ["stage 02's scenario (seed 1)"]
        assert result.lines[0] == f"✗ Broken: {exercise.ACK_AFTER_COMMIT}"


async def test_a_mistake_met_only_inside_the_api_is_said_at_the_learners_line():
    """This accept works once (the check's trial) and raises after that, in the API's own thread: the
    submission is answered 500, and the check says the learner's exception, not the client's error."""
    text = ("calls = 0\n\n\nasync def accept(store, acknowledge):\n    global calls\n    calls += 1\n"
            "    if calls > 1:\n        raise ValueError('only once')\n    await store()\n    await acknowledge()\n")
    result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines == ["✗ Your code could not be used: commit_before_ack.py, line 8: ValueError: only once"]


async def test_a_mistake_met_only_under_chaos_is_said_at_the_learners_line():
    """This accept holds through the trial, the stage and the direct checks, and raises once chaos has
    sent more submissions: the chaos run stops at the refused one, and the check names the line."""
    text = ("calls = 0\n\n\nasync def accept(store, acknowledge):\n    global calls\n    calls += 1\n"
            "    if calls > 30:\n        raise ValueError('too many')\n    await store()\n    await acknowledge()\n")
    result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.checked == ["stage 02's scenario (seed 1)", "direct checks"]
    assert result.lines == ["✗ Your code could not be used: commit_before_ack.py, line 8: ValueError: too many"]
