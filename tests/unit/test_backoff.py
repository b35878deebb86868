"""Capped exponential backoff with full jitter (reliableq/backoff.py), no database."""

from __future__ import annotations

from reliableq.backoff import Backoff


def test_backoff_ceiling_doubles_then_caps():
    """The jitter window is base * 2^(n-1), capped at max."""
    backoff = Backoff(base_seconds=0.5, max_seconds=4.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.ceiling(10_000) == 4.0


def test_backoff_full_jitter_stays_in_window_and_is_seeded():
    """Delays fall in [0, ceiling]; a seed reproduces them per job and attempt, another seed differs."""
    seeded = Backoff(0.5, 60.0, seed=42)
    delays = [seeded.delay(n, "job-a") for n in range(1, 9)]
    assert all(0 <= d <= seeded.ceiling(n) for n, d in enumerate(delays, start=1))
    assert delays == [Backoff(0.5, 60.0, seed=42).delay(n, "job-a") for n in range(1, 9)]
    assert delays != [Backoff(0.5, 60.0, seed=43).delay(n, "job-a") for n in range(1, 9)]
    assert seeded.delay(3, "job-a") != seeded.delay(3, "job-b")


def test_backoff_spreads_a_burst():
    """Full jitter: 200 jobs failing together retry over the whole window, not in lockstep."""
    backoff = Backoff(1.0, 60.0, seed=1)
    delays = sorted(backoff.delay(4, f"job-{i}") for i in range(200))
    assert delays[0] < 1.0 and delays[-1] > 7.0
    assert len({round(d, 3) for d in delays}) > 190
