"""Exercise 11 (fairness) graded on real PostgreSQL: the reference passes the whole check; right answers
spelt differently hold in every forced schedule; the starter and the wrong answers a learner would
plausibly write fail on the first forced schedule that shows their mistake (`direct` alone, about a
second each): no turn, a random turn, one job per tenant, a tenant's jobs before the next tenant's first,
the lock dropped or waited for, lapsed leases forgotten, the tenants found by reading the backlog."""

from __future__ import annotations

import pytest

from reliableq.lab.exercises import fairness
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.fairness import REFERENCE

PLACE = "(position - turn.number %% tenants + tenants) %% tenants AS place"
PICK_LOCK = """        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS pick"""
LAPSED = REFERENCE[REFERENCE.index("), lapsed AS (\n"):REFERENCE.index("), spare AS (\n")]
CANDIDATES = """        SELECT id, status, lease_token, 0 AS nth, 0 AS place FROM lapsed
        UNION ALL
"""
WAITING = """    SELECT tenant FROM tenant_steps WHERE tenant IS NOT NULL
"""

# Right, and spelt differently: the remainder with mod(); the round jumping by the claim's size; the
# weaker lock that still excludes other claimers.
WITH_MOD = REFERENCE.replace(PLACE, "mod(mod(position - turn.number, tenants) + tenants, tenants) AS place")
JUMP_BY_CLAIM = REFERENCE.replace(PLACE, "mod(mod(position - turn.number * %(limit)s, tenants) + tenants, tenants) "
                                         "AS place")
NO_KEY_LOCK = REFERENCE.replace("FOR UPDATE SKIP LOCKED", "FOR NO KEY UPDATE SKIP LOCKED")

# Every round starts at the first tenant by name: with claims of one, only tenant-a is ever served.
NO_TURN = REFERENCE.replace(PLACE, "position AS place")
# A random start: fair on average, with no bound on any one tenant's wait.
RANDOM_TURN = REFERENCE.replace(PLACE, "mod(position + floor(random() * tenants)::bigint, tenants) AS place")
SPARE = REFERENCE[REFERENCE.index("), spare AS (\n"):REFERENCE.index("), due AS (\n")]
SPARE_TAKEN = "        UNION ALL\n        SELECT id, status, lease_token, %(limit)s + 1 AS nth, 0 AS place FROM spare\n"
# One job per served tenant, then the oldest due jobs of anyone in the slots left: every tenant still gets
# its first before anyone's second; the rest go first in, first out.
ONE_EACH_THEN_OLDEST = REFERENCE.replace(PICK_LOCK, PICK_LOCK.replace("%(limit)s", "1"))
# One job per served tenant, and nothing in the slots left: a lone tenant's claim of four takes one.
ONE_EACH = ONE_EACH_THEN_OLDEST.replace(SPARE, "").replace(SPARE_TAKEN, "")
# The spare read with a lock claimers share: it takes a job another claim has read, and waits for it.
SHARED_SPARE = REFERENCE.replace(SPARE, SPARE.replace("FOR UPDATE SKIP LOCKED", "FOR SHARE SKIP LOCKED"))
# The spare without the jobs the round offered: it hands the claim a job it already took.
SPARE_AGAIN = REFERENCE.replace("      AND id NOT IN (SELECT id FROM offered)\n", "")
# No spare: a claim whose round serves only a tenant whose jobs racing claims hold comes back empty.
NO_SPARE = REFERENCE.replace(SPARE, "").replace(SPARE_TAKEN, "")
# Each tenant's jobs before the next tenant's first.
TENANT_BY_TENANT = REFERENCE.replace("ORDER BY nth, place", "ORDER BY place, nth")
NO_LOCK = REFERENCE.replace(PICK_LOCK, PICK_LOCK.replace("\n        FOR UPDATE SKIP LOCKED", ""))
WAITS = REFERENCE.replace(PICK_LOCK, PICK_LOCK.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE"))
NO_LAPSED = REFERENCE.replace(LAPSED, "").replace(CANDIDATES, "").replace(
    "(SELECT id FROM lapsed UNION ALL SELECT id FROM offered)", "(SELECT id FROM offered)")
# The tenants found by reading every due job: right in every round, and a scan of the backlog per claim.
DISTINCT_SCAN = REFERENCE.replace(WAITING, "    SELECT DISTINCT tenant FROM jobs WHERE status = 'PENDING'\n"
                                           "      AND run_at <= coalesce(%(now)s::timestamptz, now())\n")


def test_the_starter_and_reference_come_from_the_shipped_claims():
    """The reference is the shipped fair claim; the starter keeps its given part (the tenants waiting, the
    turn) above the first-in-first-out claim's `due`, the place marked."""
    assert REFERENCE.count("-- name: job_claim_due_fair") == 1 and "lined_up" in REFERENCE
    assert fairness.MARK in fairness.STARTER and "lined_up" not in fairness.STARTER
    assert fairness.STARTER.count(fairness.GIVEN.strip()) == 3
    assert "ORDER BY run_at, id\n    LIMIT %(limit)s\n    FOR UPDATE SKIP LOCKED\n), expired" in fairness.STARTER
    for text in (WITH_MOD, JUMP_BY_CLAIM, NO_KEY_LOCK, ONE_EACH_THEN_OLDEST, NO_SPARE, SHARED_SPARE, SPARE_AGAIN,
                 NO_TURN, RANDOM_TURN,
                 ONE_EACH, TENANT_BY_TENANT, NO_LOCK, WAITS, NO_LAPSED, DISTINCT_SCAN):
        assert text != REFERENCE


@pytest.mark.slow
async def test_the_reference_passes_the_whole_check():
    result = await check(fairness.EXERCISE, REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 11's scenario (seed 1)", "chaos seed 1"]


@pytest.mark.parametrize("right", [REFERENCE, WITH_MOD, JUMP_BY_CLAIM, NO_KEY_LOCK, ONE_EACH_THEN_OLDEST],
                         ids=["reference", "mod", "jump-by-claim-size", "no-key-lock", "one-each-then-oldest"])
async def test_right_answers_hold_in_every_forced_schedule(right):
    assert [c for c in await fairness.direct(fairness.load(right), seed=1) if not c.held] == []


HELD = "a claim fills the slots its round cannot (the served tenants' jobs held by racing claims)"
HELD_WHILE = "tenant-a's 2 jobs and tenant-c's 2 oldest were held, and tenant-b's 1 and tenant-c's other 6 free"
ROUND = "claims of 1 and 3 jobs over four tenants, tenant-a flooding: no tenant with due work waits longer"


@pytest.mark.parametrize("wrong, invariant, said", [
    (fairness.STARTER, ROUND, {"tenant": "tenant-b", "waited while": "5 jobs of others were claimed (up to claim 5 "
                               "(1 job each))", "tenants waiting": 4, "bound": "4 jobs (1 round)"}),
    (NO_TURN, ROUND, {"tenant": "tenant-b", "waited while": "5 jobs of others were claimed (up to claim 5 (1 job "
                      "each))", "tenants waiting": 4, "bound": "4 jobs (1 round)"}),
    (ONE_EACH, "a lone tenant gets every slot of a claim", {"jobs due": "6, all tenant-a's", "asked for": 4,
                                                            "took": 1}),
    (TENANT_BY_TENANT, "a claim gives every tenant with due work its oldest job before it gives any tenant a second",
     {"claim": "1 (3 jobs each)", "took": "3 of tenant-b's", "gave none to": "tenant-a, tenant-c, tenant-d"}),
    (NO_SPARE, HELD, {"claim": "1 (2 jobs each)", "took": "1 job", "while": HELD_WHILE}),
    (SHARED_SPARE, HELD, {"claim": "1 (2 jobs each)", "claimer B": "waited for the sharing claim"}),
    (SPARE_AGAIN, HELD, {"claim": "1 (2 jobs each)", "took": "1 job", "while": HELD_WHILE}),
    (NO_LOCK, "4 claims that read the due jobs at the same moment take different jobs", None),
    (WAITS, "4 claims that read the due jobs at the same moment neither wait for each other nor fail", None),
    (NO_LAPSED, "a claim takes the due jobs it is asked for", None),
    (DISTINCT_SCAN, "a claim reads a probe per tenant waiting and a few rows per job it takes", None),
], ids=["starter", "no-turn", "one-job-per-tenant", "tenant-by-tenant", "no-spare", "spare-shared-lock",
        "spare-takes-its-own-again", "no-lock", "lock-waited-for",
        "lapsed-leases-forgotten", "tenants-by-scan"])
async def test_plausible_wrong_answers_fail_on_the_first_forced_schedule_that_shows_them(wrong, invariant, said):
    checks = await fairness.direct(fairness.load(wrong), seed=1)
    first = next(c for c in checks if not c.held)
    assert first.name.startswith(invariant), first
    if said is not None:
        assert said in first.violations, first.violations


async def test_a_claim_that_reads_the_backlog_is_told_how_many_rows_it_read():
    """The count is the plan's own (a scan of the pending index, then the rows updated), so a claim that
    reads the backlog is told a number above it, and the reference one far below the allowance."""
    (scan,) = [c for c in await fairness.direct(fairness.load(DISTINCT_SCAN), seed=1) if not c.held]
    (row,) = scan.violations
    assert row["rows of jobs read"] > fairness.BACKLOG and row["allowed"].startswith(f"{fairness.READS_ALLOWED} "), row

async def test_a_random_turn_is_rejected_on_every_check():
    """Fair on average, unbounded for one tenant: 60 claims of one over four tenants give it a wait past one
    round with probability above 0.9999 (five misses in a row at 3/4 each, for any of four tenants), so the
    verdict does not depend on the draw. Five checks, five rejections."""
    for _ in range(5):
        checks = await fairness.direct(fairness.load(RANDOM_TURN), seed=1)
        assert next(c for c in checks if not c.held).name.startswith(ROUND)
