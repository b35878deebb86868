"""Exercise 04 (leases) graded on real PostgreSQL, with exercise 03 run again as an earlier stage: the
reference passes the whole check; right answers on any clock hold in every forced schedule; the starter
and the wrong answers a learner would plausibly write fail on the first forced schedule that shows their
mistake (`direct` alone, a second each), and a dropped lock as a regression of exercise 03."""

from __future__ import annotations

import pytest

from reliableq.lab.exercises import leases, skip_locked
from reliableq.lab.exercises.checker import Outcome, check

EARLIER = [(skip_locked.EXERCISE, skip_locked.REFERENCE)]
RECLAIM = """       OR (status = 'RUNNING'
           AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
           AND (NOT %(enforce_budget)s OR attempts < max_attempts))
"""
EXPIRY = """lease_expires_at = coalesce(%(now)s::timestamptz, now())
                           + make_interval(secs => %(lease_seconds)s::float8),"""
EXPIRED_CLOSED = """), expired AS (
    UPDATE job_attempts AS a
    SET outcome = 'expired', finished_at = coalesce(%(now)s::timestamptz, now())
    FROM due
    WHERE due.status = 'RUNNING' AND a.lease_token = due.lease_token
      AND (a.outcome IS NULL OR a.outcome = 'lost_renew')
"""
# Right, and spelt differently: PostgreSQL's now() without the test clock, an interval product, `<`.
PLAIN_NOW = (leases.REFERENCE
             .replace(RECLAIM, "       OR (status = 'RUNNING' AND lease_expires_at < now()\n"
                               "           AND (NOT %(enforce_budget)s OR attempts < max_attempts))\n")
             .replace(EXPIRY, "lease_expires_at = now() + %(lease_seconds)s * interval '1 second',"))
# Right, and on the other clock: clock_timestamp() for the expiry and the reclaim.
CLOCK_TIMESTAMP = (leases.REFERENCE
                   .replace(RECLAIM, "       OR (status = 'RUNNING' AND lease_expires_at <= clock_timestamp()\n"
                                     "           AND (NOT %(enforce_budget)s OR attempts < max_attempts))\n")
                   .replace(EXPIRY, "lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),"))
# The reclaim without the attempt budget: a job out of attempts runs again.
NO_BUDGET = leases.REFERENCE.replace(RECLAIM, "       OR (status = 'RUNNING' AND lease_expires_at <= now())\n")
BUDGET_OFF_BY_ONE = leases.REFERENCE.replace("attempts < max_attempts", "attempts <= max_attempts")
# The budget enforced whatever the switch: with stage dead off, a job past it is stranded RUNNING.
BUDGET_ALWAYS = leases.REFERENCE.replace("(NOT %(enforce_budget)s OR attempts < max_attempts)",
                                         "attempts < max_attempts")
# The reclaim without the status: a finished (DEAD) job whose lease ran out comes back.
NO_STATUS = leases.REFERENCE.replace("       OR (status = 'RUNNING'\n           AND lease_expires_at",
                                     "       OR (lease_expires_at")
# A fixed lease, whatever %(lease_seconds)s says.
FIXED_EXPIRY = leases.REFERENCE.replace(EXPIRY, "lease_expires_at = now() + interval '30 seconds',")
# Takes over any RUNNING job, live or not: steals the work a healthy worker is doing.
ANY_RUNNING = leases.REFERENCE.replace(RECLAIM, "       OR status = 'RUNNING'\n")
# The reclaim written, the expiry forgotten: NULL never runs out.
NO_EXPIRY = leases.REFERENCE.replace(EXPIRY, "lease_expires_at = NULL,")
# The taken-over claim left open: the record says worker-1 still holds it.
EXPIRED_LEFT_OPEN = leases.REFERENCE.replace(EXPIRED_CLOSED, "")
# Leases right, exercise 03's lock dropped.
NO_LOCK = leases.REFERENCE.replace("    FOR UPDATE SKIP LOCKED\n", "")


def test_the_starter_and_reference_come_from_the_shipped_claim():
    """The reference is the shipped claim with leases always on; the starter has neither the expiry nor
    the reclaim, the places marked, and keeps exercise 03's lock."""
    assert "reclaim_expired" not in leases.REFERENCE and RECLAIM in leases.REFERENCE and EXPIRY in leases.REFERENCE
    assert "RUNNING'\n" not in leases.STARTER.split("), expired AS")[0]
    assert leases.RECLAIM_MARK in leases.STARTER and leases.EXPIRY_MARK in leases.STARTER
    assert "lease_expires_at = NULL," in leases.STARTER and "FOR UPDATE SKIP LOCKED" in leases.STARTER
    for text in (PLAIN_NOW, CLOCK_TIMESTAMP, ANY_RUNNING, NO_EXPIRY, EXPIRED_LEFT_OPEN, NO_LOCK, NO_BUDGET,
                 BUDGET_OFF_BY_ONE, BUDGET_ALWAYS, NO_STATUS, FIXED_EXPIRY):
        assert text != leases.REFERENCE


