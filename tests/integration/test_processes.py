"""Real worker processes started with the CLI: SIGTERM drains in-flight work within the grace period,
and --crash-at SIGKILLs the process itself. The charge service runs in this process on loopback; the
queue and the charge service use the test's own databases."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from reliableq import db
from reliableq.charge.service import ChargeFaults, create_charge_app
from reliableq.lab.ledger import job_counts
from reliableq.payload import Submission
from reliableq.queue import Job, Queue
from reliableq.servers import LoopbackServer

pytestmark = pytest.mark.slow


@asynccontextmanager
async def charge_service(databases: db.Databases, faults: ChargeFaults):
    """The charge service over the test's charge database, on a free loopback port."""
    server = LoopbackServer(create_charge_app(databases.charge_url, faults))
    url = await asyncio.to_thread(server.start)
    try:
        yield url
    finally:
        await asyncio.to_thread(server.stop)


class WorkerProcess:
    """`python -m reliableq worker ...` over the test's databases, its output kept in files."""

    def __init__(self, databases: db.Databases, tmp_path: Path, *args: str) -> None:
        env = os.environ | {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}
        self.stdout_path, self.stderr_path = tmp_path / "worker.out", tmp_path / "worker.err"
        self.status_path = tmp_path / "worker.status.json"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "reliableq", "worker",
                                             "--status-file", str(self.status_path), *args],
                                            env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def stats(self) -> dict:
        """What the worker wrote to its status file as it stopped."""
        status = json.loads(self.status_path.read_text())
        assert status["state"] == "stopped", status
        return status["stats"]

    def output(self) -> str:
        return f"stdout:\n{self.stdout_path.read_text()}\nstderr:\n{self.stderr_path.read_text()}"

    async def wait(self, timeout: float) -> int:
        try:
            return await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit within {timeout}s\n{self.output()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


async def poll_until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str,
                     worker: WorkerProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if worker is not None and worker.process.poll() is not None:
            raise AssertionError(f"worker exited ({worker.process.returncode}) before {what}\n{worker.output()}")
        if time.monotonic() > deadline:
            extra = f"\n{worker.output()}" if worker else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
        await asyncio.sleep(0.05)


async def wait_running(queue: Queue, job_id: uuid.UUID, worker: WorkerProcess) -> Job:
    async def running() -> bool:
        return (await queue.get(job_id)).status == "RUNNING"
    await poll_until(running, 30, f"job {job_id} to be RUNNING", worker)
    return await queue.get(job_id)


async def the_counts(databases: db.Databases):
    (counts,) = await job_counts(databases)
    return counts


async def sigterm_during_charge(databases, queue: Queue, tmp_path: Path, latency: float, grace: str):
    """One job, a worker process in the middle of its charge, then SIGTERM; returns what followed."""
    job = await queue.submit(Submission(payload={"amount_cents": 1250, "currency": "USD"}))
    async with charge_service(databases, ChargeFaults(latency_seconds=latency)) as charge_url:
        worker = WorkerProcess(databases, tmp_path, "--charge-url", charge_url,
                               "--lease", "5", "--grace", grace, "--poll", "0.05")
        try:
            await wait_running(queue, job.id, worker)
            worker.process.send_signal(signal.SIGTERM)
            returncode = await worker.wait(20)
        finally:
            worker.kill()
        after = await queue.get(job.id)
        now = await queue.database_now()
    return returncode, worker, after, now


async def test_sigterm_lets_the_in_flight_charge_finish(databases, make_queue, tmp_path):
    """SIGTERM during a 1 s charge: the worker finishes it within the grace, exits 0, job charged once."""
    returncode, worker, after, _ = await sigterm_during_charge(databases, make_queue(), tmp_path, 1.0, "10")
    assert returncode == 0, worker.output()
    assert after.status == "SUCCEEDED"
    counts = await the_counts(databases)
    assert (counts.attempts, counts.charges, counts.finalizations) == (1, 1, 1), counts.short()
    assert worker.stats()["abandoned"] == 0
    assert "Traceback" not in worker.stderr_path.read_text()


async def test_sigterm_past_grace_leaves_the_job_to_its_lease(databases, make_queue, tmp_path):
    """SIGTERM with a 0.1 s grace during a 3 s charge: the worker exits without marking the job SUCCEEDED."""
    returncode, worker, after, now = await sigterm_during_charge(databases, make_queue(), tmp_path, 3.0, "0.1")
    assert returncode == 0, worker.output()
    assert after.status == "RUNNING"
    assert after.lease_expires_at is not None and after.lease_expires_at > now
    assert (await the_counts(databases)).finalizations == 0
    assert worker.stats()["abandoned"] == 1


async def test_crash_at_kills_the_worker_after_the_charge(databases, make_queue, submission, tmp_path):
    """--crash-at after_effect_before_finalize SIGKILLs the worker once the charge is committed."""
    queue = make_queue()
    job = await queue.submit(submission())
    async with charge_service(databases, ChargeFaults()) as charge_url:
        worker = WorkerProcess(databases, tmp_path, "--charge-url", charge_url, "--lease", "5", "--poll", "0.05",
                               "--crash-at", "after_effect_before_finalize")
        try:
            returncode = await worker.wait(30)
        finally:
            worker.kill()
    assert returncode == -signal.SIGKILL, worker.output()
    assert "stopped" not in worker.stdout_path.read_text()
    assert (await queue.get(job.id)).status == "RUNNING"
    counts = await the_counts(databases)
    assert (counts.attempts, counts.handler_runs, counts.charges, counts.finalizations) == (1, 1, 1, 0), counts.short()
