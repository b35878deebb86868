"""The mechanism switches and worker settings (reliableq/config.py)."""

from __future__ import annotations

import pytest

from reliableq.config import Mechanisms, WorkerSettings


def test_mechanisms_are_ordered_and_switchable():
    """The flags come in stage order; up_to turns on a prefix; unknown names are refused."""
    assert Mechanisms.names() == ["commit_before_ack", "skip_locked", "leases", "fencing", "idempotency",
                                  "backoff", "dead", "semaphore", "sync_standby", "fairness"]
    assert Mechanisms.up_to("leases").off() == ["fencing", "idempotency", "backoff", "dead", "semaphore",
                                                "sync_standby", "fairness"]
    assert Mechanisms.up_to(None) == Mechanisms.all_off()
    assert Mechanisms.up_to("fairness") == Mechanisms()
    with pytest.raises(ValueError, match="unknown mechanism.s. speed; known: commit_before_ack, skip_locked, "):
        Mechanisms().without("speed")


def test_worker_settings_refuse_nonsense():
    """Zero concurrency or a non-positive lease is a configuration error, not a hang."""
    with pytest.raises(ValueError, match="concurrency"):
        WorkerSettings(concurrency=0)
    with pytest.raises(ValueError, match="lease_seconds"):
        WorkerSettings(lease_seconds=0)
