"""Exercise 02 (commit-before-ack) graded by the real checker: the reference and right answers spelt
differently pass, and the wrong answers a learner would plausibly write (the starter among them) fail
first on the invariant each breaks, in the forced schedule that shows it. The forced schedules need no
database and run on the check's own clock; the whole checks run the real API on real PostgreSQL (stage
02's crash, then seeded chaos). A learner's exception or endless loop is said at their line, and the API
answers it with a JSON 500, never a hang."""

from __future__ import annotations

import ast
import asyncio
import gc
import subprocess
import sys
import time
import warnings
from dataclasses import replace

import pytest

from reliableq import acknowledgement, api, db
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.lab.exercises import commit_before_ack as exercise
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.invariants import Check
from tests.conftest import serve

SIGNATURE = "import asyncio\nimport time\n\n\nasync def accept(store, acknowledge):\n"  # the body starts at line 6


def accept(*lines: str) -> str:
    return SIGNATURE + "".join(f"    {line}\n" for line in lines)


FIRE_AND_FORGET = accept("asyncio.create_task(store())", "await acknowledge()")
NOT_AWAITED = accept("store()", "await acknowledge()")
WAITS_FOR_EVER = accept("await store()", "await asyncio.Event().wait()", "await acknowledge()")
# Each acknowledges once its store has taken longer than some timeout: caught however long the timeout.
TIMEOUT_THEN_ACKNOWLEDGE = accept("try:", "    await asyncio.wait_for(store(), 30)", "except TimeoutError:",
                                  "    pass", "await acknowledge()")
POLLS_WITH_A_DEADLINE = accept("insert = asyncio.create_task(store())", "deadline = time.monotonic() + 2",
                               "while not insert.done() and time.monotonic() < deadline:",
                               "    await asyncio.sleep(0.01)", "await acknowledge()")
WRONG = {
    "starter": (exercise.STARTER, exercise.ACK_AFTER_COMMIT, "not called yet"),
    "fire-and-forget": (FIRE_AND_FORGET, exercise.ACK_AFTER_COMMIT, "a task of its own that accept did not wait for"),
    "not-awaited": (NOT_AWAITED, exercise.ACK_AFTER_COMMIT, "called but never awaited"),
    "side-by-side": (accept("await asyncio.gather(store(), acknowledge())"), exercise.ACK_AFTER_COMMIT,
                     "still running"),
    "sleeps-on-it": (accept("asyncio.create_task(store())", "await asyncio.sleep(0.05)", "await acknowledge()"),
                     exercise.ACK_AFTER_COMMIT, "still running"),
    "timeout-then-acknowledge": (TIMEOUT_THEN_ACKNOWLEDGE, exercise.ACK_AFTER_COMMIT, "cancelled before its insert"),
    "shielded-timeout": (accept("try:", "    await asyncio.wait_for(asyncio.shield(store()), 0.5)",
                                "except TimeoutError:", "    pass", "await acknowledge()"),
                         exercise.ACK_AFTER_COMMIT, "still running"),
    "waits-with-a-timeout": (accept("insert = asyncio.create_task(store())", "await asyncio.wait([insert], timeout=1)",
                                    "await acknowledge()"), exercise.ACK_AFTER_COMMIT, "still running"),
    "polls-with-a-deadline": (POLLS_WITH_A_DEADLINE, exercise.ACK_AFTER_COMMIT, "at 2.0"),
    "polls-the-loops-clock": (POLLS_WITH_A_DEADLINE.replace("time.monotonic()", "asyncio.get_running_loop().time()"),
                              exercise.ACK_AFTER_COMMIT, "still running"),
    "polls-a-clock-imported-by-name": (POLLS_WITH_A_DEADLINE.replace("import time", "from time import perf_counter")
                                       .replace("time.monotonic()", "perf_counter()"),
                                       exercise.ACK_AFTER_COMMIT, "still running"),
    "acknowledged-whatever-happened": (accept("try:", "    await store()", "finally:", "    await acknowledge()"),
                                       exercise.ACK_AFTER_COMMIT, "an insert that failed"),
    "failure-swallowed": (accept("try:", "    await store()", "except Exception:", "    pass", "await acknowledge()"),
                          exercise.ACK_AFTER_COMMIT, "an insert that failed"),
    "stored-twice": (accept("await store()", "await store()", "await acknowledge()"), exercise.STORED_ONCE,
                     "committed 2 times"),
    "never-acknowledged": (accept("await store()"), exercise.ANSWERED_ONCE, "accept returned without it"),
    "acknowledge-not-awaited": (accept("await store()", "acknowledge()"), exercise.ANSWERED_ONCE,
                                "called but never awaited"),
    "waits-for-ever": (WAITS_FOR_EVER, exercise.ANSWERED_ONCE, "still waiting at line 7"),
    "acknowledged-twice": (accept("await store()", "await acknowledge()", "await acknowledge()"),
                           exercise.ANSWERED_ONCE, "called 2 times"),
}
# Right, and spelt differently from the reference: the store awaited through a task, gather, a TaskGroup,
# wait_for without a timeout, shield or an event; acknowledge passed on to a task, gathered, shielded or
# called through a helper; a store polled until done; a timeout that gives up with an error (a 500, no 202).
RIGHT = {
    "reference": exercise.REFERENCE,
    "stored-first": accept("stored = await store()", "await acknowledge()"),
    "only-if-stored": accept("stored = False", "try:", "    await store()", "    stored = True", "finally:",
                             "    if stored:", "        await acknowledge()"),
    "awaits-its-task": accept("insert = asyncio.create_task(store())", "await insert", "await acknowledge()"),
    "gathered": accept("await asyncio.gather(store())", "await acknowledge()"),
    "task-group": accept("async with asyncio.TaskGroup() as group:", "    group.create_task(store())",
                         "await acknowledge()"),
    "wait-for-without-timeout": accept("await asyncio.wait_for(store(), None)", "await acknowledge()"),
    "shielded": accept("await asyncio.shield(store())", "await acknowledge()"),
    "gives-up-with-an-error": accept("await asyncio.wait_for(store(), 2)", "await acknowledge()"),
    "event-set-by-a-task": accept("stored = asyncio.Event()", "async def insert():", "    await store()",
                                  "    stored.set()", "task = asyncio.create_task(insert())", "await stored.wait()",
                                  "await acknowledge()", "await task"),
    "acknowledged-in-a-task": accept("await store()", "asyncio.create_task(acknowledge())"),
    "acknowledged-in-an-awaited-task": accept("await store()", "await asyncio.create_task(acknowledge())"),
    "acknowledged-gathered": accept("await store()", "await asyncio.gather(acknowledge())"),
    "acknowledged-shielded": accept("await store()", "await asyncio.shield(acknowledge())"),
    "through-a-helper": accept("async def answer():", "    await acknowledge()", "await store()", "await answer()"),
    "both-in-a-task": accept("async def both():", "    await store()", "    await acknowledge()",
                             "await asyncio.create_task(both())"),
    "polls-until-done": accept("insert = asyncio.create_task(store())", "while not insert.done():",
                               "    await asyncio.sleep(0.01)", "insert.result()", "await acknowledge()"),
    "yields-until-done": accept("insert = asyncio.create_task(store())", "while not insert.done():",
                                "    await asyncio.sleep(0)", "insert.result()", "await acknowledge()"),
}


def broken(text: str) -> list[Check]:
    """The forced schedules' checks `text` breaks."""
    return [c for c in asyncio.run(exercise.direct(exercise.load(text), seed=1)) if not c.held]


def accept_body(text: str) -> str:
    """accept's statements, without its docstring and comments, as the AST reads them."""
    function = ast.parse(text).body[-1]
    return ast.dump(ast.Module([s for s in function.body if not isinstance(s, ast.Expr) or not isinstance(
        s.value, ast.Constant)], []))


def test_the_starter_and_the_reference_are_the_apis_own_orders():
    """The starter is what the API runs with commit_before_ack off, the reference what it runs with it on."""
    import inspect
    assert accept_body(exercise.STARTER) == accept_body(inspect.getsource(acknowledgement.acknowledge_then_store))
    assert accept_body(exercise.REFERENCE) == accept_body(inspect.getsource(acknowledgement.store_then_acknowledge))


@pytest.mark.parametrize("text", RIGHT.values(), ids=RIGHT)
def test_right_answers_spelt_differently_pass_the_forced_schedules(text):
    assert broken(text) == []


