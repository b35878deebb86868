"""The invariant checks themselves: they pass on a clean history and catch the violations they name."""

from __future__ import annotations

import uuid
from datetime import timedelta

from reliableq import invariants
from reliableq.config import Mechanisms

LEASE = 30.0


def broken(checks) -> list[str]:
    return [check.name for check in checks if not check.held]


async def test_a_replayed_job_finalized_again_is_not_a_double_finalize(make_queue, submission, databases):
    """DEAD, replayed, then SUCCEEDED: one finalize per life of the job, no violation."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, "w1", LEASE)
    assert await queue.dead(job, "permanent failure: card rejected")
    await queue.replay(job.id, budget=2)
    (again,) = await queue.claim(1, "w2", LEASE)
    assert await queue.succeed(again)
    checks = await invariants.check_stored(databases)
    assert "no stale owner finalized a job; each job was finalized once" not in broken(checks)


async def test_a_stale_finalize_without_fencing_is_caught(make_queue, submission, databases):
    """Without fencing, a stale owner's succeed after the current owner's is reported."""
    queue = make_queue(Mechanisms().without("fencing"))
    await queue.submit(submission())
    (stale,) = await queue.claim(1, "paused", lease_seconds=1)
    later = await queue.database_now() + timedelta(seconds=2)
    (current,) = await queue.claim(1, "rescuer", LEASE, now=later)
    assert await queue.succeed(current) and await queue.succeed(stale)
    checks = await invariants.check_stored(databases)
    assert "no stale owner finalized a job; each job was finalized once" in broken(checks)


async def test_unfinished_and_lost_jobs_are_named(make_queue, submission, databases):
    """A job still PENDING and an acknowledged id never stored both break their invariants."""
    job = await make_queue().submit(submission())
    checks = await invariants.check_stored(databases, acknowledged=[job.id, uuid.uuid4()])
    assert {"every acknowledged job is stored", "every job is SUCCEEDED or DEAD"} <= set(broken(checks))
