"""Forced schedules in PostgreSQL for the queue-SQL exercises (skip-locked, leases, fencing): the
interleavings a run meets only by luck, made to happen on every check, as PostgreSQL's isolation tester
makes them. Each statement under test runs on a connection of its own whose backend pid the schedule
knows, so it can see that statement wait (pg_blocking_pids) instead of guessing with a sleep.

What is here: a scratch queue; a barrier that holds every update of a job row until the check lets go
(claims that read at the same moment); a transaction held open while another statement meets its locks;
the domain of job states a claim meets (due, not yet due, leased live, lease run out before, on and past
the last attempt, finished), laid out on the database's own clock and judged job by job. Time is never
waited for: a lease runs out because the check writes its expiry into the past, an hour away from any
clock a right answer may read (now(), clock_timestamp(), %(now)s), so they all give one verdict. What this
does not do: decide what an exercise's checks are called (each exercise says that).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from reliableq import db, sql
from reliableq.config import Mechanisms
from reliableq.lab.invariants import Check
from reliableq.lab.scenario import job_labels
from reliableq.lab.waiting import wait_until
from reliableq.payload import DEFAULT_TENANT, Submission
from reliableq.queue import Job, Queue
from reliableq.scratch import scratch_databases

_S = sql.queries("lab_schedules")
SETTLE_SECONDS = 10.0  # statements under test wait or return in milliseconds; this is only a backstop
# A session under test is cancelled past this (a lock wait included), so a learner's wait cannot hang the
# check; deadlock_timeout (1 s) is well inside it, so a deadlock is reported as one.
STATEMENT_TIMEOUT = "-c statement_timeout=15s"
HOUR = 3600.0  # how far from now a schedule puts due times and expiries: beyond any clock's drift


class OneConnection:
    """A pool of one connection, for a Queue whose statements must run on a connection the schedule
    controls: its backend pid is known, and (not in autocommit) its transaction stays open, locks and all,
    until the schedule commits it."""

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        yield self.conn


@dataclass
class Scratch:
    """A scratch queue database for one exercise's schedules: its URL, a pool for the check's own reads
    and set-up, and a Queue over it with the shipped queries."""

    url: str
    pool: Any
    shipped: Queue
    labels: dict[str, str] = field(default_factory=dict)  # job id (text) -> job-N, in submission order

    def label(self, job_id: uuid.UUID) -> str:
        return self.labels[str(job_id)]

    async def connect(self, autocommit: bool = True) -> psycopg.AsyncConnection:
        """A connection of its own for a statement under test, bounded by STATEMENT_TIMEOUT."""
        return await psycopg.AsyncConnection.connect(self.url, autocommit=autocommit, options=STATEMENT_TIMEOUT)

    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[dict]:
        async with self.pool.connection() as conn:
            cursor = await conn.cursor(row_factory=dict_row).execute(_S[name], params)
            return await cursor.fetchall() if cursor.description else []

    async def blockers(self, pid: int) -> list[int]:
        return (await self.run("lab_session_blockers", {"pid": pid}))[0]["blockers"]

    async def submit(self, n: int, max_attempts: int = 5, tenant: str = DEFAULT_TENANT) -> list[uuid.UUID]:
        charges = [Submission({"amount_cents": 1000 + i, "currency": "USD"}, max_attempts, kind="charge",
                              tenant=tenant) for i in range(n)]
        ids = [(await self.shipped.submit(charge)).id for charge in charges]
        self.labels |= {str(job_id): f"job-{len(self.labels) + 1 + i}" for i, job_id in enumerate(ids)}
        return ids

    async def lapse(self, ids: list[uuid.UUID]) -> None:
        """Each job RUNNING under worker-0's claim, its lease run out an hour ago, one attempt of five left."""
        for job_id in ids:
            await self.run("lab_job_put", {"job_id": job_id, "status": "RUNNING", "attempts": 1, "max_attempts": 5,
                                           "run_in_seconds": -HOUR, "lease_in_seconds": RAN_OUT,
                                           "worker_id": "worker-0", "lease_token": None, "outcome": None})

    async def run_out(self, job: Job, ago_seconds: float = HOUR) -> None:
        """The lease of `job` (a claim) ran out `ago_seconds` ago, written rather than waited for."""
        await self.run("lab_job_lease_run_out", {"lease_token": job.lease_token, "ago_seconds": ago_seconds})



@asynccontextmanager
async def scratch(mechanisms: Mechanisms = Mechanisms()) -> AsyncIterator[Scratch]:
    with scratch_databases("rq_exercise") as databases:
        async with await db.open_pool_checked(databases.queue_url, max_size=2) as pool:
            yield Scratch(databases.queue_url, pool, Queue(pool, mechanisms))


def lab_query(name: str) -> str:
    """One of sql/lab_schedules.sql's queries, for a statement a schedule runs on a connection of its own."""
    return _S[name]


async def waiting_or_done(scratch: Scratch, statements: Mapping[str, tuple[asyncio.Task, int]],
                          holders: Mapping[int, str] | None = None) -> dict[str, list[str]]:
    """Poll until each statement (name -> its task and backend pid) has returned or waits for a lock;
    then, per statement waiting for another of them or for one of `holders` (backend pid -> name: a
    transaction the schedule holds open as a claimer would), the names of those. Waiting for a barrier
    is the schedule, not a finding. If none of that comes, every statement's task is cancelled (not left
    running on a connection about to close) and TimeoutError raised."""
    names = {pid: name for name, (_, pid) in statements.items()} | dict(holders or {})

    async def settled() -> tuple[dict[str, list[str]]] | None:
        waits: dict[str, list[str]] = {}
        for name, (task, pid) in statements.items():
            if task.done():
                continue
            blockers = await scratch.blockers(pid)
            if not blockers:
                return None  # not yet at its first lock, or between two
            waits[name] = [names[b] for b in blockers if b in names]
        return (waits,)  # truthy once settled, even with nobody waiting
    try:
        (waits,) = await wait_until(settled, SETTLE_SECONDS, "each statement of the schedule to return or wait")
    except TimeoutError:
        for task, _ in statements.values():
            task.cancel()
        raise
    return {name: others for name, others in waits.items() if others}


async def outcome(task: Awaitable[Any]) -> tuple[Any, str | None]:
    """What a statement under test returned, or PostgreSQL's message if it failed (a deadlock, NOWAIT's
    refusal, a cancelled wait)."""
    try:
        return await asyncio.wait_for(task, SETTLE_SECONDS * 2), None
    except psycopg.Error as error:
        return None, error.diag.message_primary or str(error)


@asynccontextmanager
async def barrier(scratch: Scratch) -> AsyncIterator[int]:
    """Every update of a job row waits (its row locked) until the block ends; yields the backend pid of
    the session holding the barrier. Statements started inside the block have all read their rows before
    any of them has written one (where the plan reads before it writes, as the claim's join does)."""
    await scratch.run("lab_barrier_install")
    try:
        async with await scratch.connect() as holder:
            await holder.execute(_S["lab_barrier_close"])
            try:
                yield holder.info.backend_pid
            finally:
                await holder.execute(_S["lab_barrier_open"])
    finally:
        await scratch.run("lab_barrier_remove")


async def claim_once(conn: psycopg.AsyncConnection, text: str, *, worker_id: str, limit: int,
                     reclaim_expired: bool, enforce_budget: bool, lease_seconds: float | None = 30.0) -> list[dict]:
    """The claim `text` run once on `conn` with the parameters the queue gives it (Queue.claim), `now`
    NULL: PostgreSQL's own clock. Run directly, not through Queue.claim, so no other statement (the dead
    stage's sweep of exhausted jobs) decides for it."""
    cursor = await conn.cursor(row_factory=dict_row).execute(text, {
        "now": None, "limit": limit, "reclaim_expired": reclaim_expired, "enforce_budget": enforce_budget,
        "worker_id": worker_id, "lease_seconds": lease_seconds})
    return await cursor.fetchall()


@dataclass(frozen=True)
class JobState:
    """A state a claim may meet a job in, and whether it is due."""

    said: str  # the state, in words a learner can read
    status: str
    attempts: int = 0
    max_attempts: int = 3
    run_in_seconds: float = -60.0
    lease_in_seconds: float | None = None  # None: no lease; negative: it ran out that long ago
    expired: bool = False  # a RUNNING job whose lease ran out
    over_budget: bool = False  # ... on its last attempt or past it
    outcome: str | None = None  # the outcome on record of its current claim (None: open)

    def due(self, reclaim_expired: bool, enforce_budget: bool) -> bool:
        if self.status == "PENDING":
            return self.run_in_seconds <= 0
        return self.expired and reclaim_expired and not (enforce_budget and self.over_budget)

    def why(self, reclaim_expired: bool, enforce_budget: bool) -> str:
        """Why a claim must take it, or leave it."""
        if self.status in ("SUCCEEDED", "DEAD"):
            return "it is finished"
        if self.status == "PENDING":
            return "its time has come" if self.run_in_seconds <= 0 else "its run_at is still ahead (a retry's backoff)"
        if not self.expired:
            return "its lease is live: another worker is running it"
        if not reclaim_expired:
            return "leases are off (reclaim_expired false)"
        if self.over_budget:
            return ("enforce_budget is on and no attempt is left (stage dead makes it DEAD)" if enforce_budget
                    else "its lease ran out, and enforce_budget is off (retried for ever)")
        return "its lease ran out and an attempt is left"


RAN_OUT = -HOUR
# No state sits on a boundary instant (run_at or an expiry exactly the claim's now()): a claim due there
# by `<=` and one due a moment later by `<` differ by nothing a worker could see, so both are right.
STATES = (
    JobState("PENDING, due", "PENDING"),
    JobState("PENDING, run_at an hour ahead", "PENDING", run_in_seconds=HOUR),
    JobState("RUNNING, lease live for an hour more, attempt 1 of 3", "RUNNING", 1, lease_in_seconds=HOUR),
    JobState("RUNNING, lease ran out, attempt 2 of 3 (the one before its last)", "RUNNING", 2,
             lease_in_seconds=RAN_OUT, expired=True),
    JobState("RUNNING, lease ran out and its renewal came too late (lost_renew), attempt 2 of 3", "RUNNING", 2,
             lease_in_seconds=RAN_OUT, expired=True, outcome="lost_renew"),
    JobState("RUNNING, lease ran out, attempt 3 of 3 (its last)", "RUNNING", 3, lease_in_seconds=RAN_OUT,
             expired=True, over_budget=True),
    JobState("RUNNING, lease ran out, attempt 4 of 3 (past its budget)", "RUNNING", 4, lease_in_seconds=RAN_OUT,
             expired=True, over_budget=True),
    JobState("SUCCEEDED", "SUCCEEDED", 1, outcome="succeeded"),
    JobState("DEAD, its lease ran out on its last attempt", "DEAD", 3, lease_in_seconds=RAN_OUT, outcome="expired"),
)
# Each state's lease token (PENDING jobs have none), in STATES order: the live lease's below every token a
# claim takes over, the unclaimable ones above, so that a claim matching the claims it closes by `<`, `>`
# or `<>` instead of `=` closes another job's claim, every time.
TOKENS = tuple(uuid.UUID(int=n + 1) for n in range(len(STATES)))



@dataclass
class DomainRun:
    """One claim over every state of STATES: which it took, and the claims it took over, as recorded."""

    reclaim_expired: bool
    enforce_budget: bool
    states: dict[uuid.UUID, JobState]  # job id -> the state it was laid out in
    labels: dict[str, str]  # job id (text) -> job-N
    taken: set[uuid.UUID]
    closed: dict[uuid.UUID, str | None]  # job id of each expired job taken -> the outcome of the claim taken over
    others_closed: list[dict] = field(default_factory=list)  # claims of jobs not taken, changed by the claim
    claimed_wrong: list[dict] = field(default_factory=list)  # jobs taken, not left as a claim must leave them

    def switches(self) -> str:
        return (f"reclaim_expired {'on' if self.reclaim_expired else 'off'}, "
                f"enforce_budget {'on' if self.enforce_budget else 'off'}")

    def took_not_due(self) -> list[dict]:
        return [self._row(job_id, "claimed it", "leave it") for job_id in self.states
                if job_id in self.taken and not self._due(job_id)]

    def left_due(self) -> list[dict]:
        return [self._row(job_id, "left it", "claim it") for job_id in self.states
                if job_id not in self.taken and self._due(job_id)]

    def not_closed(self) -> list[dict]:
        return [{"job": self.labels[str(job_id)], "was": self.states[job_id].said,
                 "the claim taken over": outcome or "left open", "right": "expired"}
                for job_id, outcome in self.closed.items() if outcome != "expired"]

    def _due(self, job_id: uuid.UUID) -> bool:
        return self.states[job_id].due(self.reclaim_expired, self.enforce_budget)

    def _row(self, job_id: uuid.UUID, yours: str, right: str) -> dict:
        state = self.states[job_id]
        return {"job": self.labels[str(job_id)], "was": state.said, "with": self.switches(), "yours": yours,
                "right": f"{right}: {state.why(self.reclaim_expired, self.enforce_budget)}"}


DOMAIN_LEASE_SECONDS = 30.0  # the lease the domain's claim gives, apart from its limit and every other number
CLOCK_SLACK = 0.05  # seconds: a claim's own clock reads and the reads around it


