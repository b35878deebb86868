"""Keeping a claim's lease: renewed every third of the lease from the start of the effect until the
finalize is recorded.

Why until the finalize, not only while the effect runs: a success may wait for its group's commit, and a
finalize may be retried after a database error; a lease that ran out meanwhile would let another worker
run the job again for nothing. What it does not do: keep a stalled worker's lease. A handler stalled at a
fault point stands for a stopped process, so renewals stop while `suspended()` lasts, and a renewal that
comes too late is refused by the database (a lease that ran out is never revived): the keeper reports the
loss and stops.

A loss is also told apart from its cause: the keeper keeps its own estimate of when the lease runs out,
on the event loop's clock and never later than PostgreSQL's (each grant is counted from before the
statement that made it was sent). A refusal answered after that moment means no renewal landed in time:
this process or its database was too slow for the lease (`ran_out_unrenewed`); one answered before it
means the lease was taken or cut short while this worker still held it, which no slowness explains.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import PoolTimeout

from reliableq.cancelling import event_set_within
from reliableq.queue import Job, Queue

log = logging.getLogger("reliableq.worker")


class LeaseKeeper:
    """`async with LeaseKeeper(...)`: renew `job`'s lease in the background until the block ends.
    `renewing=False` (leases off) keeps nothing. `on_lost` is called once if a renewal is refused while
    nobody is finalizing the job; during the finalize a refusal may be the finalize's own doing, and the
    finalize's answer says whether the lease was lost."""

    def __init__(self, queue: Queue, job: Job, lease_seconds: float, *, fleet_limited: bool = False,
                 renewing: bool = True, on_lost: Callable[[], None] = lambda: None,
                 claim_sent_at: float | None = None) -> None:
        """`claim_sent_at`: the event loop's time when the claim that granted the lease was sent (default:
        now, which is later than the grant: an estimate that errs towards blaming the loss on a cause)."""
        self.queue, self.job, self.lease_seconds = queue, job, lease_seconds
        self.fleet_limited, self.renewing, self.on_lost = fleet_limited, renewing, on_lost
        self._loop = asyncio.get_running_loop()
        self._runs_out_at = (self._loop.time() if claim_sent_at is None else claim_sent_at) + lease_seconds
        # A third of the lease between renewals: two can fail or run late before the lease is lost.
        self._renew_every = lease_seconds / 3
        self.ran_out_unrenewed = False
        self._stop = asyncio.Event()
        self._suspended = False
        self._finalizing = False
        self._first_renewal: asyncio.TimerHandle | None = None
        self._renewer: asyncio.Task | None = None

    async def __aenter__(self) -> LeaseKeeper:
        if self.renewing:
            # The renewer starts when the first renewal is due: most jobs are finalized sooner, and then
            # none is made.
            self._first_renewal = self._loop.call_later(self._renew_every, self._start_renewing)
        return self

    def _start_renewing(self) -> None:
        self._renewer = asyncio.create_task(self._renew_until_stopped())

    async def __aexit__(self, error_type, error, traceback) -> None:
        if self._first_renewal is not None:
            self._first_renewal.cancel()
        if self._renewer is None:
            return
        self._stop.set()
        if error_type is not None:  # a crash or a cancellation: stop at once, as a dead process would
            self._renewer.cancel()
        # Otherwise a renewal in flight finishes: cancelled mid-query, it would cost the pool its connection.
        # (Cancelling this task while it waits here cancels the renewer too.)
        await asyncio.gather(self._renewer, return_exceptions=True)

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """No renewals while the block lasts (a stalled handler stands for a stopped process)."""
        self._suspended = True
        try:
            yield
        finally:
            self._suspended = False

    def finalizing(self) -> None:
        """The finalize starts now: a refused renewal from here on is no news of its own."""
        self._finalizing = True

    def refused(self) -> None:
        """A renewal or the finalize was refused just now: was the lease, as this worker last had it
        granted, already run out (no renewal landed in time)? Said only while renewing: a worker that
        never renews (leases off) has no renewal that could have come late."""
        if self.renewing and self._loop.time() > self._runs_out_at:
            self.ran_out_unrenewed = True

    async def _renew_until_stopped(self) -> None:
        """From the first renewal's time on: renew, then again a third of the lease later, until stopped."""
        while not self._stop.is_set() and (self._suspended or await self._renewed()):
            if await event_set_within(self._stop, self._renew_every):
                return

    async def _renewed(self) -> bool:
        """One renewal: whether to go on (granted, or failed and worth another try)."""
        sent_at = self._loop.time()
        try:
            won = await self.queue.renew(self.job, self.lease_seconds, fleet_limited=self.fleet_limited)
        except (psycopg.Error, PoolTimeout) as error:
            reraise_if_cancelled()
            # Not a lost lease, just a failed attempt: try again while the lease may still be ours.
            log.warning("worker %s could not renew job %s: %s", self.job.worker_id, self.job.id, error,
                        extra={"worker_id": self.job.worker_id, "job_id": self.job.id})
            return True
        if won:
            self._runs_out_at = sent_at + self.lease_seconds
            return True
        self.refused()
        if not self._finalizing:
            self.on_lost()
            log.warning("worker %s lost the lease of job %s", self.job.worker_id, self.job.id,
                        extra={"worker_id": self.job.worker_id, "job_id": self.job.id})
        return False


def reraise_if_cancelled() -> None:
    """Called in an `except` for database errors: psycopg answers a cancelled query with QueryCanceled,
    so the task's cancellation can arrive dressed as a database error. Swallowing it would keep a
    renewer alive after its handler finished, renewing a lease nobody will ever finalize."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise
