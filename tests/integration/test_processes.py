"""Real worker processes started with the CLI (through the harness): SIGTERM drains in-flight work within
the grace period, and --crash-at SIGKILLs the process itself. The charge service runs in this process
on loopback; the queue and the charge service use the test's own databases."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from reliableq import db
from reliableq.charge.service import ChargeFaults
from reliableq.lab import processes
from reliableq.lab.harness import local_system
from reliableq.lab.ledger import job_counts
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission

pytestmark = pytest.mark.slow


async def the_counts(databases: db.Databases):
    (counts,) = await job_counts(databases)
    return counts


async def sigterm_during_charge(databases, tmp_path: Path, latency: float, grace: str, *extra: str):
    """One job, a worker process in the middle of its charge, then SIGTERM; returns what followed."""
    async with local_system(databases=databases, charge_faults=ChargeFaults(latency_seconds=latency), api=False,
                            worker_pool_size=0, logs=tmp_path) as system:
        job = await system.submit_direct(Submission(payload={"amount_cents": 1250, "currency": "USD"}, kind="charge"))
        worker = system.spawn_worker("worker", 5.0, "--grace", grace, *extra)

        async def running() -> bool:
            if worker.process.poll() is not None:
                raise AssertionError(f"the worker exited ({worker.process.returncode}):\n{worker.output()}")
            return (await system.queue.get(job.id)).status == "RUNNING"
        await wait_until(running, 30, f"job {job.id} to be RUNNING")
        worker.send_signal(signal.SIGTERM)
        returncode = await processes.wait_exit(worker, 20)
        after = await system.queue.get(job.id)
        now = await system.queue.database_now()
    return returncode, worker, after, now


def stats(worker: processes.CliProcess) -> dict:
    """What the worker wrote to its status file as it stopped."""
    status = worker.status()
    assert status is not None and status["state"] == "stopped", (status, worker.output())
    return status["stats"]


async def test_sigterm_lets_the_in_flight_charge_finish(databases, tmp_path):
    """SIGTERM during a 1 s charge: the worker finishes it within the grace, exits 0, job charged once."""
    returncode, worker, after, _ = await sigterm_during_charge(databases, tmp_path, 1.0, "10")
    assert returncode == 0, worker.output()
    assert after.status == "SUCCEEDED"
    counts = await the_counts(databases)
    assert (counts.attempts, counts.charges, counts.finalizations) == (1, 1, 1), counts.short()
    assert stats(worker)["abandoned"] == 0
    assert "Traceback" not in worker.output()
    # Its lifecycle at INFO by default, and no line per job (those are DEBUG).
    lines = worker.output().splitlines()
    assert any(" INFO reliableq.worker: worker worker started (" in line for line in lines), lines
    assert any(" INFO reliableq.worker: worker worker stopping: " in line for line in lines), lines
    assert lines[-1].endswith("worker worker stopped: claimed 1, succeeded 1, retried 0, dead 0, lost finalizes 0, "
                              "abandoned to lease expiry 0"), lines
    assert not any("claimed job" in line for line in lines), lines


async def test_json_logs_are_one_object_per_line(databases, tmp_path):
    """--log-format json: every line the worker writes parses as JSON, its own lines naming the worker."""
    returncode, worker, _, _ = await sigterm_during_charge(databases, tmp_path, 0.3, "10", "--log-format", "json")
    assert returncode == 0, worker.output()
    lines = [json.loads(line) for line in worker.output().splitlines()]
    ours = [(line["level"], line["message"].split(":")[0]) for line in lines
            if line.get("worker_id") == "worker" and line["logger"] == "reliableq.worker"]
    assert ours == [("INFO", "worker worker started (all mechanisms on)"), ("INFO", "worker worker stopping"),
                    ("INFO", "worker worker stopped")], lines


async def test_sigterm_past_grace_leaves_the_job_to_its_lease(databases, tmp_path):
    """SIGTERM with a 0.1 s grace during a 3 s charge: the worker exits without marking the job SUCCEEDED."""
    returncode, worker, after, now = await sigterm_during_charge(databases, tmp_path, 3.0, "0.1")
    assert returncode == 0, worker.output()
    assert after.status == "RUNNING"
    assert after.lease_expires_at is not None and after.lease_expires_at > now
    assert (await the_counts(databases)).finalizations == 0
    assert stats(worker)["abandoned"] == 1


async def test_crash_at_kills_the_worker_after_the_charge(databases, tmp_path):
    """--crash-at after_effect_before_finalize SIGKILLs the worker once the charge is committed."""
    async with local_system(databases=databases, api=False, worker_pool_size=0, logs=tmp_path) as system:
        job = await system.submit_direct(Submission(payload={"amount_cents": 1250, "currency": "USD"}, kind="charge"))
        worker = system.spawn_worker("worker", 5.0, "--crash-at", "after_effect_before_finalize")
        returncode = await processes.wait_exit(worker, 30)
        after = await system.queue.get(job.id)
    assert returncode == -signal.SIGKILL, worker.output()
    assert "stopped" not in worker.output()
    assert after.status == "RUNNING"
    counts = await the_counts(databases)
    assert (counts.attempts, counts.handler_runs, counts.charges, counts.finalizations) == (1, 1, 1, 0), counts.short()

