"""Exercise 04 (leases) graded by the real checker on real PostgreSQL, with exercise 03 run again as an
earlier stage: the reference and a right answer spelt differently pass, the starter fails with stage 04's
jobs stranded, and the wrong answers a learner would plausibly write fail on the invariant each breaks,
a dropped lock as a regression of exercise 03."""

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
    for text in (PLAIN_NOW, ANY_RUNNING, NO_EXPIRY, EXPIRED_LEFT_OPEN, NO_LOCK):
        assert text != leases.REFERENCE


async def test_the_reference_passes_with_exercise_03_again():
    result = await check(leases.EXERCISE, leases.REFERENCE, seed=1, seeds=1, earlier=EARLIER)
    assert result.outcome is Outcome.PASSED, result.text()
    assert "exercise skip-locked again (stage 03)" in result.checked


async def test_plain_now_passes_too():
    """Without chaos (seeds=0) and exercise 03 again (its lock is the reference's), to keep CI time: chaos
    never moves the clock through %(now)s, so there plain now() is the reference's very query; the scenario
    and the direct checks are where it differs."""
    result = await check(leases.EXERCISE, PLAIN_NOW, seed=1, seeds=0)
    assert result.outcome is Outcome.PASSED, result.text()


async def test_the_starter_strands_stage_04s_jobs():
    result = await check(leases.EXERCISE, leases.STARTER, seed=1, seeds=1, earlier=EARLIER)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0] == ("✗ Broken: stage 04's dead worker: every job worker-1 held is claimed again by "
                               "worker-2 once its lease ran out, and succeeds [stranded 4, reclaimed by worker-2 0]")
    assert "job job-4, status RUNNING" in result.text()


async def test_an_expiry_never_set_is_named_by_the_direct_checks():
    """It strands stage 04's jobs as the starter does (above); the direct checks say why."""
    broken = [c for c in await leases.direct(leases.load(NO_EXPIRY), seed=1) if not c.held]
    assert [c.name for c in broken] == ["a claim's lease expires lease_seconds after the claim, on PostgreSQL's clock",
                                        "a RUNNING job whose lease has run out is due: another worker claims it"]
    assert broken[0].violations[0]["expires"] == "never (NULL)"


@pytest.mark.parametrize("wrong, said", [
    (ANY_RUNNING, "✗ Broken: a job whose lease is still running is never claimed by another worker"),
    (EXPIRED_LEFT_OPEN, "✗ Broken: the claim it takes over is closed as expired"),
    (NO_LOCK, "✗ Regressed: exercise skip-locked (stage 03) no longer holds with your new code."),
], ids=["reclaims-live-leases", "expired-claim-left-open", "lock-dropped"])
async def test_plausible_wrong_answers_fail_on_the_invariant_they_break(wrong, said):
    result = await check(leases.EXERCISE, wrong, seed=1, seeds=1, earlier=EARLIER)
    assert result.outcome is Outcome.FAILED, result.text()
    assert result.lines[0] == said, result.text()
