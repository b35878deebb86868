"""Exercise 03 (skip-locked) graded on real PostgreSQL: the reference passes the whole check, forced
schedules first; right answers spelt differently hold in every forced schedule; the wrong answers a
learner would plausibly write fail on the first forced schedule that shows their mistake (most tests call
`direct` alone: a second, not a whole check's 15). SQL PostgreSQL refuses is said with its message and
the line, before any system runs."""

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
# Locks claimers can share: two claims read the same rows, then one waits for the other's update.
SHARE_SKIP = skip_locked.REFERENCE.replace(LOCK, "FOR SHARE SKIP LOCKED")
KEY_SHARE_SKIP = skip_locked.REFERENCE.replace(LOCK, "FOR KEY SHARE SKIP LOCKED")
# Due without its time: a retry's backoff is ignored.
NO_RUN_AT = skip_locked.REFERENCE.replace("(status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now()))",
                                          "status = 'PENDING'")
# Any RUNNING job counts as due, its lease live or not.
ANY_RUNNING = skip_locked.REFERENCE.replace("""       OR (%(reclaim_expired)s AND status = 'RUNNING'
           AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
""", """       OR (%(reclaim_expired)s AND status = 'RUNNING'
""")
# Locks the due rows, then marks every PENDING row: the UPDATE re-selects by status, not by the locked ids.
BY_STATUS = skip_locked.REFERENCE.replace(
    "    FROM due\n    WHERE jobs.id = due.id\n",
    "    WHERE jobs.status = 'PENDING' AND jobs.run_at <= coalesce(%(now)s::timestamptz, now())\n")


def test_the_starter_and_reference_come_from_the_shipped_claim():
    """The reference is the shipped claim; the starter is it without its lock, the place marked."""
    assert skip_locked.shipped() in skip_locked.REFERENCE
    assert "FOR UPDATE" not in skip_locked.STARTER and skip_locked.MARK in skip_locked.STARTER
    assert skip_locked.STARTER.replace(skip_locked.MARK, LOCK) == skip_locked.REFERENCE
    for text in (NO_KEY_IN_SUBQUERY, FOR_UPDATE, NOWAIT, BY_STATUS, SHARE_SKIP, KEY_SHARE_SKIP, NO_RUN_AT, ANY_RUNNING):
        assert text != skip_locked.REFERENCE


