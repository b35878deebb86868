"""The worker: claims due jobs, performs their charge, and finalizes each exactly as its lease allows.

One asyncio loop per worker. With the semaphore on, it claims only as many jobs as it has free permits;
each handler renews its lease every third of the lease, calls the charge service with the job's stable
key, classifies the outcome and finalizes with a fenced update (succeed, retry with backoff, or DEAD).
On stop (SIGTERM/SIGINT in the CLI) it claims nothing more, lets in-flight handlers finish within the
grace period while still renewing, and abandons the rest to lease expiry: unfinished work is never
marked succeeded. What it cannot guarantee: that a handler runs once. A crash after the charge and
before the finalize means the job runs again; the idempotency key is what keeps the charge single.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass

import psycopg
from psycopg_pool import PoolTimeout

from reliableq.backoff import Backoff
from reliableq.charge import ChargeClient, ChargeOutcome
from reliableq.config import WorkerSettings
from reliableq.faults import FaultPlan, WorkerCrashed
from reliableq.group_commit import GroupCommitter
from reliableq.queue import Job, Queue

log = logging.getLogger("reliableq.worker")
FINALIZE_TRIES = 4  # a finalize that meets a database error is tried again, 0.1 s, 0.2 s, 0.4 s later
FINALIZE_RETRY_SECONDS = 0.1
_worker_numbers = itertools.count(1)


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost_finalizes: int = 0  # finalizes a fenced update refused (a stale owner)
    lost_renewals: int = 0
    abandoned: int = 0  # handlers cut off at shutdown; their leases expire
    in_flight_peak: int = 0
    crashed_at: str | None = None  # the fault point a simulated crash stopped this worker at
    # Always-on timing counters (perf_counter seconds), so a benchmark can say where a job's time went;
    # a sum and a count each, cheap enough to keep in production.
    claim_calls: int = 0  # claim transactions, empty ones included
    claim_seconds_total: float = 0.0
    charge_calls: int = 0
    charge_seconds_total: float = 0.0
    finalize_calls: int = 0  # succeed/retry/dead updates, lost ones included
    success_commits: int = 0  # commits of grouped successes (several jobs each under load)
    finalize_seconds_total: float = 0.0


class Worker:
    def __init__(self, queue: Queue, charges: ChargeClient, settings: WorkerSettings = WorkerSettings(),
                 faults: FaultPlan | None = None) -> None:
        self.queue = queue
        self.mechanisms = queue.mechanisms
        self.charges = charges
        self.settings = settings
        self.faults = faults or FaultPlan()
        self.worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{next(_worker_numbers)}"
        self.backoff = Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds, settings.backoff_seed)
        self.stats = WorkerStats()
        self._handlers: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # Successes that finish together share one fenced statement and one commit.
        self.successes = GroupCommitter(self._succeed_group, max(settings.concurrency, 1))

    @property
    def in_flight(self) -> int:
        return len(self._handlers)

    def request_stop(self) -> None:
        """Begin a graceful shutdown: claim nothing more; `run` returns once in-flight work settles."""
        self._stopping.set()
        self._wake.set()

    def _claim_limit(self) -> int:
        if self.mechanisms.semaphore:
            return self.settings.concurrency - self.in_flight
        return self.settings.unbounded_claim_limit

    async def run(self) -> WorkerStats:
        """Claim and handle jobs until stopped or crashed; returns what this worker did."""
        log.info("worker %s started (%s)", self.worker_id, self.mechanisms.describe())
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                jobs = await self._claim()
                for job in jobs:
                    self._start(job)
                if not jobs or self._claim_limit() == 0:
                    # Idle or full: wait for a poll tick, a finished handler, or a stop.
                    try:
                        await asyncio.wait_for(self._wake.wait(), self.settings.poll_seconds)
                    except TimeoutError:
                        pass
            await self._drain()
        except WorkerCrashed as crash:
            self._die(crash)
        return self.stats

    async def _claim(self) -> list[Job]:
        limit = self._claim_limit()
        if not limit:
            return []
        started = time.perf_counter()
        try:
            return await self.queue.claim(limit, self.worker_id, self.settings.lease_seconds,
                                          fleet_limit=self.settings.fleet_limit)
        except (psycopg.Error, PoolTimeout) as error:
            _reraise_if_cancelled()
            # The database is briefly unreachable or saturated: nothing was claimed; try again next tick.
            log.warning("worker %s could not claim: %s", self.worker_id, error)
            return []
        finally:
            self.stats.claim_calls += 1
            self.stats.claim_seconds_total += time.perf_counter() - started

    def _start(self, job: Job) -> None:
        self.stats.claimed += 1
        task = asyncio.create_task(self._handle(job), name=f"job-{job.id}")
        self._handlers.add(task)
        self.stats.in_flight_peak = max(self.stats.in_flight_peak, self.in_flight)
        task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task) -> None:
        self._handlers.discard(task)
        self._wake.set()
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, WorkerCrashed):
            self._die(error)
        elif error is not None:
            log.error("handler failed unexpectedly: %r", error)

    def _die(self, crash: WorkerCrashed) -> None:
        """Stop as a killed process would: no finalize, no lease release, nothing more claimed."""
        if self.stats.crashed_at is None:
            self.stats.crashed_at = crash.point
            log.warning("worker %s crashed (simulated) at %s", self.worker_id, crash.point)
        self._stopping.set()
        self._wake.set()
        self.successes.abandon()
        for task in list(self._handlers):
            task.cancel()

    async def _drain(self) -> None:
        """Let in-flight handlers finish within the grace period; abandon the rest to lease expiry."""
        if not self._handlers:
            return
        _, unfinished = await asyncio.wait(set(self._handlers), timeout=self.settings.shutdown_grace_seconds)
        for task in unfinished:
            task.cancel()
        self.stats.abandoned += len(unfinished)
        if unfinished:
            await asyncio.wait(unfinished)

    async def _handle(self, job: Job) -> None:
        await self.faults.reach("after_claim_before_effect", job, self.worker_id)
        # The lease is renewed while the effect runs. A worker stalled at a fault point renews
        # nothing, as a stopped process would not, so its lease can expire under it.
        effect_done = asyncio.Event()
        renewer = asyncio.create_task(self._keep_lease(job, effect_done)) if self.mechanisms.leases else None
        started = time.perf_counter()
        try:
            outcome = await self._perform(job)
        except Exception as error:  # an answer nobody foresaw: the charge may exist, so retry with the key
            outcome = ChargeOutcome("ambiguous", f"charge call failed: {type(error).__name__}")
        finally:
            self.stats.charge_calls += 1
            self.stats.charge_seconds_total += time.perf_counter() - started
            effect_done.set()
            if renewer:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
        await self.faults.reach("after_effect_before_finalize", job, self.worker_id)
        await self._finalize(job, outcome)

    async def _perform(self, job: Job) -> ChargeOutcome:
        """The job's effect, by its kind: a charge through the charge service, or nothing at all
        (`noop`, how `reliableq bench` measures the queue's own cost, as it measures the peers)."""
        if job.kind == "charge":
            return await self.charges.charge(job.id, job.payload)
        if job.kind == "noop":
            return ChargeOutcome("ok", "no-op")
        return ChargeOutcome("permanent", f"no handler for job kind {job.kind!r}")

    async def _succeed_group(self, jobs: list[Job]) -> list[bool]:
        self.stats.success_commits += 1
        won = await self.queue.succeed_many(jobs)
        return [won[job.id] for job in jobs]

    async def _keep_lease(self, job: Job, effect_done: asyncio.Event) -> None:
        """Renew until `effect_done`. The event, not only cancellation, ends the loop: psycopg can
        absorb a cancellation that lands mid-query, and a renewer that outlived its handler would
        keep a lease alive that nobody will ever finalize (the job stranded RUNNING)."""
        # A third of the lease: two renewals can fail or run late before the lease is lost.
        interval = self.settings.lease_seconds / 3
        while True:
            try:
                await asyncio.wait_for(effect_done.wait(), interval)
                return
            except TimeoutError:
                pass
            try:
                won = await self.queue.renew(job, self.settings.lease_seconds)
            except (psycopg.Error, PoolTimeout) as error:
                _reraise_if_cancelled()
                # Not a lost lease, just a failed attempt: try again while the lease may still be ours.
                log.warning("worker %s could not renew job %s: %s", self.worker_id, job.id, error)
                continue
            if not won:
                self.stats.lost_renewals += 1
                log.warning("worker %s lost the lease of job %s", self.worker_id, job.id)
                return

    async def _finalize(self, job: Job, outcome: ChargeOutcome) -> None:
        started = time.perf_counter()
        try:
            for attempt in range(FINALIZE_TRIES):
                try:
                    return await self._finalize_as_classified(job, outcome)
                except (psycopg.Error, PoolTimeout) as error:
                    # A database hiccup must not strand the job until its lease expires (or turn a
                    # committed charge into a DEAD job on the last attempt). A retried update is safe:
                    # it is fenced, and an attempt's recorded win is never overwritten.
                    _reraise_if_cancelled()
                    if attempt == FINALIZE_TRIES - 1:
                        raise
                    log.warning("worker %s could not finalize job %s: %s", self.worker_id, job.id, error)
                    await asyncio.sleep(FINALIZE_RETRY_SECONDS * 2**attempt)
        finally:
            self.stats.finalize_calls += 1
            self.stats.finalize_seconds_total += time.perf_counter() - started

    async def _finalize_as_classified(self, job: Job, outcome: ChargeOutcome) -> None:
        if outcome.kind == "ok":
            won, counter = await self.successes.submit(job), "succeeded"
        elif self.mechanisms.dead and outcome.kind == "permanent":
            won, counter = await self.queue.dead(job, f"permanent failure: {outcome.detail}"), "dead"
        elif self.mechanisms.dead and job.attempts >= job.max_attempts:
            error = f"gave up after {job.attempts} attempts; last: {outcome.kind}: {outcome.detail}"
            won, counter = await self.queue.dead(job, error), "dead"
        else:
            delay = self.backoff.delay(job.attempts, str(job.id)) if self.mechanisms.backoff else 0.0
            won, counter = await self.queue.retry(job, delay, f"{outcome.kind}: {outcome.detail}"), "retried"
        if won:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        else:
            self.stats.lost_finalizes += 1
            log.warning("worker %s: finalize (%s) of job %s refused: lease lost", self.worker_id, counter, job.id)


def _reraise_if_cancelled() -> None:
    """Called in an `except` for database errors: psycopg answers a cancelled query with QueryCanceled,
    so the task's cancellation can arrive dressed as a database error. Swallowing it would keep a
    renewer alive after its handler finished, renewing a lease nobody will ever finalize."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise
