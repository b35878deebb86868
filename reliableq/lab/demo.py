"""`reliableq demo`: the lab's headline in one run, and its versions with real processes and signals.

One job, submitted over HTTP; its first worker charges it and crashes before finalizing; a second worker
reclaims it when the lease expires and finishes it. With every mechanism on, the job ran twice but was
charged once and finalized once: A=2 H=2 C=1 F=1. With idempotency off, the same story charges twice.
"""

from __future__ import annotations

import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from reliableq.config import Mechanisms
from reliableq.lab import processes
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.lab.ledger import JobCounts

DEMO_LEASE_SECONDS = 1.0


@dataclass(frozen=True)
class CrashRecovery:
    mechanisms: Mechanisms
    counts: JobCounts
    crashed_at: str
    recovery_seconds: float  # from the crash until the second worker finalized the job

    def report(self) -> str:
        c = self.counts
        return "\n".join([
            f"mechanisms: {self.mechanisms.describe()}",
            f"job {c.job_id}: submitted through the API, 202 Accepted",
            f"worker-1 claimed it, charged it, and crashed at {self.crashed_at}",
            f"worker-2 reclaimed it after the {DEMO_LEASE_SECONDS:g} s lease expired; "
            f"{c.status} {self.recovery_seconds:.2f} s after the crash",
            f"{c.short()}  (A attempts, H handler runs, C committed charges, F finalizations)",
            "the guarantee held: charged once, finalized once" if c.charges == 1 and c.finalizations == 1
            else f"the guarantee broke: {c.charges} charges for one job",
        ])


async def crash_after_charge(mechanisms: Mechanisms = Mechanisms()) -> CrashRecovery:
    """Run the crash-after-charge story on fresh databases and return what PostgreSQL recorded."""
    settings = fast_settings(lease_seconds=DEMO_LEASE_SECONDS)
    async with local_system(mechanisms, database_prefix="rq_demo") as system:
        job_id = await system.submit_http(1250)
        faults = FaultPlan()
        faults.arm_crash("after_effect_before_finalize")
        first = await system.worker(settings.with_id("worker-1"), faults).run()
        crashed = time.monotonic()
        system.start_worker(system.worker(settings.with_id("worker-2")))
        await system.wait_settled([job_id], timeout=30)
        recovery = time.monotonic() - crashed
        (counts,) = await system.counts()
    return CrashRecovery(mechanisms, counts, first.crashed_at or "nowhere", recovery)


# -- real processes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessDemo:
    counts: JobCounts
    lines: list[str]

    def report(self) -> str:
        return "\n".join([*self.lines, f"{self.counts.short()}  (status {self.counts.status})"])


@dataclass(frozen=True)
class KillRecovery:
    """One telling of the kill -9 story: the two worker processes and when the job recovered."""
    first: processes.CliProcess  # SIGKILLed right after its charge committed
    second: processes.CliProcess  # reclaimed the job once the lease expired
    killed: float  # time.monotonic() when the first worker was seen dead
    recovered: float  # time.monotonic() when the job was seen SUCCEEDED or DEAD

    @property
    def recovery_seconds(self) -> float:
        return self.recovered - self.killed


async def kill_after_charge(system: LocalSystem, job_id: uuid.UUID, lease_seconds: float, *extra: str) -> KillRecovery:
    """The kill -9 story, told once for the demo that prints it and the benchmark that times it: worker-1
    (a real process) is SIGKILLed right after its charge commits; worker-2, started at once, reclaims the
    job when the lease expires and finishes it. `extra`: more arguments for both workers."""
    first = system.spawn_worker("worker-1", lease_seconds, "--crash-at", "after_effect_before_finalize", *extra)
    code = await processes.wait_exit(first, 60)
    killed = time.monotonic()
    if code != -signal.SIGKILL:
        raise RuntimeError(f"worker-1 exited with {code}, expected SIGKILL")
    # Started now: its start-up overlaps the lease it must wait out anyway.
    second = system.spawn_worker("worker-2", lease_seconds, *extra)
    await system.wait_settled([job_id], timeout=lease_seconds + 60)
    return KillRecovery(first, second, killed, time.monotonic())


@asynccontextmanager
async def _process_demo(prefix: str) -> AsyncIterator[LocalSystem]:
    """A fresh system whose worker processes write to files, so that a wait that times out can say what
    each last said (a pipe is read only once its process has exited)."""
    with tempfile.TemporaryDirectory(prefix=f"reliableq-{prefix}-") as logs:
        async with local_system(database_prefix=prefix, logs=Path(logs)) as system:
            yield system


async def kill9(lease_seconds: float = 2.0) -> ProcessDemo:
    """The kill -9 story over a fresh system, as `reliableq demo kill9` prints it."""
    async with _process_demo("rq_kill9") as system:
        job_id = await system.submit_http(1250)
        run = await kill_after_charge(system, job_id, lease_seconds)
        second_said = await processes.stop(run.second)
        (counts,) = await system.counts()
    return ProcessDemo(counts, [
        f"job {job_id} submitted through the API (202 after commit); lease {lease_seconds:g} s",
        f"worker-1 (pid {run.first.pid}) charged the job and was killed with SIGKILL before finalizing",
        f"worker-2 (pid {run.second.pid}) reclaimed it after the lease expired: recovery took "
        f"{run.recovery_seconds:.2f} s",
        f"worker-2 on SIGTERM: {second_said}",
    ])


async def pause(lease_seconds: float = 1.0) -> ProcessDemo:
    """worker-1 is SIGSTOPped holding the lease; worker-2 reclaims and finishes; on SIGCONT worker-1's
    finalize carries a stale lease token and changes zero rows."""
    async with _process_demo("rq_pause") as system:
        system.charge_faults.latency_seconds = 0.3  # a window in which worker-1 holds the job
        job_id = await system.submit_http(1250)
        first = system.spawn_worker("worker-1", lease_seconds)

        async def held_by_first() -> bool:
            job = await system.queue.get(job_id)
            return job.status == "RUNNING" and job.worker_id == "worker-1"
        await system.wait_until(held_by_first, 30, "worker-1 to claim the job")
        first.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        second = system.spawn_worker("worker-2", lease_seconds)
        await system.wait_for_status(job_id, {"SUCCEEDED"}, timeout=lease_seconds + 30)
        reclaimed = time.monotonic() - stopped
        first.send_signal(signal.SIGCONT)

        async def first_refused() -> bool:
            attempts = await system.queue.attempts_of(job_id)
            return any(a["worker_id"] == "worker-1" and (a["outcome"] or "").startswith("lost_") for a in attempts)
        await system.wait_until(first_refused, 30, "worker-1's stale finalize")
        first_said, second_said = await processes.stop(first), await processes.stop(second)
        attempts = await system.queue.attempts_of(job_id)
        (counts,) = await system.counts()
    return ProcessDemo(counts, [
        f"job {job_id}; lease {lease_seconds:g} s",
        f"worker-1 (pid {first.pid}) claimed the job and was stopped with SIGSTOP",
        f"worker-2 (pid {second.pid}) reclaimed it after the lease expired and finished it "
        f"({reclaimed:.2f} s after the stop)",
        "worker-1 got SIGCONT and tried to finalize with its old lease token:",
        *(f"  attempt {a['attempt']} by {a['worker_id']}: {a['outcome']}" for a in attempts),
        f"worker-1 on SIGTERM: {first_said}",
        f"worker-2 on SIGTERM: {second_said}",
    ])
