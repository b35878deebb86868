"""Exercise 10 (sync-standby) graded by the real checker on a real synchronous pair (the wheel's binaries, a
real SIGSTOP of the link, a real SIGKILL of the primary and `pg_ctl promote`): the reference and right
answers spelt differently pass; the wrong answers a learner would plausibly write fail on the forced
schedule that shows their mistake (a commit that returned while the standby was cut off, a retry
answered "replayed" for a job only the primary had, the acknowledged job missing after the failover);
SQL PostgreSQL refuses is said at the learner's line. Every mutant of the reference is rejected or
shown equivalent."""

from __future__ import annotations

import pytest

from reliableq import sql
from reliableq.lab.exercises import sync_standby
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.mutants import Fate, score

ANSWERED_AT_ONCE = [sync_standby.CUT, sync_standby.RETRY, sync_standby.KEPT]
WRONG = {
    "the starter (local)": (sync_standby.STARTER, ANSWERED_AT_ONCE),
    "off": (sync_standby._file("SET synchronous_commit = off;"), ANSWERED_AT_ONCE),
    # The server's setting, which the check's primary has as `local`: the guarantee left to configuration.
    "reset": (sync_standby._file("RESET synchronous_commit;"), ANSWERED_AT_ONCE),
    # In autocommit a SET LOCAL is its own transaction: it ends before any submission begins.
    "set local": (sync_standby._file("SET LOCAL synchronous_commit = on;"), ANSWERED_AT_ONCE),
    "set_config for the transaction": (
        sync_standby._file("SELECT set_config('synchronous_commit', 'on', true);"), ANSWERED_AT_ONCE),
    "sessions that cannot write": (
        sync_standby._file("SET synchronous_commit = on;\nSET default_transaction_read_only = on;"),
        [sync_standby.LIVE]),
}
RIGHT = {
    "remote_apply": sync_standby._file("SET synchronous_commit = remote_apply;"),
    "set_config for the session": sync_standby._file("SELECT set_config('synchronous_commit', 'on', false);"),
    "set session to": sync_standby._file("SET SESSION synchronous_commit TO 'on';"),
    # A statement timeout does not cancel a commit's wait for the standby (PostgreSQL disables it first).
    "with a statement timeout": sync_standby._file("SET synchronous_commit = on;\nSET statement_timeout = '1s';"),
}


def test_the_starter_and_the_reference_are_what_the_apis_sessions_run():
    queries = sql.queries("queue")
    assert sync_standby.STARTER.endswith(queries["session_commits_local"] + "\n")
    assert sync_standby.REFERENCE.endswith(queries["session_commits_wait_for_standby"] + "\n")


async def test_the_reference_passes_the_forced_schedules_the_scenario_and_chaos():
    result = await check(sync_standby.EXERCISE, sync_standby.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 10's scenario (seed 1)", "chaos seed 1"]


@pytest.mark.parametrize("text", RIGHT.values(), ids=RIGHT)
async def test_right_answers_spelt_differently_pass_the_forced_schedules(text):
    checks = await sync_standby.direct(sync_standby.load(text), 1)
    assert [c.name for c in checks if not c.held] == []
    assert [c.name for c in checks] == [sync_standby.LIVE, *ANSWERED_AT_ONCE]


@pytest.mark.parametrize("text, broken", WRONG.values(), ids=WRONG)
async def test_wrong_answers_fail_on_the_forced_schedule_that_shows_their_mistake(text, broken):
    checks = await sync_standby.direct(sync_standby.load(text), 1)
    assert [c.name for c in checks if not c.held] == broken
    if broken == ANSWERED_AT_ONCE:
        cut, retry, kept = (c.violations for c in checks[1:])
        assert cut == [{"submission": "order-2", "answered": "202", "its commit": "returned with the primary alone "
                        "(the standby could not have it: the link was cut)"}]
        assert retry[0]["answered"] == "202 replayed"
        # `off` does not even wait for the primary's own disk: order-1 may be lost with the primary too.
        assert {"submitted as": "order-2", "acknowledged": "202", "on the promoted server": "no: LOST"} in kept


async def test_a_whole_check_of_the_starter_stops_at_the_forced_schedules_with_the_replay_command():
    result = await check(sync_standby.EXERCISE, sync_standby.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    text = result.text()
    assert f"✗ Broken: {sync_standby.CUT}" in text and "submission order-2, answered 202" in text
    assert "Replay it: reliableq exercise check sync-standby --seed 1 --seeds 1" in text


@pytest.mark.parametrize("body, said", [
    ("SET synchronous_comit = on;", 'query api_session: unrecognized configuration parameter "synchronous_comit"'),
    ("SET synchronous_commit = always;",
     'query api_session: invalid value for parameter "synchronous_commit": "always"'),
])
async def test_sql_postgresql_refuses_is_said_at_the_learners_query_without_a_traceback(body, said):
    result = await check(sync_standby.EXERCISE, sync_standby._file(body), seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines == [f"✗ Your code could not be used: sync_standby.sql, {said}"]


async def test_a_file_without_its_named_query_is_refused_before_anything_runs():
    result = await check(sync_standby.EXERCISE, "SET synchronous_commit = on;\n", seed=1, seeds=1)
    assert result.lines == ["✗ Your code could not be used: sync_standby.sql: no query named api_session (each "
                            "starts with `-- name: <name>`)"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two minutes alone; each mutant starts real servers, which a busy machine slows
async def test_every_mutant_of_the_reference_is_rejected_or_shown_equivalent():
    """A level that does not wait, a SET that does not last (SET LOCAL, RESET) are rejected; remote_apply and
    remote_write are right for the primary's death (listed, and the differential run agrees)."""
    scored = await score(sync_standby.EXERCISE)
    assert not scored.baseline_failed
    fates = {judged.mutant.description.removeprefix("api_session: "): judged.fate for judged in scored.judged}
    assert fates == {"SET synchronous_commit -> SET LOCAL": Fate.REJECTED,
                     "SET synchronous_commit -> RESET": Fate.REJECTED,
                     "synchronous_commit on -> off": Fate.REJECTED,
                     "synchronous_commit on -> local": Fate.REJECTED,
                     "synchronous_commit on -> remote_write": Fate.EQUIVALENT,
                     "synchronous_commit on -> remote_apply": Fate.EQUIVALENT}
