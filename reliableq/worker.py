"""The worker: claims due jobs, runs their kind's handler, and finalizes each exactly as its lease allows.

One asyncio loop per worker. With the semaphore on, it claims only as many jobs as it has free permits
(reliableq/permits.py); each handler renews its lease every third of the lease from the start of its
effect until its finalize is recorded (reliableq/lease_keeper.py), runs the handler registered for the
job's kind (reliableq/handlers.py; a charge calls the charge service with the job's stable key), takes
its classified outcome and finalizes with a fenced update (succeed, retry with backoff, or DEAD, as
reliableq/finalize_decision.py decides), learning after a lost answer what its first try committed.
A success commits together with the claim of the job that takes its permit next (one commit a job under
steady load, where a claim and a success took one each).
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
from dataclasses import dataclass, field

import psycopg
from psycopg_pool import PoolTimeout

from reliableq.backoff import Backoff, RetryDelays
from reliableq.cancelling import cancel_and_wait, event_set_within
from reliableq.config import WorkerSettings
from reliableq.finalize_decision import FinalizeDecision, decide
from reliableq.group_commit import GroupCommitter
from reliableq.handlers import HandlerRegistry, Outcome
from reliableq.hooks import FaultHook, SimulatedCrash
from reliableq.lease_keeper import LeaseKeeper, reraise_if_cancelled
from reliableq.permits import ClaimPermits, Permits, Unlimited
from reliableq.queue import Job, Queue
from reliableq.wake import IdleMark, listen_for_submissions

log = logging.getLogger("reliableq.worker")
FINALIZE_TRIES = 4  # a finalize that meets a database error is tried again, 0.1 s, 0.2 s, 0.4 s later
FINALIZE_RETRY_SECONDS = 0.1
_worker_numbers = itertools.count(1)
Claimed = tuple[Job, float]  # a job this worker claimed, and when (loop time) that claim was sent


@dataclass
class WorkerStats:
    claimed: int = 0
    claimed_with_a_success: int = 0  # of those, claimed in the commit of a success whose permit they took
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost_finalizes: int = 0  # finalizes a fenced update refused (a stale owner)
    lost_renewals: int = 0
    # Jobs whose claim this worker lost because its lease ran out before a renewal landed: this process or
    # its database was too slow for the lease (LeaseKeeper.ran_out_unrenewed), not a claim taken from it.
    ran_out_unrenewed: list[str] = field(default_factory=list)
    abandoned: int = 0  # handlers cut off at shutdown; their leases expire
    in_flight_peak: int = 0
    crashed_at: str | None = None  # the fault point a simulated crash stopped this worker at
    # Always-on timing counters (perf_counter seconds), so a benchmark can say where a job's time went;
    # a sum and a count each, cheap enough to keep in production.
    claim_calls: int = 0  # claim transactions, empty ones included
    claim_seconds_total: float = 0.0
    handler_calls: int = 0  # handler runs, whatever the kind (a charge's HTTP call included)
    handler_seconds_total: float = 0.0
    finalize_calls: int = 0  # succeed/retry/dead updates, lost ones included
    success_commits: int = 0  # commits of grouped successes (several jobs each under load)
    finalize_seconds_total: float = 0.0

    def summary(self) -> str:
        return (f"claimed {self.claimed}, succeeded {self.succeeded}, retried {self.retried}, dead {self.dead}, "
                f"lost finalizes {self.lost_finalizes}, abandoned to lease expiry {self.abandoned}")


class Worker:
    def __init__(self, queue: Queue, handlers: HandlerRegistry, settings: WorkerSettings = WorkerSettings(),
                 faults: FaultHook | None = None, backoff: RetryDelays | None = None,
                 decision: FinalizeDecision | None = None, permits: ClaimPermits | None = None,
                 stats: WorkerStats | None = None) -> None:
        """`backoff`: the retry delays to use instead of the settings' Backoff (anything with the same
        `delay(attempt, job_key)`); `decision`: succeed, retry or dead instead of finalize_decision.decide;
        `permits`: instead of Permits(settings.concurrency). The lab's exercises plug a learner's policy in
        here. `stats`: where to count, fresh (reliableq/metrics.py passes a subclass that feeds histograms)."""
        self.queue = queue
        self.mechanisms = queue.mechanisms
        self.handlers = handlers
        self.settings = settings
        self.faults = faults or FaultHook()
        self.worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{next(_worker_numbers)}"
        self.backoff = backoff or Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds,
                                          settings.backoff_seed)
        self.decide = decision or decide
        # With the semaphore off nothing bounds a claim, and the permits (a learner's, in the lab) are not
        # asked at all: a Permits is only ever driven by its own contract, whatever else is switched off.
        self.permits = ((permits or Permits(settings.concurrency)) if self.mechanisms.semaphore
                        else Unlimited(settings.unbounded_claim_limit))
        # A success hands its permit straight to a job claimed in its own commit (one commit a job where a
        # claim and a success took one each), so the permits see one job where a chain of them ran. Not with
        # a learner's pieces in play (permits, SQL): they are driven exactly as the lab describes, a claim
        # after asking the permits, each statement on its own.
        self._successes_claim = (permits is None and not queue.replaced_queries and self.mechanisms.semaphore
                                 and self.mechanisms.skip_locked and settings.fleet_limit is None)
        # One claim at a time, the loop's or a success's: what the lab's fairness ledger reads claims by.
        self._claiming = asyncio.Lock()
        self._stalled = False
        self.stats = stats or WorkerStats()
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
        if not self._stopping.is_set():
            log.info("worker %s stopping: claiming nothing more, in-flight jobs have %g s to finish",
                     self.worker_id, self.settings.shutdown_grace_seconds, extra={"worker_id": self.worker_id})
        self._stopping.set()
        self._wake.set()

    @property
    def stalled(self) -> bool:
        """Whether this worker can never claim again: its last decision found no permit free and no job in
        flight to give one back (a permit taken and never released). Read from that decision, never by
        asking free() again: free() is asked once per decision, by the loop."""
        return self._stalled

    async def run(self) -> WorkerStats:
        """Claim and handle jobs until stopped or crashed; returns what this worker did."""
        log.info("worker %s started (%s)", self.worker_id, self.mechanisms.describe(),
                 extra={"worker_id": self.worker_id})
        listener = (asyncio.create_task(listen_for_submissions(self.queue.pool, self._wake.set, self.worker_id))
                    if self.settings.wake_on_submit else None)
        idle = IdleMark(self.queue, self.worker_id, self.settings.poll_seconds)
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                # One free() per decision, and taken(n) never for more than it said.
                limit = self.permits.free()
                self._stalled = limit <= 0 and self.in_flight == 0
                claim_sent_at = asyncio.get_running_loop().time()
                async with self._claiming:
                    answer = await self._claim(limit)
                jobs = answer or []
                if jobs:
                    self.permits.taken(len(jobs))
                self._count_claimed(jobs)
                for job in jobs:
                    self._start(job, claim_sent_at)
                # Only after an answered claim: in an outage a mark would wait out the pool's timeout too.
                if (listener is not None and limit > 0 and answer is not None
                        and await idle.after_claim(found_nothing=not jobs)):
                    continue  # just said it is idle: look once more before waiting
                if not jobs or len(jobs) >= limit:
                    # Idle or full: wait for a poll tick, a submission, a finished handler, or a stop.
                    await event_set_within(self._wake, self.settings.poll_seconds)
            await self._drain()
        except SimulatedCrash as crash:
            self._die(crash)
            return self.stats
        except asyncio.CancelledError:
            # Stopped without grace (a lab run the user stopped): as a killed process would, wherever it was
            # (a claim or a handler paused for good included); its jobs are left to lease expiry.
            self._abandon()
            await cancel_and_wait(self._handlers)
            raise
        finally:
            if listener is not None:
                listener.cancel()
                await asyncio.wait({listener})  # its connection closed before the worker says it stopped
        if idle.marked:  # not after a crash: a killed worker's mark stays until it runs out
            await idle.unmark()
        log.info("worker %s stopped: %s", self.worker_id, self.stats.summary(), extra={"worker_id": self.worker_id})
        return self.stats

    async def _claim(self, limit: int) -> list[Job] | None:
        """At most `limit` jobs claimed (none without a free permit), or None when the database did not
        answer."""
        if limit <= 0:
            return []
        started = time.perf_counter()
        try:
            return await self.queue.claim(limit, self.worker_id, self.settings.lease_seconds,
                                          fleet_limit=self.settings.fleet_limit)
        except (psycopg.Error, PoolTimeout) as error:
            reraise_if_cancelled()
            # The database is briefly unreachable or saturated: nothing was claimed; try again next tick.
            log.warning("worker %s could not claim: %s", self.worker_id, error, extra={"worker_id": self.worker_id})
            return None
        finally:
            self.stats.claim_calls += 1
            self.stats.claim_seconds_total += time.perf_counter() - started

    def _count_claimed(self, jobs: list[Job]) -> None:
        self.stats.claimed += len(jobs)
        for job in jobs:
            log.debug("worker %s claimed job %s (attempt %d)", self.worker_id, job.id, job.attempts,
                      extra={"worker_id": self.worker_id, "job_id": job.id})

    def _start(self, job: Job, claim_sent_at: float) -> None:
        task = asyncio.create_task(self._handle(job, claim_sent_at), name=f"job-{job.id}")
        self._handlers.add(task)
        self.stats.in_flight_peak = max(self.stats.in_flight_peak, self.in_flight)
        task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task) -> None:
        self._handlers.discard(task)
        self.permits.released()
        self._wake.set()
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, SimulatedCrash):
            self._die(error)
        elif error is not None:
            log.error("handler failed unexpectedly: %r", error)

    def _die(self, crash: SimulatedCrash) -> None:
        if self.stats.crashed_at is None:
            self.stats.crashed_at = crash.point
            log.warning("worker %s crashed (simulated) at %s", self.worker_id, crash.point,
                        extra={"worker_id": self.worker_id})
        self._abandon()

    def _abandon(self) -> None:
        """Stop as a killed process would: no finalize, no lease release, nothing more claimed."""
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

    async def _handle(self, job: Job, claim_sent_at: float) -> None:
        """Run `job`, then each job its success claimed in its place, on one permit."""
        claimed: Claimed | None = (job, claim_sent_at)
        while claimed is not None:
            claimed = await self._handle_one(*claimed)

    async def _handle_one(self, job: Job, claim_sent_at: float) -> Claimed | None:
        """Run one claimed job to its finalize; the job its success claimed in its place, if any."""
        await self.faults.reach("after_claim_before_effect", job, self.worker_id)
        lease = LeaseKeeper(self.queue, job, self.settings.lease_seconds, renewing=self.mechanisms.leases,
                            fleet_limited=self.settings.fleet_limit is not None, on_lost=self._lease_lost,
                            claim_sent_at=claim_sent_at)
        async with lease:
            outcome = await self._run_effect(job)
            # A handler stalled here stands for a stopped process: it renews nothing, and its lease may
            # run out under it (the story of stages fencing and idempotency).
            with lease.suspended():
                await self.faults.reach("after_effect_before_finalize", job, self.worker_id)
            lease.finalizing()
            won, successor = await self._finalize(job, outcome)
            if not won:
                lease.refused()
                if lease.ran_out_unrenewed:
                    self.stats.ran_out_unrenewed.append(str(job.id))
        return successor

    def _lease_lost(self) -> None:
        self.stats.lost_renewals += 1

    async def _run_effect(self, job: Job) -> Outcome:
        started = time.perf_counter()
        try:
            await self.faults.reach("during_effect", job, self.worker_id)
            return await self.handlers.handle(job)
        except Exception as error:  # an answer nobody foresaw: the effect may exist, so retry with the key
            return Outcome("ambiguous", f"handler failed: {type(error).__name__}")
        finally:
            self.stats.handler_calls += 1
            self.stats.handler_seconds_total += time.perf_counter() - started

    async def _succeed_group(self, group: list[tuple[Job, bool]]) -> list[tuple[bool, Claimed | None]]:
        """Each (job, whether its permit may pass to a job claimed in the same commit): whether its success
        won, and the job claimed in its place."""
        self.stats.success_commits += 1
        jobs = [job for job, _ in group]
        for job in jobs:
            await self.faults.reach("before_group_commit", job, self.worker_id)
        # Asked after the fault point: a group held back there claims nothing for a worker told to stop
        # meanwhile. A success does not wait for the loop's claim: its permit goes back to the loop instead.
        permits_passing = (0 if self._stopping.is_set() or self._claiming.locked()
                           else sum(passes for _, passes in group))
        if not permits_passing:
            return [(won, None) for won in await self.queue.succeed_many(jobs)]
        async with self._claiming:
            claim_sent_at = asyncio.get_running_loop().time()
            try:
                won, claimed = await self.queue.succeed_and_claim(jobs, permits_passing, self.worker_id,
                                                                  self.settings.lease_seconds)
            except (psycopg.Error, PoolTimeout) as error:
                reraise_if_cancelled()
                won, claimed = await self._what_the_commit_did(jobs, error)
        self._count_claimed(claimed)
        self.stats.claimed_with_a_success += len(claimed)
        successors = iter(claimed)  # no more than the permits passing: the claim's limit
        finalized = []
        for (_, passes), finalize_won in zip(group, won, strict=True):
            successor = next(successors, None) if passes else None
            finalized.append((finalize_won, None if successor is None else (successor, claim_sent_at)))
        return finalized

    async def _what_the_commit_did(self, jobs: list[Job], error: Exception) -> tuple[list[bool], list[Job]]:
        """A success-and-claim commit failed, or its answer was lost. If it committed (its successes are on
        record: all or none), the jobs it claimed are this worker's and nobody else will run them before
        their lease runs out: find them. Otherwise, or when the database cannot say, `error` is raised and
        each success is tried again as any failed finalize is."""
        try:
            recorded = [await self.queue.finalize_recorded(job) for job in jobs]
            committed = all(record is not None for record in recorded)
            claimed = await self.queue.claimed_with_success(jobs[0], self.worker_id) if committed else []
        except (psycopg.Error, PoolTimeout):
            reraise_if_cancelled()
            raise error from None
        if not committed:
            raise error
        log.warning("worker %s could not finalize %d job(s) and claim the next: %s; the commit is on record, "
                    "with %d job(s) claimed", self.worker_id, len(jobs), error, len(claimed),
                    extra={"worker_id": self.worker_id})
        return [finalize_won for _, finalize_won in recorded], claimed

    async def _finalize(self, job: Job, outcome: Outcome) -> tuple[bool, Claimed | None]:
        """Finalize `job` as `outcome` classifies it: whether this claim's finalize won, and the job its
        success claimed in its place (with when that claim was sent), if any."""
        started = time.perf_counter()
        try:
            operation, won, successor = await self._finalize_with_retries(job, outcome)
        finally:
            self.stats.finalize_calls += 1
            self.stats.finalize_seconds_total += time.perf_counter() - started
        if won:
            counter = _COUNTER_OF_OPERATION[operation]
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            log.debug("worker %s finished job %s: %s", self.worker_id, job.id, operation,
                      extra={"worker_id": self.worker_id, "job_id": job.id})
        else:
            self.stats.lost_finalizes += 1
            log.warning("worker %s: finalize (%s) of job %s refused: its lease was lost",
                        self.worker_id, operation, job.id, extra={"worker_id": self.worker_id, "job_id": job.id})
        return won, successor

    async def _finalize_with_retries(self, job: Job, outcome: Outcome) -> tuple[str, bool, Claimed | None]:
        """(operation, won, successor). A database hiccup must not strand the job until its lease expires (or
        turn a committed charge into a DEAD job on the last attempt), so a failed finalize is tried again.
        The failure may have hidden a COMMIT that succeeded (its answer lost): before trying again, read what
        this claim's record says, or the fence would refuse the retry and report a win as a loss. A retry
        claims nothing in its commit: a claim that keeps failing must not keep a success from committing."""
        tries = 0
        while True:
            try:
                if tries:
                    recorded = await self.queue.finalize_recorded(job)
                    if recorded is not None:
                        return *recorded, None
                return await self._finalize_as_classified(job, outcome, first_try=not tries)
            except (psycopg.Error, PoolTimeout) as error:
                reraise_if_cancelled()
                tries += 1
                if tries == FINALIZE_TRIES:
                    raise
                log.warning("worker %s could not finalize job %s: %s", self.worker_id, job.id, error,
                            extra={"worker_id": self.worker_id, "job_id": job.id})
                await asyncio.sleep(FINALIZE_RETRY_SECONDS * 2 ** (tries - 1))

    async def _finalize_as_classified(self, job: Job, outcome: Outcome,
                                      first_try: bool) -> tuple[str, bool, Claimed | None]:
        # With DEAD off nothing is ever given up on, and the decision (a learner's, in the lab) is not asked:
        # a piece is in play only with its mechanism on.
        decision = (self.decide(outcome.kind, job.attempts, job.max_attempts) if self.mechanisms.dead
                    else "succeed" if outcome.kind == "ok" else "retry")
        if decision == "succeed":
            won, successor = await self.successes.submit((job, first_try and self._successes_claim))
            return "succeed", won, successor
        if decision == "dead":
            error = (f"permanent failure: {outcome.detail}" if outcome.kind == "permanent" else
                     f"gave up after {job.attempts} attempts; last: {outcome.kind}: {outcome.detail}")
            return "dead", await self.queue.dead(job, error), None
        delay = 0.0
        if self.mechanisms.backoff:  # backing off includes waiting as long as the dependency asked
            delay = max(self.backoff.delay(job.attempts, str(job.id)), outcome.retry_after_seconds or 0.0)
        return "retry", await self.queue.retry(job, delay, f"{outcome.kind}: {outcome.detail}"), None


# The counter a won finalize adds to.
_COUNTER_OF_OPERATION = {"succeed": "succeeded", "retry": "retried", "dead": "dead"}