@pytest.mark.parametrize("text, invariant, said", WRONG.values(), ids=WRONG)
def test_wrong_answers_break_first_the_invariant_they_miss_saying_what_they_did(text, invariant, said):
    first = broken(text)[0]
    assert first.name == invariant and said in str(first.violations), first.violations


def test_an_acknowledgement_never_awaited_is_said_as_no_answer_not_a_runtime_warning():
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        [answered] = broken(accept("await store()", "acknowledge()"))
        gc.collect()
    assert not [warning for warning in warned if "never awaited" in str(warning.message)]
    assert answered.violations == [{"acknowledge()": "called but never awaited: a coroutine nobody runs, so no 202 "
                                                     "is ever sent"}]


def test_a_store_never_awaited_is_said_as_a_lost_job_not_a_runtime_warning():
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        [early, stored] = broken(NOT_AWAITED)
        gc.collect()
    assert not [warning for warning in warned if "never awaited" in str(warning.message)]
    assert stored.violations == [{"store()": "called but never awaited: a coroutine nobody runs, so its insert never "
                                             "happens, so the acknowledged job is lost"}]


def test_a_timeout_is_seen_firing_on_the_checks_clock_long_before_the_held_store_lets_go():
    """The store is held until 60 s on the check's clock: a 30 s timeout fires first, in no real time."""
    began = time.monotonic()
    facts = asyncio.run(exercise.trial(exercise.load(TIMEOUT_THEN_ACKNOWLEDGE).submission_order, "slow"))
    assert time.monotonic() - began < exercise.TRIAL_REAL_SECONDS / 5
    [early] = facts.early
    assert early["acknowledged"].startswith("at 30.0") and early["store()"].startswith("cancelled before its insert")


def test_accept_that_never_acknowledges_is_said_within_the_deadline_with_the_line_it_waited_at():
    [answered] = broken(WAITS_FOR_EVER)
    assert answered.violations == [{"acknowledge()": "never called: accept was still waiting at line 7 120 s later "
                                                     "on the check's clock, its store long committed"}]


@pytest.mark.slow
def test_verdicts_are_the_same_every_time_beside_two_cpu_burning_processes():
    """Every moment of a trial is on the check's clock, so the machine's load changes no verdict."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for text in (exercise.REFERENCE, RIGHT["task-group"], POLLS_WITH_A_DEADLINE, TIMEOUT_THEN_ACKNOWLEDGE):
            verdicts = {repr([(c.name, c.violations) for c in broken(text)]) for _ in range(10)}
            assert len(verdicts) == 1, verdicts
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.parametrize("text, said", [
    (SIGNATURE + "    await store(\n", "commit_before_ack.py, line 6: '(' was never closed"),
    (accept("await store()", "1 / 0"), "commit_before_ack.py, line 7: ZeroDivisionError: division by zero"),
    (accept("while True: pass"), "line 6: still running after 1 s (a loop that never ends?)"),
    (accept("async def spin():", "    while True:", "        pass", "asyncio.create_task(spin())", "await store()",
            "await acknowledge()"), "still running after 5 s (a loop that never ends?)"),
    ("def accept(store, acknowledge):\n    pass\n", "define accept with `async def`"),
    ("async def accept(store):\n    await store()\n", "accept() takes 1 positional argument but 2 were given"),
    ("async def store_then_ack(store, acknowledge):\n    pass\n", "define a function named accept"),
], ids=["syntax", "exception", "endless-loop", "endless-loop-in-a-task", "not-async", "one-argument", "misnamed"])
@pytest.mark.slow
def test_broken_code_is_said_at_the_learners_line_without_a_traceback(text, said):
    with pytest.raises(LearnerError) as raised:
        broken(text)
    assert said in str(raised.value) and "Traceback" not in str(raised.value)


BROKEN_IN_THE_API = [
    (accept("raise ValueError('no')"), "failed before it was acknowledged: LearnerError"),
    (accept("await store()"), "not acknowledged: the API's order ended without answering"),
    (WAITS_FOR_EVER, "failed before it was acknowledged: Late"),
    (accept("while True: pass"), "failed before it was acknowledged: LearnerError"),
]


async def test_a_database_error_the_learners_accept_lets_through_stays_the_apis_to_answer():
    """A store that fails (a database that did not answer) under a right accept reaches the API as it was,
    for the API to answer 503 "may be stored", not as a mistake at the learner's line (a 500 blaming
    their await); their own code's exception is still theirs."""
    def failing_store():
        async def store():
            raise db.NoAnswer("no answer from the database within 3 s")
        return store

    async def acknowledge():
        pass

    right = exercise.load(exercise.REFERENCE).submission_order
    with pytest.raises(db.NoAnswer):
        await right(failing_store(), acknowledge)
    assert right.errors == []
    catching = exercise.load(accept("try:", "    await store()", "except Exception as error:",
                                    "    raise ValueError('mine') from error", "await acknowledge()")).submission_order
    with pytest.raises(LearnerError, match=r"commit_before_ack.py, line \d+: ValueError: mine"):
        await catching(failing_store(), acknowledge)