async def claim_over_every_state(scratch: Scratch, claim: str, reclaim_expired: bool,
                                 enforce_budget: bool) -> DomainRun:
    """Lay out one job in each of STATES (the database emptied first) and run `claim` once, asking for
    more jobs than there are, in one transaction (the layout's clock is the claim's). Then judge what
    it left: each job it took RUNNING for worker-1 with one more attempt, a fresh token, a lease of
    DOMAIN_LEASE_SECONDS from the claim and the new claim on record; the claim it took over closed; every
    other job's claim as it was."""
    await scratch.run("lab_jobs_clear")
    ids = await scratch.submit(len(STATES))
    states = dict(zip(ids, STATES, strict=True))
    tokens = dict(zip(ids, TOKENS, strict=True))
    async with await scratch.connect(autocommit=False) as conn:
        for job_id, state in states.items():
            await conn.execute(_S["lab_job_put"], {
                "job_id": job_id, "status": state.status, "attempts": state.attempts,
                "max_attempts": state.max_attempts, "run_in_seconds": state.run_in_seconds,
                "lease_in_seconds": state.lease_in_seconds, "worker_id": "worker-0", "lease_token": tokens[job_id],
                "outcome": state.outcome})
        rows = await claim_once(conn, claim, worker_id="worker-1", limit=len(STATES) * 2,
                                reclaim_expired=reclaim_expired, enforce_budget=enforce_budget,
                                lease_seconds=DOMAIN_LEASE_SECONDS)
        clock = await (await conn.cursor(row_factory=dict_row).execute(_S["lab_clock"])).fetchone()
        await conn.commit()
    labels = job_labels(ids)
    taken = {row["id"] for row in rows}
    closed, others_closed, claimed_wrong = {}, [], []
    lease = timedelta(seconds=DOMAIN_LEASE_SECONDS)
    slack = timedelta(seconds=CLOCK_SLACK)
    for job_id, state in states.items():
        records = await scratch.shipped.attempts_of(job_id)
        said = {"job": labels[str(job_id)], "was": state.said}
        if job_id not in taken:
            changed = [r["outcome"] for r in records if r["outcome"] != state.outcome]
            if changed or len(records) != (0 if state.status == "PENDING" else 1):
                yours = (f"left it, yet its claim on record became {changed[0]}" if changed
                         else f"left it, yet it has {len(records)} claims on record")
                others_closed.append(said | {"yours": yours,
                                             "right": "the claim takes over no claim of a job it does not take"})
            continue
        if state.expired:
            closed[job_id] = records[0]["outcome"]
        job = await scratch.shipped.get(job_id)
        new = [r for r in records if r["lease_token"] == job.lease_token]
        wrong = []
        if job.status != "RUNNING":
            wrong.append(f"status {job.status}")
        if job.worker_id != "worker-1":
            wrong.append(f"worker_id {job.worker_id!r} (the claimer is 'worker-1')")
        if job.attempts != state.attempts + 1:
            wrong.append(f"attempts {job.attempts} (it was {state.attempts})")
        if job.lease_token is None or (state.status != "PENDING" and job.lease_token == tokens[job_id]):
            wrong.append("no fresh lease token")
        expires = job.lease_expires_at
        if expires is None or not clock["now"] + lease - slack <= expires <= clock["clock"] + lease + slack:
            wrong.append("lease never expires" if expires is None else
                         f"lease expires {(expires - clock['now']).total_seconds():.0f} s after the claim "
                         f"(lease_seconds {DOMAIN_LEASE_SECONDS:g})")
        if len(new) != 1 or new[0]["outcome"] is not None or new[0]["attempt"] != job.attempts \
                or new[0]["worker_id"] != job.worker_id:
            wrong.append("its new claim not on record as opened (attempt, worker, token, no outcome)")
        if wrong:
            claimed_wrong.append(said | {"yours": "; ".join(wrong)})
    return DomainRun(reclaim_expired, enforce_budget, states, labels, taken, closed, others_closed, claimed_wrong)


def domain_checks(runs: list[DomainRun], closing: bool = False) -> list[Check]:
    """The verdicts of claims over every state: took a job that is not due, left a due one, and
    (`closing`) left open the expired claim it took over."""
    checks = [Check("a claim takes only due jobs: never one whose run_at is ahead, one under a live lease, one "
                    "with no attempt left (enforce_budget on), or a finished one",
                    [row for run in runs for row in run.took_not_due()]),
              Check("a claim takes the due jobs it is asked for: PENDING ones whose time has come, RUNNING ones "
                    "whose lease ran out (with an attempt left, or enforce_budget off)",
                    [row for run in runs for row in run.left_due()])]
    if closing:
        checks.append(Check("the claim a reclaim takes over is closed as expired (whether open or its renewal "
                            "lost)", [row for run in runs for row in run.not_closed()]))
    checks += [Check("a claim closes no claim but the ones it takes over",
                     [row for run in runs for row in run.others_closed]),
               Check("a claim leaves each job it takes RUNNING for its worker: one more attempt, a fresh lease token, "
                     "a lease of lease_seconds from the claim on PostgreSQL's clock, the new claim on record",
                     [row for run in runs for row in run.claimed_wrong])]
    return checks
