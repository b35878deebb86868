"""What the worker tests check each job against: the databases' own record of it, read back as A attempts,
H handler runs, C charges and F finalizations."""

from __future__ import annotations

import uuid

from reliableq.lab.harness import LocalSystem
from reliableq.lab.ledger import JobCounts


async def counts_by_job(system: LocalSystem) -> dict[uuid.UUID, JobCounts]:
    return {c.job_id: c for c in await system.counts()}


async def only_counts(system: LocalSystem) -> JobCounts:
    (counts,) = await system.counts()
    return counts


def abhcf(c: JobCounts) -> tuple[int, int, int, int]:
    return c.attempts, c.handler_runs, c.charges, c.finalizations