@pytest.mark.slow
async def test_the_reference_passes_with_exercise_03_again():
    """The one whole check of this file: forced schedules, the scenario, then exercise 03 again."""
    result = await check(leases.EXERCISE, leases.REFERENCE, seed=1, seeds=1, earlier=EARLIER)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked[:3] == ["forced schedules", "stage 04's scenario (seed 1)",
                                  "exercise skip-locked again (stage 03)"]


@pytest.mark.parametrize("right", [leases.REFERENCE, PLAIN_NOW, CLOCK_TIMESTAMP],
                         ids=["reference", "plain-now", "clock-timestamp"])
async def test_right_answers_on_any_clock_hold_in_every_forced_schedule(right):
    """Leases run out because the check wrote them an hour back: whichever clock a claim reads, one verdict."""
    assert [c for c in await leases.direct(leases.load(right), seed=1) if not c.held] == []


def _state(job: str, was: str, budget: str, yours: str, right: str) -> dict:
    return {"job": job, "was": was, "with": f"reclaim_expired on, enforce_budget {budget}", "yours": yours,
            "right": right}


LAST = "RUNNING, lease ran out, attempt 3 of 3 (its last)"
TAKES_ONLY_DUE = "a claim takes only due jobs"
TAKES_DUE = "a claim takes the due jobs it is asked for"
NONE_LEFT = "leave it: enforce_budget is on and no attempt is left (stage dead makes it DEAD)"


@pytest.mark.parametrize("wrong, invariant, said", [
    (leases.STARTER, "a claim's lease expires lease_seconds", {"lease": "30 s", "expires": "never (NULL)"}),
    (NO_EXPIRY, "a claim's lease expires lease_seconds", {"lease": "30 s", "expires": "never (NULL)"}),
    (FIXED_EXPIRY, "a claim's lease expires lease_seconds", {"lease": "120 s", "expires": "30 s after the claim"}),
    (ANY_RUNNING, TAKES_ONLY_DUE, _state("job-3", "RUNNING, lease live for an hour more, attempt 1 of 3", "on",
                                         "claimed it", "leave it: its lease is live: another worker is running it")),
    (NO_BUDGET, TAKES_ONLY_DUE, _state("job-6", LAST, "on", "claimed it", NONE_LEFT)),
    (BUDGET_OFF_BY_ONE, TAKES_ONLY_DUE, _state("job-6", LAST, "on", "claimed it", NONE_LEFT)),
    (BUDGET_ALWAYS, TAKES_DUE, _state("job-6", LAST, "off", "left it",
                                      "claim it: its lease ran out, and enforce_budget is off (retried for ever)")),
    (NO_STATUS, TAKES_ONLY_DUE, {"job": "job-9", "was": "DEAD, its lease ran out on its last attempt",
                                 "with": "reclaim_expired on, enforce_budget off", "yours": "claimed it",
                                 "right": "leave it: it is finished"}),
    (EXPIRED_LEFT_OPEN, "the claim a reclaim takes over is closed as expired",
     {"job": "job-4", "was": "RUNNING, lease ran out, attempt 2 of 3 (the one before its last)",
      "the claim taken over": "left open", "right": "expired"}),
], ids=["starter", "expiry-never-set", "expiry-not-lease-seconds", "reclaims-live-leases", "reclaim-ignores-budget",
        "budget-off-by-one", "budget-even-when-off", "finished-jobs-due", "expired-claim-left-open"])
async def test_plausible_wrong_answers_fail_on_the_first_forced_schedule_that_shows_them(wrong, invariant, said):
    """The first broken check is the one the checker shows, and it points the right way (a too-loose
    reclaim is told what it took, not that a due job is due)."""
    checks = await leases.direct(leases.load(wrong), seed=1)
    first = next(c for c in checks if not c.held)
    assert first.name.startswith(invariant), first
    assert said in first.violations, first.violations


async def test_a_shared_lock_is_named_as_exercise_03_regressed_every_time():
    """Found by the mutation score: the leases claim's plan reads `due` a row at a time, so two claims
    started together met over FOR SHARE SKIP LOCKED only 1 run in 3; claimer A holding its rows read with
    a shared lock meets it every time."""
    shared = leases.REFERENCE.replace("FOR UPDATE SKIP LOCKED", "FOR SHARE SKIP LOCKED")
    checks = await skip_locked.direct(leases.load(shared), seed=1)
    held = next(c for c in checks if c.name.startswith("while claimer A has read two jobs with a lock claimers share"))
    assert "took jobs claimer A had read, then waited for claimer A" in str(held.violations), held


@pytest.mark.slow
async def test_a_dropped_lock_is_named_as_exercise_03_regressed():
    """Exercise 03's forced schedules run again on the learner's claim: a dropped lock is its regression."""
    result = await check(leases.EXERCISE, NO_LOCK, seed=1, seeds=0, earlier=EARLIER)
    assert result.outcome is Outcome.FAILED, result.text()
    assert result.lines[:2] == ["✗ Regressed: exercise skip-locked (stage 03) no longer holds with your new code.",
                                "✗ Broken: 4 claims that read the due jobs at the same moment take different jobs: "
                                "none is claimed twice"], result.text()
