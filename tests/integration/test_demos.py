"""The real-process demos: SIGKILL after the charge, and SIGSTOP past the lease."""

from __future__ import annotations

import pytest

from reliableq.lab import demo

pytestmark = pytest.mark.slow


async def test_kill9_demo_recovers_with_one_charge():
    """A worker process killed with SIGKILL after its charge: another reclaims, A=2 H=2 C=1 F=1."""
    result = await demo.kill9(lease_seconds=1.0)
    c = result.counts
    assert (c.status, c.attempts, c.handler_runs, c.charges, c.finalizations) == ("SUCCEEDED", 2, 2, 1, 1)
    assert "killed with SIGKILL" in result.report() and "recovery took" in result.report()


async def test_pause_demo_rejects_the_stale_finalize():
    """A SIGSTOPped worker resumes after the job was reclaimed; its finalize changes zero rows."""
    result = await demo.pause(lease_seconds=1.0)
    c = result.counts
    assert c.status == "SUCCEEDED" and c.charges == 1 and c.finalizations == 1
    report = result.report()
    assert "attempt 1 by worker-1: lost_" in report
    assert "attempt 2 by worker-2: succeeded" in report
    # What worker-1 last said is its INFO log line (time, level, logger, then the message).
    (said,) = [line for line in report.splitlines() if line.startswith("worker-1 on SIGTERM: ")]
    assert "INFO reliableq.worker: worker worker-1 stopped: claimed 1, succeeded 0, retried 0, dead 0, " \
           "lost finalizes 1" in said, report
