"""Exercise 03 (skip-locked) graded by the real checker on real PostgreSQL: the reference and a right answer
spelt differently pass, the starter fails with each job claimed twice (A=2), and the wrong answers a
learner would plausibly write fail on the invariant each breaks, in the race the check forces one step
at a time. SQL PostgreSQL refuses is said with its message and the line, before any system runs."""

from __future__ import annotations

import pytest

from reliableq.lab.exercises import skip_locked
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError

LOCK = "FOR UPDATE SKIP LOCKED"
# Right, and spelt differently: a weaker row lock (still exclusive between claimers), and the UPDATE
# naming the locked rows by a subquery instead of a join.
NO_KEY_IN_SUBQUERY = (skip_locked.REFERENCE.replace(LOCK, "FOR NO KEY UPDATE SKIP LOCKED")
                      .replace("    FROM due\n    WHERE jobs.id = due.id\n",
                               "    WHERE jobs.id IN (SELECT id FROM due)\n"))
# Safe, but the second claimer waits for the first one's locks.
FOR_UPDATE = skip_locked.REFERENCE.replace(LOCK, "FOR UPDATE")
# Fails at once instead of skipping.
NOWAIT = skip_locked.REFERENCE.replace(LOCK, "FOR UPDATE NOWAIT")
# Locks the due rows, then marks every PENDING row: the UPDATE re-selects by status, not by the locked ids.
BY_STATUS = skip_locked.REFERENCE.replace(
    "    FROM due\n    WHERE jobs.id = due.id\n",
    "    WHERE jobs.status = 'PENDING' AND jobs.run_at <= coalesce(%(now)s::timestamptz, now())\n")


def test_the_starter_and_reference_come_from_the_shipped_claim():
    """The reference is the shipped claim; the starter is it without its lock, the place marked."""
    assert skip_locked.shipped() in skip_locked.REFERENCE
    assert "FOR UPDATE" not in skip_locked.STARTER and skip_locked.MARK in skip_locked.STARTER
    assert skip_locked.STARTER.replace(skip_locked.MARK, LOCK) == skip_locked.REFERENCE
    for text in (NO_KEY_IN_SUBQUERY, FOR_UPDATE, NOWAIT, BY_STATUS):
        assert text != skip_locked.REFERENCE


async def test_the_reference_passes():
    result = await check(skip_locked.EXERCISE, skip_locked.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()


async def test_a_weaker_lock_and_another_statement_shape_pass_too():
    result = await check(skip_locked.EXERCISE, NO_KEY_IN_SUBQUERY, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()


async def test_the_starter_fails_with_each_job_claimed_twice():
    """As the stage showed with skip_locked off: both workers take all four jobs."""
    result = await check(skip_locked.EXERCISE, skip_locked.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[:5] == ["✗ Broken: stage 03's two workers: each job is claimed by one worker (A=1) "
                                "[claims: worker-1 4, worker-2 4]", *(f"  job job-{n}, A 2" for n in range(1, 5))]


async def test_the_forced_race_shows_a_claim_without_a_lock_taking_a_held_job():
    checks = await skip_locked.direct(skip_locked.load(skip_locked.STARTER), seed=1)
    assert checks[0].violations == [{"job": f"job-{n}", "A": 2, "claimed by": "claimer-A and claimer-B"}
                                    for n in (1, 2)]


@pytest.mark.parametrize("wrong, invariant, said", [
    (FOR_UPDATE, "it neither waits for that claimer's lock nor fails", "claimer B waited for claimer A's lock"),
    (NOWAIT, "it neither waits for that claimer's lock nor fails", "claimer B failed: could not obtain lock on row"),
    (BY_STATUS, "a claim takes at most as many jobs as it asks for", "claimer A asked for 2, took job-1, job-2, job-3"),
], ids=["for-update-waits", "nowait-fails", "update-by-status"])
async def test_plausible_wrong_answers_fail_on_the_forced_race(wrong, invariant, said):
    result = await check(skip_locked.EXERCISE, wrong, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED, result.text()
    assert invariant in result.lines[0], result.text()
    assert said in result.text()


async def test_sql_postgresql_refuses_is_said_with_its_message_and_line():
    broken = skip_locked.REFERENCE.replace(LOCK, "FOR UPDATE SKIP")
    with pytest.raises(LearnerError) as raised:
        await skip_locked.try_claim(skip_locked.load(broken), skip_locked.FILENAME)
    assert str(raised.value) == ("skip_locked.sql, query job_claim_due_skip_locked, at `), expired AS (`: "
                                 "syntax error at or near \")\"")
