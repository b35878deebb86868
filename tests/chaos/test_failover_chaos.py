"""Chaos with a failover (reliableq/lab/failover_chaos.py): real `reliableq api`, charge-service and worker
processes over a primary and a synchronous standby, keyed clients submitting over HTTP, the link to the
standby stalled (SIGSTOP), the primary SIGKILLed mid-submission (a worker with it, on some seeds) and the
standby promoted. With sync_standby on, every invariant holds over the seeds and nothing acknowledged is
lost; off, exactly the jobs committed during the lag are lost, named by their keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reliableq.config import Mechanisms
from reliableq.lab.failover_chaos import FailoverConfig, failover_schedule, run_failover_chaos

pytestmark = pytest.mark.slow


def test_a_seed_fixes_the_schedule_and_the_seeds_vary_it():
    schedules = [failover_schedule(FailoverConfig(seed=seed)) for seed in range(20)]
    assert schedules[:3] == [failover_schedule(FailoverConfig(seed=seed)) for seed in range(3)]
    total = FailoverConfig().clients * FailoverConfig().jobs_per_client
    assert all(total // 5 <= s.cut_after <= total // 3 and 0.3 <= s.lag_seconds <= 1.0 for s in schedules)
    assert {s.worker_killed for s in schedules} == {None, 0, 1}  # some seeds kill a worker with the primary


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_with_sync_standby_every_invariant_holds_through_the_failover(seed):
    report = await run_failover_chaos(FailoverConfig(seed=seed))
    assert report.ok, report.text()
    assert report.lost == [] and len(report.acknowledged) == 100
    # The commits waiting for the stalled standby were refused or dropped, and retried with their keys.
    assert report.refused >= 1
    assert report.first_acknowledged_after_seconds is not None and report.first_claim_after_seconds is not None


async def test_without_it_the_jobs_committed_during_the_lag_are_lost():
    report = await run_failover_chaos(FailoverConfig(seed=1, mechanisms=Mechanisms().without("sync_standby")))
    assert not report.ok
    assert [c.name for c in report.checks if not c.held] == ["every acknowledged job is stored"]
    during_the_lag = [ack.key for ack in report.acknowledged
                      if report.link_cut < ack.sent and ack.answered < report.primary_died]
    assert during_the_lag and set(during_the_lag) <= set(report.lost)  # committed on the primary alone
    # Nothing sent after the promotion is lost: the clients went on, on the promoted server.
    assert not {ack.key for ack in report.acknowledged if ack.sent > report.primary_died} & set(report.lost)
    assert f"LOST after the failover ({len(report.lost)}): " in report.text()


def test_the_chaos_command_runs_it_and_exits_non_zero_when_an_acknowledged_job_is_lost():
    args = [sys.executable, "-m", "reliableq", "chaos", "--failover", "--seed", "2"]
    ok = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "the primary was SIGKILLed and the standby promoted" in ok.stdout and "all invariants held" in ok.stdout
    lost = subprocess.run(args + ["--off", "sync_standby"], capture_output=True, text=True, timeout=300)
    assert lost.returncode == 1, lost.stdout + lost.stderr
    assert "BROKEN" in lost.stdout and "LOST after the failover" in lost.stdout
