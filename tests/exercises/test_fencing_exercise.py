"""Exercise 05 (fencing) graded on real PostgreSQL: right answers spelt differently hold in every forced
schedule (the reference's whole check is tests/exercises/test_exercise_panel.py's, through the panel); the
starter's whole check fails first on the same worker reclaiming its job; the wrong answers a learner would
plausibly write fail on the first forced schedule that shows their mistake (`direct` alone, a few seconds
each). SQL PostgreSQL refuses is said with its message and the line, before any system runs."""

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


NOT_DISTINCT = fencing.REFERENCE.replace("lease_token = %(lease_token)s)",
                                         "lease_token IS NOT DISTINCT FROM %(lease_token)s)")
# Right: the group's rows locked FOR NO KEY UPDATE (it excludes itself, so groups still wait in id order),
# and who won told by a join rather than EXISTS.
NO_KEY_LOCK_AND_JOIN = (fencing.REFERENCE.replace("ORDER BY id FOR UPDATE", "ORDER BY id FOR NO KEY UPDATE")
                        .replace("""    SELECT owned.position, owned.lease_token,
           EXISTS (SELECT 1 FROM finalized f
                   WHERE f.id = owned.job_id AND f.lease_token = owned.lease_token) AS won
    FROM owned""", """    SELECT owned.position, owned.lease_token, f.id IS NOT NULL AS won
    FROM owned LEFT JOIN finalized f ON f.id = owned.job_id AND f.lease_token = owned.lease_token"""))
OWNER = "(status = 'RUNNING' AND lease_token = %(lease_token)s)"
GROUP_OWNER = "(jobs.status = 'RUNNING' AND jobs.lease_token = owned.lease_token)"


def fenced_by(owner: str, group_owner: str, win_per_claim: bool = True) -> str:
    """The reference with another owner condition in the four WHEREs (and job_succeed's group)."""
    text = fencing.REFERENCE.replace(OWNER, owner).replace(GROUP_OWNER, group_owner)
    return text if win_per_claim else text.replace(" AND f.lease_token = owned.lease_token", "")


# The owner named by its worker: the same worker's reclaim looks like the old claim.
BY_WORKER = fenced_by("(status = 'RUNNING' AND worker_id = (SELECT worker_id FROM job_attempts "
                      "WHERE lease_token = %(lease_token)s))",
                      "(jobs.status = 'RUNNING' AND jobs.worker_id = (SELECT worker_id FROM job_attempts a "
                      "WHERE a.lease_token = owned.lease_token))", win_per_claim=False)
STATUS_ONLY = fenced_by("status = 'RUNNING'", "jobs.status = 'RUNNING'", win_per_claim=False)
# A live lease instead of the token: a reclaim's new lease is live too.
LEASE_LIVE = fenced_by("(status = 'RUNNING' AND lease_expires_at > now())",
                       "(jobs.status = 'RUNNING' AND jobs.lease_expires_at > now())", win_per_claim=False)
# The token checked in a subquery over the statement's snapshot: a write that waited for the reclaim's row
# lock joins the new row to the old one it read, instead of re-checking the token on the row.
SNAPSHOT = fenced_by("id IN (SELECT id FROM jobs WHERE status = 'RUNNING' AND lease_token = %(lease_token)s)",
                     "jobs.id IN (SELECT j.id FROM jobs j WHERE j.status = 'RUNNING' "
                     "AND j.lease_token = owned.lease_token)")
# Fenced so hard that nobody wins, the current owner included.
NEVER = fenced_by("false", "false")


def test_the_starter_and_reference_come_from_the_shipped_queries():
    """No `%(fenced)s` switch is left in either; the starter marks where the condition goes."""
    assert "fenced" not in fencing.STARTER and "fenced" not in fencing.REFERENCE
    assert fencing.STARTER.count(fencing.MARK) == len(fencing.QUERIES)
    for text in (TOKEN_ONLY, WIN_PER_JOB, NOT_DISTINCT, BY_WORKER, STATUS_ONLY, LEASE_LIVE, SNAPSHOT, NEVER):
        assert text != fencing.REFERENCE


