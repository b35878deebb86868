"""The quiet-tenant scenario's gate, on constructed claim histories (no database): first in first out, a
quiet job waits behind every claim of the flood and breaks the fair bound; claimed in its turn, it holds;
a quiet job never claimed, or stored once the flood had drained, fails the run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from reliableq.bench.fairness import FLOOD, QUIET, fair_bound, quiet_pickups

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORKERS = 2
BOUND_CHECK = f"each quiet job was claimed within {fair_bound(WORKERS)} claims of becoming claimable"


def _ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


def _flood(claims: int = 25, per_claim: int = 4) -> list[dict]:
    """The flood's jobs, stored at T0, claimed 4 at a time, one claim a millisecond, the workers in turn."""
    return [{"job_id": uuid.uuid4(), "tenant": FLOOD, "created_at": T0, "claimed_at": _ms(n + 1),
             "worker_id": f"w{n % WORKERS}"} for n in range(claims) for _ in range(per_claim)]


def _quiet(stored_ms: float, claimed_ms: float | None) -> tuple[dict | None, tuple[uuid.UUID, datetime]]:
    job_id = uuid.uuid4()
    row = None if claimed_ms is None else {"job_id": job_id, "tenant": QUIET, "created_at": _ms(stored_ms),
                                           "claimed_at": _ms(claimed_ms), "worker_id": "w0"}
    return row, (job_id, _ms(stored_ms + 0.2))  # visible: read just after its insert committed


def _judged(quiet: list, fair: bool = True) -> tuple[dict, dict[str, bool]]:
    claims = _flood() + [row for row, _ in quiet if row is not None]
    metrics, checks = quiet_pickups(claims, [submitted for _, submitted in quiet], WORKERS, fair)
    return metrics, {c.name.split(" (")[0]: c.held for c in checks}


def test_first_in_first_out_a_quiet_job_waits_behind_the_flood_and_breaks_the_fair_bound():
    metrics, held = _judged([_quiet(2.5, 25.5), _quiet(4.5, 25.6)])
    assert held[BOUND_CHECK] is False  # judged as a fair run, the FIFO history fails
    assert metrics["claims_ahead_max"] == 23 and metrics["pickup_p50_ms"] == 23.0
    metrics, held = _judged([_quiet(2.5, 25.5)], fair=False)
    assert BOUND_CHECK not in held and all(held.values())  # a FIFO run is not held to it


def test_claimed_in_its_turn_a_quiet_job_holds_the_fair_bound():
    metrics, held = _judged([_quiet(2.5, 3.5), _quiet(4.5, 5.5)])
    assert all(held.values())
    assert metrics["claims_ahead_max"] == 1 and metrics["quiet_claimed"] == 2


def test_a_quiet_job_never_claimed_or_stored_after_the_flood_fails_the_run():
    _, held = _judged([_quiet(2.5, 3.5), _quiet(4.5, None)])
    assert held["every quiet job was claimed"] is False
    _, held = _judged([_quiet(30.0, 31.0)])
    assert held["every quiet job was stored while the flooding tenant still had jobs waiting"] is False