@pytest.mark.slow
async def test_the_reference_passes_forced_schedules_first():
    """The one whole check of this file: the forced schedules run before the stage's scenario."""
    result = await check(skip_locked.EXERCISE, skip_locked.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked[:2] == ["forced schedules", "stage 03's scenario (seed 1)"]


@pytest.mark.parametrize("right", [skip_locked.REFERENCE, NO_KEY_IN_SUBQUERY], ids=["reference", "no-key-in-subquery"])
async def test_right_answers_hold_in_every_forced_schedule(right):
    checks = await skip_locked.direct(skip_locked.load(right), seed=1)
    assert [c for c in checks if not c.held] == []


SAME_MOMENT = "4 claims that read the due jobs at the same moment"
TAKEN_BY_ALL = {"job": "job-1", "A": 4, "claimed by": "claimer-A and claimer-B and claimer-C and claimer-D"}
SHARED_READ = "while claimer A has read two jobs with a lock claimers share"


@pytest.mark.parametrize("wrong, invariant, said", [
    (skip_locked.STARTER, f"{SAME_MOMENT} take different jobs", TAKEN_BY_ALL),
    (KEY_SHARE_SKIP, f"{SAME_MOMENT} take different jobs", TAKEN_BY_ALL),
    (SHARE_SKIP, f"{SAME_MOMENT} neither wait for each other nor fail", "waited for"),
    (FOR_UPDATE, f"{SAME_MOMENT} neither wait for each other nor fail", "waited for"),
    (NOWAIT, f"{SAME_MOMENT} neither wait for each other nor fail", "could not obtain lock on row"),
    (BY_STATUS, "a claim takes the due jobs it is asked for", "claim it: its lease ran out and an attempt is left"),
    (NO_RUN_AT, "a claim takes only due jobs", {"job": "job-2", "was": "PENDING, run_at an hour ahead",
                                                "with": "reclaim_expired on, enforce_budget on", "yours": "claimed it",
                                                "right": "leave it: its run_at is still ahead (a retry's backoff)"}),
    (ANY_RUNNING, "a claim takes only due jobs", "leave it: its lease is live: another worker is running it"),
], ids=["no-lock", "for-key-share-skip-locked", "for-share-skip-locked", "for-update-waits", "nowait-fails",
        "update-by-status", "ignores-run-at", "takes-live-leases"])
@pytest.mark.slow
async def test_plausible_wrong_answers_fail_on_the_first_forced_schedule_that_shows_them(wrong, invariant, said):
    """The first broken check is the one the checker shows: it names the mistake in its schedule."""
    checks = await skip_locked.direct(skip_locked.load(wrong), seed=1)
    if wrong == SHARE_SKIP:
        # The same-moment schedule holds each claim at its first update, after that update has locked its
        # rows: a FOR SHARE read that comes later skips them, so whether the four meet there is timing. The
        # schedule built for a shared lock always shows it; the checker's verdict is the same either way.
        shared = next(c for c in checks if c.name.startswith(SHARED_READ))
        assert not shared.held and "took jobs claimer A had read" in str(shared.violations), shared
        checks = [c for c in checks if not c.name.startswith(SAME_MOMENT)]
        invariant, said = SHARED_READ, "took jobs claimer A had read"
    first = next(c for c in checks if not c.held)
    assert first.name.startswith(invariant), first
    if isinstance(said, dict):
        assert said in first.violations, first.violations
    else:
        assert said in str(first.violations), first.violations


async def test_a_claim_that_waits_for_a_held_transaction_is_named_in_that_schedule_too():
    """The held-transaction schedule on its own: B meets the jobs A's open transaction holds."""
    checks = await skip_locked.direct(skip_locked.load(FOR_UPDATE), seed=1)
    held = next(c for c in checks if c.name.startswith("while claimer A's claim holds two jobs"))
    assert {"claimer B": "waited for claimer A's lock"} in held.violations


EXPIRED = ("    WHERE due.status = 'RUNNING' AND a.lease_token = due.lease_token\n"
           "      AND (a.outcome IS NULL OR a.outcome = 'lost_renew')\n")


def _expired(old: str, new: str) -> str:
    """The reference with its `expired` condition edited."""
    return skip_locked.REFERENCE.replace(EXPIRED, EXPIRED.replace(old, new))
# Wrong answers the mutation score found (reliableq exercise mutants skip-locked), each a fast forced schedule.
MUTANTS_FOUND = {
    # The schedule the shared-lock class meets every time, whatever PostgreSQL's plan: A has read with a
    # lock claimers share and not yet written; the same-moment schedule meets it only when both reads win
    # the race (the leases claim's plan reads `due` a row at a time and lost it 2 runs in 3).
    "for-share-skip-locked-held": (SHARE_SKIP, "while claimer A has read two jobs with a lock claimers share",
                                   "took jobs claimer A had read, then waited for claimer A"),
    "for-key-share-skip-locked-held": (KEY_SHARE_SKIP, "while claimer A has read two jobs with a lock claimers share",
                                       "took jobs claimer A had read, then waited for claimer A"),
    "taken-over-claim-left-open": (_expired("a.outcome IS NULL OR ", ""),
                                   "the claim a reclaim takes over is closed as expired", "'left open'"),
    "lost-renew-left-unclosed": (_expired(" OR a.outcome = 'lost_renew'", ""),
                                 "the claim a reclaim takes over is closed as expired", "'lost_renew'"),
    "closes-by-token-order": (_expired("a.lease_token = due", "a.lease_token < due"),
                              "a claim closes no claim but the ones it takes over", "lease live for an hour more"),
    "closes-every-open-claim": (_expired(" AND a.lease_token = due.lease_token", ""),
                                "a claim closes no claim but the ones it takes over", "became expired"),
    "lease-from-the-limit": (skip_locked.REFERENCE.replace("make_interval(secs => %(lease_seconds)s::float8)",
                                                           "make_interval(secs => %(limit)s::float8)"),
                             "a claim leaves each job it takes RUNNING for its worker", "lease expires 18 s"),
    "worker-id-from-a-switch": (skip_locked.REFERENCE.replace("worker_id = %(worker_id)s",
                                                              "worker_id = %(enforce_budget)s"),
                                "a claim leaves each job it takes RUNNING for its worker", "worker_id 'true'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("wrong, invariant, said", MUTANTS_FOUND.values(), ids=MUTANTS_FOUND.keys())
async def test_wrong_answers_the_mutation_score_found_are_named_in_a_forced_schedule(wrong, invariant, said):
    assert wrong != skip_locked.REFERENCE
    checks = await skip_locked.direct(skip_locked.load(wrong), seed=1)
    broken = [c for c in checks if not c.held]
    named = next((c for c in broken if c.name.startswith(invariant)), None)
    assert named is not None, broken
    assert said in str(named.violations), named.violations


async def test_sql_postgresql_refuses_is_said_with_its_message_and_line():
    broken = skip_locked.REFERENCE.replace(LOCK, "FOR UPDATE SKIP")
    with pytest.raises(LearnerError) as raised:
        await skip_locked.try_claim(skip_locked.load(broken), skip_locked.FILENAME)
    assert str(raised.value) == ("skip_locked.sql, query job_claim_due_skip_locked, at `), expired AS (`: "
                                 "syntax error at or near \")\"")


async def test_sql_postgresql_refuses_only_with_the_checks_own_parameters_is_a_verdict_not_a_traceback():
    """The one try of the claim (limit 1) passes; a forced schedule's claim of 2 divides by zero. The check
    fails at that step with PostgreSQL's message, as a learner's other mistakes do."""
    text = skip_locked.REFERENCE.replace("LIMIT %(limit)s", "LIMIT greatest(%(limit)s / (%(limit)s - 2), 1)")
    result = await check(skip_locked.EXERCISE, text, seeds=0)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0] == ("✗ PostgreSQL refused a statement during forced schedules (your SQL runs there): "
                               "division by zero [22012]")