async def test_the_starter_fails_first_on_the_same_worker_reclaiming_its_job():
    """The one whole check of this file (the reference's is the panel test's): the forced schedules run
    first, so the learner reads their mistake in the schedule that shows it, not the stage's F=2."""
    result = await check(fencing.EXERCISE, fencing.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[:2] == [
        "✗ Broken: after the same worker reclaimed a job, its old claim's renew, succeed, retry and dead each lose "
        "and change nothing",
        "  job job-1, reclaimed by the same worker (worker-1), your renew for the old claim won, and changed the job"]


@pytest.mark.parametrize("right", [fencing.REFERENCE, TOKEN_ONLY, NOT_DISTINCT, NO_KEY_LOCK_AND_JOIN],
                         ids=["reference", "token-without-status", "is-not-distinct-from", "no-key-lock-and-join"])
async def test_right_answers_hold_in_every_forced_schedule(right):
    assert [c for c in await fencing.direct(fencing.load(right), seed=1) if not c.held] == []


AFTER_RECLAIM = "after the same worker reclaimed a job"
OLD = {"reclaimed by": "the same worker (worker-1)"}


@pytest.mark.parametrize("wrong, invariant, said", [
    (SUCCEED_ONLY, AFTER_RECLAIM, OLD | {"job": "job-5", "your retry for the old claim": "won, and the job went "
                                                                                        "RUNNING -> PENDING"}),
    (BY_WORKER, AFTER_RECLAIM, OLD | {"job": "job-3", "your succeed for the old claim": "won, and the job went "
                                                                                       "RUNNING -> SUCCEEDED"}),
    (STATUS_ONLY, AFTER_RECLAIM, OLD | {"job": "job-7", "your dead for the old claim": "won, and the job went "
                                                                                      "RUNNING -> DEAD"}),
    (LEASE_LIVE, AFTER_RECLAIM, OLD | {"job": "job-3", "your succeed for the old claim": "won, and the job went "
                                                                                        "RUNNING -> SUCCEEDED"}),
    (WIN_PER_JOB, "in one grouped success", {"job": "job-11", "group": "old claim first",
                                             "old claim's token": "below the current one", "old claim won": True,
                                             "current claim won": True}),
    (SNAPSHOT, "an old claim's write that waited for a reclaim still in progress",
     OLD | {"job": "job-17", "your retry for the old claim": "won, and the job went RUNNING -> PENDING"}),
    (NEVER, "the current claim's renew, succeed, retry and dead win",
     {"job": "job-3", "your succeed for the current claim": "lost"}),
], ids=["succeed-only", "by-worker-id", "status-only", "live-lease-not-token", "win-per-job",
        "token-read-from-the-snapshot", "fences-everyone"])
async def test_plausible_wrong_answers_fail_on_the_first_forced_schedule_that_shows_them(wrong, invariant, said):
    checks = await fencing.direct(fencing.load(wrong), seed=1)
    first = next(c for c in checks if not c.held)
    assert first.name.startswith(invariant), first
    assert said in first.violations, first.violations


RETRY = SHIPPED["job_retry"]
# Wrong answers the mutation score found (reliableq exercise mutants fencing), each named in a forced schedule.
MUTANTS_FOUND = {
    # The token compared by order: a stale token below or above the current one (both are forced) wins.
    "token-compared-by-order": (fencing.REFERENCE.replace("AND lease_token = %(lease_token)s)",
                                                          "AND lease_token <= %(lease_token)s)"),
                                AFTER_RECLAIM, "won"),
    # Who won a group told by comparing tokens by order: the old claim wins when its token is above the
    # current one's (random tokens made that a coin toss until both orders were forced).
    "group-win-told-by-token-order": (fencing.REFERENCE.replace("f.lease_token = owned.lease_token",
                                                                "f.lease_token <= owned.lease_token"),
                                      "in one grouped success holding a job's old and current claim",
                                      "'above it', 'old claim won': True"),
    # A renew that revives a lease that ran out (nobody reclaimed it yet).
    "renew-revives-a-run-out-lease": (fencing.REFERENCE.replace("AND lease_expires_at > clock_timestamp()", ""),
                                      "an owner's renew after its lease ran out", "ran out an hour ago"),
    # retry's record written for every claim: another worker's claim on record becomes lost_retry.
    "retry-records-every-claim": (fencing.REFERENCE.replace(
        "    WHERE lease_token = %(lease_token)s AND outcome IS DISTINCT FROM 'succeeded'",
        "    WHERE outcome IS DISTINCT FROM 'succeeded'", 1),
        "an owner's write changes only its own job", "another worker's job or its claim on record"),
    # last_error from the wrong parameter.
    "retry-error-from-the-token": (fencing.REFERENCE.replace("last_error = %(error)s",
                                                             "last_error = %(lease_token)s", 1),
                                   "each claim's record says what its write did", "the job's last_error"),
    # The group's rows locked with SKIP LOCKED: the owner's succeed passes over its own job while its renew
    # holds the row.
    "succeed-skips-its-own-job": (fencing.REFERENCE.replace("ORDER BY id FOR UPDATE",
                                                            "ORDER BY id FOR UPDATE SKIP LOCKED"),
                                  "the current claim's succeed, issued while its own renew holds",
                                  "'your succeed for the current claim': 'lost'"),
    # The group's rows locked with a lock two groups may share: each takes the other's row, then waits to
    # update its own.
    "groups-share-their-locks": (fencing.REFERENCE.replace("ORDER BY id FOR UPDATE", "ORDER BY id FOR SHARE"),
                                 "two success groups sharing jobs", "deadlock detected"),
    # Every job locked, not only the group's: another job's success waits for the group.
    "group-locks-every-job": (fencing.REFERENCE.replace("SELECT id FROM jobs WHERE id IN (SELECT job_id FROM owned) "
                                                        "ORDER BY id FOR UPDATE",
                                                        "SELECT id FROM jobs ORDER BY id FOR UPDATE"),
                              "a success group in flight holds only the jobs it names", "waited for"),
}


@pytest.mark.slow
@pytest.mark.parametrize("wrong, invariant, said", MUTANTS_FOUND.values(), ids=MUTANTS_FOUND.keys())
async def test_wrong_answers_the_mutation_score_found_are_named_in_a_forced_schedule(wrong, invariant, said):
    assert wrong != fencing.REFERENCE
    checks = await fencing.direct(fencing.load(wrong), seed=1)
    broken = [c for c in checks if not c.held]
    named = next((c for c in broken if c.name.startswith(invariant)), None)
    assert named is not None, broken
    assert said in str(named.violations), named.violations


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
