"""`reliableq demo`: the lab's headline in one run.

One job, submitted over HTTP; its first worker charges it and crashes before finalizing; a second worker
reclaims it when the lease expires and finishes it. With every mechanism on, the job ran twice but was
charged once and finalized once: A=2 H=2 C=1 F=1. With idempotency off, the same story charges twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from reliableq.config import Mechanisms
from reliableq.faults import FaultPlan
from reliableq.harness import fast_settings, local_system
from reliableq.ledger import JobCounts

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
        await system.wait_for_status(job_id, {"SUCCEEDED", "DEAD"}, timeout=30)
        recovery = time.monotonic() - crashed
        (counts,) = await system.counts()
    return CrashRecovery(mechanisms, counts, first.crashed_at or "nowhere", recovery)