@pytest.mark.slow
async def test_the_api_answers_a_learners_broken_accept_with_a_json_500_not_a_hang(databases):
    """The API's own thread meets the learner's mistake (an exception, no answer, a wait or a loop that
    never ends): the client gets a JSON 500 within the deadline (shortened here), and the mistake is
    kept, at the learner's line, for the check to say."""
    for text, said in BROKEN_IN_THE_API:
        order = replace(exercise.load(text).submission_order, deadline_seconds=0.5)
        async with serve(api.create_api_app(databases.queue_url, order=order, kinds=STANDARD_KINDS)) as client:
            response = await client.post("/v1/jobs", json={"amount_cents": 1250})
        assert response.status_code == 500 and said in response.json()["error"], (text, response.text)
        assert all(str(error).startswith("commit_before_ack.py, line ") for error in order.errors)


@pytest.mark.slow
async def test_the_reference_passes_the_forced_schedules_the_scenario_and_chaos():
    result = await check(exercise.EXERCISE, exercise.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 02's scenario (seed 1)", "chaos seed 1"]


@pytest.mark.parametrize("text, lost", [(exercise.STARTER, True), (RIGHT["task-group"], False)],
                         ids=["starter", "task-group"])
async def test_the_stages_crash_after_job_1s_202_loses_it_only_with_the_202_sent_first(text, lost):
    """The stage's own demonstration, with accept in the real API (the forced schedules say the starter's
    mistake before this runs, in the check)."""
    held, run = await exercise.scenario(exercise.load(text), seed=1)
    assert held.held is not lost and (run.measurements["lost_jobs"] > 0) is lost
    assert held.violations[:1] == ([{"job": "job-1", "status": "LOST"}] if lost else [])


async def test_the_starter_is_told_its_mistake_in_the_forced_schedule_first():
    result = await check(exercise.EXERCISE, exercise.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert result.lines[0] == f"✗ Broken: {exercise.ACK_AFTER_COMMIT}"
    assert result.lines[1].startswith("  store slow, acknowledged at 0.0")
    assert result.lines[1].endswith("s on the check's clock, before the insert committed, store() not called yet")
    assert "Replay it: reliableq exercise check commit-before-ack --seed 1 --seeds 1" in result.text()


async def test_a_mistake_met_only_inside_the_api_is_said_at_the_learners_line():
    """This accept works for the forced schedules' three trials and raises after that, in the API's own
    thread: the submission is answered 500, and the check says the learner's exception, not the client's."""
    text = ("calls = 0\n\n\nasync def accept(store, acknowledge):\n    global calls\n    calls += 1\n"
            "    if calls > 3:\n        raise ValueError('only three')\n    await store()\n    await acknowledge()\n")
    result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == ["forced schedules"]
    assert result.lines == ["✗ Your code could not be used: commit_before_ack.py, line 8: ValueError: only three"]


async def test_a_mistake_met_only_under_chaos_is_said_at_the_learners_line():
    """This accept holds through the forced schedules and the stage, and raises once chaos has sent more
    submissions: the chaos run stops at the refused one, and the check names the line."""
    text = ("calls = 0\n\n\nasync def accept(store, acknowledge):\n    global calls\n    calls += 1\n"
            "    if calls > 30:\n        raise ValueError('too many')\n    await store()\n    await acknowledge()\n")
    result = await check(exercise.EXERCISE, text, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.checked == ["forced schedules", "stage 02's scenario (seed 1)"]
    assert result.lines == ["✗ Your code could not be used: commit_before_ack.py, line 8: ValueError: too many"]
