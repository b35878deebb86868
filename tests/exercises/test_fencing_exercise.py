"""Exercise 05 (fencing) graded by the real checker on real PostgreSQL: a right answer spelt differently
passes (the reference's whole check is tests/exercises/test_exercise_panel.py's, through the panel), the
starter fails on the stage's paused worker (F=2), and the wrong answers a learner would plausibly write
fail on the invariant each breaks. SQL PostgreSQL refuses is said with its message and the line, before
any system runs."""

from __future__ import annotations

import pytest

from reliableq.lab.exercises import fencing
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

SHIPPED = {name: fencing._shipped(name) for name in fencing.QUERIES}
# The token checked where the lesson shows it (succeed), forgotten on retry, dead and renew.
SUCCEED_ONLY = fencing._file({name: (fencing._fenced if name == "job_succeed" else fencing._unfenced)(text)
                              for name, text in SHIPPED.items()})
# Every WHERE fenced, but job_succeed says a claim won when its job was finalized by anyone in the group.
WIN_PER_JOB = fencing.REFERENCE.replace(" AND f.lease_token = owned.lease_token", "")
# Right, and spelt differently: the token alone (a reclaim always replaces it), no status.
TOKEN_ONLY = (fencing.REFERENCE.replace("(status = 'RUNNING' AND lease_token = %(lease_token)s)",
                                        "lease_token = %(lease_token)s")
              .replace("(jobs.status = 'RUNNING' AND jobs.lease_token = owned.lease_token)",
                       "jobs.lease_token = owned.lease_token"))


def test_the_starter_and_reference_come_from_the_shipped_queries():
    """No `%(fenced)s` switch is left in either; the starter marks where the condition goes."""
    assert "fenced" not in fencing.STARTER and "fenced" not in fencing.REFERENCE
    assert fencing.STARTER.count(fencing.MARK) == len(fencing.QUERIES)
    assert TOKEN_ONLY != fencing.REFERENCE and WIN_PER_JOB != fencing.REFERENCE


async def test_the_token_without_the_status_passes_too():
    result = await check(fencing.EXERCISE, TOKEN_ONLY, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()


async def test_the_starter_fails_with_the_stages_double_finalize():
    result = await check(fencing.EXERCISE, fencing.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 05's paused worker")
    assert "job job-1, finalized 2" in result.text()


@pytest.mark.parametrize("wrong", [SUCCEED_ONLY, WIN_PER_JOB], ids=["succeed-only", "win-per-job"])
async def test_plausible_wrong_answers_fail_on_the_forced_interleaving_they_miss(wrong):
    """Three chaos seeds let the per-job win through (a false accept, before the forced group); the
    direct checks force both interleavings every time."""
    result = await check(fencing.EXERCISE, wrong, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED, result.text()
    invariant = "stale owner's renew" if wrong is SUCCEED_ONLY else "only the current claim wins"
    assert invariant in result.lines[0]


async def test_sql_postgresql_refuses_is_said_with_its_message_and_line():
    broken = fencing.REFERENCE.replace("AND lease_token = %(lease_token)s)", "AND lease_token = )", 1)
    with pytest.raises(LearnerError) as raised:
        await fencing.try_queries(fencing.load(broken))
    assert str(raised.value) == ("fencing.sql, query job_renew_lease, at `AND (status = 'RUNNING' AND "
                                 "lease_token = )`: syntax error at or near \")\"")


def test_a_file_without_one_of_the_queries_is_refused():
    text = fencing.REFERENCE.replace("-- name: job_dead", "-- name: job_deadd")
    with pytest.raises(LearnerError, match="no query named job_dead"):
        fencing.load(text)
