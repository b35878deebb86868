"""Retention: finished jobs deleted in small batches, so that the queue's tables stop growing forever.

SUCCEEDED jobs finalized more than `older_than_seconds` ago go, with their attempts, events and
submission keys (ON DELETE CASCADE); DEAD jobs only when asked (`include_dead`): they wait for an
operator's replay. Each batch is its own short transaction that skips the rows anyone holds (FOR UPDATE
SKIP LOCKED, sql/queue.sql job_prune_finalized), so pruning runs beside workers and never waits on them.
A job whose client key is still inside the idempotency window stays: a retry of its submission must
find it, not make a second job.

Not guaranteed: that a pass deletes every eligible job (one locked at that moment waits for the next
pass); that the window is the API's, unless both are given the same (RELIABLEQ_IDEMPOTENCY_WINDOW).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from reliableq.cancelling import event_set_within
from reliableq.config import DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS
from reliableq.queue import Queue

log = logging.getLogger("reliableq.retention")
DEFAULT_PRUNE_BATCH = 500
# A batch holds its rows' locks until it commits: past this, "small" no longer holds.
MAX_PRUNE_BATCH = 10_000


@dataclass(frozen=True)
class RetentionPolicy:
    """What may be deleted: finished more than `older_than_seconds` ago (DEAD too with `include_dead`),
    `batch` jobs per transaction, keeping jobs whose key is younger than `key_window_seconds`."""

    older_than_seconds: float
    include_dead: bool = False
    batch: int = DEFAULT_PRUNE_BATCH
    key_window_seconds: float = DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.older_than_seconds) and self.older_than_seconds >= 0):
            raise ValueError(f"the age to prune at must be zero or more seconds, got {self.older_than_seconds}")
        if not 1 <= self.batch <= MAX_PRUNE_BATCH:
            raise ValueError(f"a prune batch must be between 1 and {MAX_PRUNE_BATCH} jobs, got {self.batch}")
        if not (math.isfinite(self.key_window_seconds) and self.key_window_seconds > 0):
            raise ValueError(f"the idempotency window must be a positive number of seconds, "
                             f"got {self.key_window_seconds}")

    @property
    def statuses(self) -> tuple[str, ...]:
        return ("SUCCEEDED", "DEAD") if self.include_dead else ("SUCCEEDED",)


@dataclass
class Pruned:
    """What one pass deleted."""

    succeeded: int = 0
    dead: int = 0
    batches: int = 0

    def describe(self) -> str:
        return (f"pruned {self.succeeded + self.dead} jobs ({self.succeeded} SUCCEEDED, {self.dead} DEAD) "
                f"in {self.batches} batch{'es' if self.batches != 1 else ''}")


async def prune(queue: Queue, policy: RetentionPolicy) -> Pruned:
    """Delete batch after batch, each from where the last ended, until one comes back short: nothing
    further is eligible and free right now (a row skipped as locked waits for the next pass)."""
    pruned, after = Pruned(), None
    while True:
        deleted, after = await queue.prune_finalized(policy.statuses, policy.older_than_seconds,
                                                     policy.key_window_seconds, policy.batch, after)
        pruned.succeeded += deleted["SUCCEEDED"]
        pruned.dead += deleted["DEAD"]
        pruned.batches += 1
        if sum(deleted.values()) < policy.batch:
            return pruned


async def prune_every(queue: Queue, policy: RetentionPolicy, every_seconds: float, stop: asyncio.Event,
                      report: Callable[[Pruned], None]) -> None:
    """A pass every `every_seconds` until `stop` is set, each reported. A pass the database fails is
    logged in one line and tried again at the next: an outage must not end the loop."""
    while not stop.is_set():
        try:
            report(await prune(queue, policy))
        except psycopg.OperationalError as error:  # PoolTimeout included
            log.warning("prune pass failed, trying again in %g s: %s: %s", every_seconds, type(error).__name__,
                        " ".join(str(error).split()))
        await event_set_within(stop, every_seconds)
