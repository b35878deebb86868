"""The queue repository: every read and write of the jobs tables, as the mechanisms dictate.

Each method is one short transaction that commits before it returns, so no caller ever holds a
database transaction across a network call. Ownership-sensitive updates (renew, succeed, retry, dead)
report whether they won; with fencing on, a stale lease token makes them affect zero rows, and the
loss is written on that attempt's row. Time comes from PostgreSQL; `now` parameters exist only so
tests can move the database's clock. This module does not call the charge service or decide retries.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.hooks import FaultHook
from reliableq.payload import Submission
from reliableq.position import ListPosition

STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "DEAD")
MAX_ERROR_CHARS = 500
_Q = sql.statements("queue")
# How often one Queue's claims also make DEAD the jobs whose lease ran out on their last attempt (claims
# never take those, so the sweep only decides how soon they show as DEAD): a statement per claim was a
# tenth of a no-op job's time at one permit.
SWEEP_SECONDS = 1.0


@dataclass(frozen=True)
class Job:
    id: uuid.UUID
    payload: dict[str, Any]
    status: str
    attempts: int
    max_attempts: int
    run_at: datetime
    lease_token: uuid.UUID | None
    lease_expires_at: datetime | None
    worker_id: str | None
    last_error: str | None
    idempotency_key: str
    created_at: datetime
    updated_at: datetime
    finalized_at: datetime | None
    kind: str
    tenant: str

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        return cls(**{f.name: row[f.name] for f in fields(cls)})

    def as_json(self) -> dict[str, Any]:
        return json_row({f.name: getattr(self, f.name) for f in fields(self)})


def idempotency_key(kind: str, job_id: uuid.UUID) -> str:
    """The key `jobs.idempotency_key` holds for a job (a generated column: sql/migrations/queue/0003), for
    an answer given before its row exists: the same on every attempt and after a replay, and naming the
    job's kind, which a kind's handler sends to the service that makes its effect."""
    return f"reliableq:{kind}:{job_id}"


def batch_document(submissions: Sequence[Submission], job_ids: Sequence[uuid.UUID]) -> Jsonb:
    """A batch as the one JSON document sql/queue.sql's fragment submitted_jobs reads: an object per job, a
    job with an idempotency key with its key and its body's fingerprint."""
    return Jsonb([{"id": str(job_id), "kind": s.kind, "payload": s.payload, "max_attempts": s.max_attempts,
                   "tenant": s.tenant} | ({"key": s.key, "fingerprint": s.fingerprint()} if s.key is not None else {})
                  for s, job_id in zip(submissions, job_ids, strict=True)])


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """A database row as JSON-ready values: ids and times as strings."""
    return {key: str(value) if isinstance(value, uuid.UUID) else value.isoformat() if isinstance(value, datetime)
            else value for key, value in row.items()}


_SECRET_IN_URL = re.compile(r"(\w+://[^:/\s]*:)[^/\s]*@")  # up to the authority's last @
_SECRET_ASSIGNMENT = re.compile(
    r"""(?i)([\w-]*(?:password|passwd|token|secret|api[_-]?key|authorization)["']?)\s*[=:]\s*"""
    r"""("[^"]*"|'[^']*'|(?:bearer|basic)\s+\S+|\S+)""")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sanitize_error(message: str) -> str:
    """An error as it may be stored and shown to operators: one line, bounded, no credentials."""
    text = _SECRET_IN_URL.sub(r"\1***@", message)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1).rstrip(chr(34) + chr(39))}=***", text)
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


@dataclass(frozen=True)
class Stored:
    """Where a submission with an idempotency key went: a new job, or (`replayed`) the one its key named."""

    job_id: uuid.UUID
    replayed: bool = False
    status: str = "PENDING"  # a replayed job's status now


class KeyReused(Exception):
    """An idempotency key that already names a job submitted with a different body."""

    def __init__(self, key: str, job_id: uuid.UUID) -> None:
        super().__init__(f"idempotency key {key!r} already names job {job_id}, submitted with a different body")
        self.key, self.job_id = key, job_id


@dataclass(frozen=True)
class JobPage:
    """One page of the job listing, newest first; `next`: where the following page starts, None on the last."""

    jobs: list[Job]
    next: ListPosition | None


class Queue:
    """Jobs in PostgreSQL, read and written according to `mechanisms`."""

    def __init__(self, pool: AsyncConnectionPool, mechanisms: Mechanisms = Mechanisms(),
                 faults: FaultHook | None = None, replaced_queries: Mapping[str, str] | None = None) -> None:
        """`replaced_queries`: named queries of sql/queue.sql to run in place of the shipped text (the
        lab's exercises plug a learner's SQL in here); their parameters are the same."""
        self.pool = pool
        self.mechanisms = mechanisms
        self.faults = faults or FaultHook()  # the lab installs a FaultPlan here; production, the no-op
        unknown = set(replaced_queries or ()) - _Q.keys()
        if unknown:
            raise ValueError(f"no query named {', '.join(sorted(unknown))} in queue.sql")
        self.queries = {**_Q, **(replaced_queries or {})}
        self.replaced_queries = frozenset(replaced_queries or ())
        self._next_sweep = 0.0  # time.monotonic() of the next claim that sweeps

    async def _fetch(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(self.queries[query], params)
            return await cur.fetchall()

    async def _execute(self, query: str, params: dict[str, Any]) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.queries[query], params)

    # -- submission -------------------------------------------------------------------------

    async def submit(self, submission: Submission, job_id: uuid.UUID | None = None) -> Job:
        """Insert and commit one job; when this returns, every other connection can see it."""
        rows = await self._fetch("job_insert", {
            "job_id": job_id or uuid.uuid4(),
            "kind": submission.kind,
            "payload": Jsonb(submission.payload),
            "max_attempts": submission.max_attempts,
            "tenant": submission.tenant,
        })
        return Job.from_row(rows[0])

    async def submit_many(self, submissions: Sequence[Submission],
                          job_ids: Sequence[uuid.UUID] | None = None) -> list[uuid.UUID]:
        """Insert and commit every job in one statement, all or none; returns their ids in submission order.
        When this returns, every other connection can see all of them."""
        if job_ids is None:
            job_ids = [uuid.uuid4() for _ in submissions]
        if len(job_ids) != len(submissions):
            raise ValueError(f"{len(submissions)} submissions but {len(job_ids)} job ids")
        if not submissions:
            return []
        await self._execute("job_insert_batch", {"jobs": batch_document(submissions, job_ids)})
        return list(job_ids)

    async def submit_keyed(self, submissions: Sequence[Submission], job_ids: Sequence[uuid.UUID],
                           window_seconds: float, all_or_none: bool) -> list[Stored | KeyReused]:
        """Store and commit the submissions (keys distinct; a submission may have none) in one transaction,
        each as a new job unless its key already names one: then the answer is that job, or KeyReused
        when the body differs. `window_seconds`: a key older than this names a new job. `all_or_none`:
        one KeyReused refuses them all (raised, nothing stored); otherwise each submission has its outcome."""
        async with self.pool.connection() as conn:
            # One transaction: the insert's row locks keep the held keys (and their jobs) as read below.
            async with conn.transaction():
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(self.queries["job_insert_keyed_batch"], {
                    "jobs": batch_document(submissions, job_ids), "window_seconds": window_seconds})
                stored = [row["stored"] for row in await cur.fetchall()]
                # A new statement, so a new snapshot: it sees the key a concurrent transaction committed
                # while the insert above waited for it.
                await cur.execute(self.queries["job_submission_keys_held"],
                                  {"keys": [s.key for s, new in zip(submissions, stored, strict=True) if not new]})
                held = {row["key"]: row for row in await cur.fetchall()}
                outcomes: list[Stored | KeyReused] = []
                for submission, job_id, new in zip(submissions, job_ids, stored, strict=True):
                    if new:
                        outcomes.append(Stored(job_id))
                    elif held[submission.key]["fingerprint"] == submission.fingerprint():
                        outcomes.append(Stored(held[submission.key]["job_id"], True, held[submission.key]["status"]))
                    else:
                        outcomes.append(KeyReused(submission.key, held[submission.key]["job_id"]))
                refused = next((outcome for outcome in outcomes if isinstance(outcome, KeyReused)), None)
                if all_or_none and refused is not None:
                    raise refused  # leaving the transaction's block with it rolls it back
                return outcomes

    # -- claiming ---------------------------------------------------------------------------

    async def claim(self, limit: int, worker_id: str, lease_seconds: float,
                    now: datetime | None = None, fleet_limit: int | None = None) -> list[Job]:
        """Take up to `limit` due jobs for `worker_id` and commit before returning.

        Due: PENDING with run_at <= now, or (with leases) RUNNING with an expired lease. With
        skip_locked, one transaction locks the rows it takes and skips rows others hold. Without
        it, a plain read is followed by a separate update: two claimers can take the same job. With
        fairness too, the due jobs are taken tenant by tenant in turn, else oldest first. With dead and
        leases, a claim a second first makes DEAD the jobs whose lease ran out on their last attempt.

        `fleet_limit`: at most this many jobs RUNNING under a live lease across every worker; claims
        are serialised by an advisory lock while they count, and a claim that finds the lock taken claims
        nothing this time (needs skip_locked and leases)."""
        if limit <= 0:
            return []
        m = self.mechanisms
        if fleet_limit is not None and not (m.skip_locked and m.leases):
            raise ValueError("a fleet limit needs the skip_locked and leases mechanisms")
        params = self._claim_params(limit, worker_id, lease_seconds, now)
        async with self.pool.connection() as conn:
            if fleet_limit is None and m.skip_locked:
                # One statement (select-for-update and mark, as CTEs): one round trip instead of four
                # (BEGIN, select, update, COMMIT) with the same locks; `reliableq bench` measured the difference.
                rows = await (await self._send_claim(conn, params)).fetchall()
                return [Job.from_row(row) for row in rows]
            cur = conn.cursor(row_factory=dict_row)
            await self._sweep_if_due(conn, params)
            if fleet_limit is not None:
                async with conn.transaction():
                    gate = await conn.execute(self.queries["job_fleet_claim_gate"])
                    if not (await gate.fetchone())[0]:
                        # Another claim or a renewal holds the gate: claim nothing, try at the next poll.
                        # Starving would need the gate held without a gap from poll to poll: claims and
                        # renewals hold it for a statement or two, at most fleet_limit live leases are
                        # renewed, each once per third of a lease, and a renewal held for long is a fault
                        # that ends. Which worker's claim gets the gate first is not fair.
                        return []
                    await cur.execute(self.queries["job_fleet_free_slots"], {"fleet_limit": fleet_limit, "now": now})
                    slots = await cur.fetchone()
                    if slots["free"] == 0:
                        return []
                    await cur.execute(self.queries[self._claim_query],
                                      {**params, "limit": min(limit, slots["free"]), "now": slots["at"]})
                    rows = await cur.fetchall()
            else:
                # Two statements, each committed on its own (the pool's connections autocommit).
                await cur.execute(self.queries["job_select_due"], params)
                ids = [row["id"] for row in await cur.fetchall()]
                if not ids:
                    return []
                await self.faults.reach("before_claim_update", ids, worker_id)
                await cur.execute(self.queries["job_mark_claimed"], {**params, "ids": ids})
                rows = await cur.fetchall()
        return [Job.from_row(row) for row in rows]

    @property
    def _claim_query(self) -> str:
        """The one claim statement: fairness changes only which due jobs it takes."""
        return "job_claim_due_fair" if self.mechanisms.fairness else "job_claim_due_skip_locked"

    def _claim_params(self, limit: int, worker_id: str, lease_seconds: float,
                      now: datetime | None) -> dict[str, Any]:
        m = self.mechanisms
        return {
            "now": now,
            "limit": limit,
            "reclaim_expired": m.leases,
            "enforce_budget": m.dead,
            "worker_id": worker_id,
            # Without leases a claim never expires: RUNNING is just a flag.
            "lease_seconds": lease_seconds if m.leases else None,
        }

    async def _sweep_if_due(self, conn: AsyncConnection, params: dict[str, Any]) -> None:
        if self.mechanisms.dead and self.mechanisms.leases and self._sweep_due(params["now"]):
            await conn.execute(self.queries["job_dead_expired_exhausted"], params)

    def _sweep_due(self, now: datetime | None) -> bool:
        """Whether this claim sweeps: once per SWEEP_SECONDS, and always at a moment given (tests moving
        the database's clock)."""
        if now is None and time.monotonic() < self._next_sweep:
            return False
        self._next_sweep = time.monotonic() + SWEEP_SECONDS
        return True

    # -- ownership-sensitive updates, fenced by the lease token ------------------------------

    def _transaction_for_faults(self, conn: AsyncConnection) -> AbstractAsyncContextManager:
        """A transaction around a fenced statement where the fault hook may stop inside it (a crash there
        then rolls the statement back); else none: the statement commits by itself, without the round
        trips of BEGIN and COMMIT."""
        return conn.transaction() if self.faults.stops_inside_transactions else nullcontext()

    async def _finalize(self, query: str, job: Job, **params: Any) -> bool:
        async with self.pool.connection() as conn:
            async with self._transaction_for_faults(conn):
                cur = await conn.execute(self.queries[query], {
                    "job_id": job.id, "lease_token": job.lease_token,
                    "fenced": self.mechanisms.fencing, **params,
                })
                won = (await cur.fetchone())[0]
                # A crash here leaves the update uncommitted: rolled back, as if never sent.
                await self.faults.reach("during_finalize", job, job.worker_id or "")
        await self.faults.reach("after_finalize_commit", job, job.worker_id or "")
        return bool(won)

    async def renew(self, job: Job, lease_seconds: float, fleet_limited: bool = False) -> bool:
        """Extend a live lease from PostgreSQL's clock; False: the lease ran out, or someone else owns
        the job now. A lease that ran out is never revived: another worker may already have counted its
        slot as free. `fleet_limited`: the workers share a fleet limit, so the renewal holds the fleet
        lock (shared) until it commits, and no fleet claim can count leases while it is in flight."""
        async with self.pool.connection() as conn:
            # The fleet gate is a transaction's lock: held until the renewal commits.
            async with conn.transaction() if fleet_limited else self._transaction_for_faults(conn):
                if fleet_limited:
                    await conn.execute(self.queries["job_fleet_renewal_gate"])
                cur = await conn.execute(self.queries["job_renew_lease"], {
                    "job_id": job.id, "lease_token": job.lease_token, "fenced": self.mechanisms.fencing,
                    "lease_seconds": lease_seconds})
                won = (await cur.fetchone())[0]
                await self.faults.reach("during_renewal", job, job.worker_id or "")
        return bool(won)

    async def succeed(self, job: Job) -> bool:
        return (await self.succeed_many([job]))[0]

    async def succeed_many(self, jobs: Sequence[Job]) -> list[bool]:
        """Finalize `jobs` (claims: one lease token each) as SUCCEEDED in one statement and one commit,
        each fenced by its own token; whether each claim won, in order. Two claims of one job may share
        a group (a stale owner's late success beside the current owner's): only the token that owns the
        job wins. A crash at `during_finalize` rolls back the whole group."""
        won, _ = await self._succeed(jobs, None)
        return won

    async def succeed_and_claim(self, jobs: Sequence[Job], limit: int, worker_id: str,
                                lease_seconds: float) -> tuple[list[bool], list[Job]]:
        """succeed_many, and in the same commit a claim of up to `limit` due jobs for `worker_id`, as
        claim() takes them (without a fleet limit; needs skip_locked): whether each success won, and the
        jobs claimed. One round trip and one commit where a success and the next claim took two each; a
        failure of either rolls back both. Under the lab's fault plans, the claim follows the success's
        commit instead, as a claim of its own (see _succeed)."""
        if not self.mechanisms.skip_locked:
            raise ValueError("a claim in a success's commit needs the skip_locked mechanism")
        return await self._succeed(jobs, self._claim_params(limit, worker_id, lease_seconds, None))

    async def _succeed(self, jobs: Sequence[Job], claim: dict[str, Any] | None) -> tuple[list[bool], list[Job]]:
        # Outside the lab's fault plans a success and the claim after it travel in one pipeline and commit
        # together (one implicit transaction up to its one sync). Under a plan the claim is a transaction of
        # its own, sent after the success's commit and its fault points: no fault interrupts a claim, and the
        # lab's timelines record it as made after the success (one transaction's now() would be its start).
        together = claim is not None and not self.faults.stops_inside_transactions
        rows: list[dict[str, Any]] = []
        async with self.pool.connection() as conn:
            async with self._transaction_for_faults(conn):
                succeeded = conn.cursor()
                async with conn.pipeline() if together else nullcontext():
                    await succeeded.execute(self.queries["job_succeed"], {
                        "job_ids": [job.id for job in jobs], "lease_tokens": [job.lease_token for job in jobs],
                        "fenced": self.mechanisms.fencing})
                    if together:
                        claimed = await self._send_claim(conn, claim)
                won = [bool(finalize_won) for (finalize_won,) in await succeeded.fetchall()]
                if together:
                    rows = await claimed.fetchall()
                for job in jobs:
                    # A crash here leaves the update uncommitted: rolled back, as if never sent.
                    await self.faults.reach("during_finalize", job, job.worker_id or "")
        for job in jobs:
            await self.faults.reach("after_finalize_commit", job, job.worker_id or "")
        if claim is not None and not together:
            async with self.pool.connection() as conn:
                rows = await (await self._send_claim(conn, claim)).fetchall()
        return won, [Job.from_row(row) for row in rows]

    async def _send_claim(self, conn: AsyncConnection, claim: dict[str, Any]) -> Any:
        """The claim statement (after the sweep, when one is due), sent: its cursor, to fetch from."""
        await self._sweep_if_due(conn, claim)
        return await conn.cursor(row_factory=dict_row).execute(self.queries[self._claim_query], claim)

    async def claimed_with_success(self, job: Job, worker_id: str) -> list[Job]:
        """The jobs still leased to `worker_id` that the commit which finalized `job` (won or lost) claimed:
        what succeed_and_claim took, for a worker that never heard its answer."""
        return [Job.from_row(row) for row in await self._fetch(
            "job_claimed_with_success", {"lease_token": job.lease_token, "worker_id": worker_id})]

    async def finalize_recorded(self, job: Job) -> tuple[str, bool] | None:
        """What a finalize of this claim already committed: (operation, whether it won), or None when
        none is on record. A finalize whose answer was lost asks this before trying again: its first
        try may have committed, and a retry would then be refused by its own success."""
        rows = await self._fetch("job_attempt_finalize_recorded", {"lease_token": job.lease_token})
        if not rows or rows[0]["operation"] is None:
            return None
        return rows[0]["operation"], rows[0]["won"]

    async def retry(self, job: Job, delay_seconds: float, error: str) -> bool:
        """Back to PENDING, due `delay_seconds` after PostgreSQL's now()."""
        return await self._finalize("job_retry", job, delay_seconds=delay_seconds, error=sanitize_error(error))

    async def dead(self, job: Job, error: str) -> bool:
        return await self._finalize("job_dead", job, error=sanitize_error(error))

    # -- operators --------------------------------------------------------------------------

    async def replay(self, job_id: uuid.UUID, budget: int) -> Job | None:
        """DEAD -> PENDING with the same id and idempotency key and `budget` more attempts.
        None when the job is not DEAD (or does not exist)."""
        if budget < 1:
            raise ValueError("a replay needs a budget of at least one attempt")
        rows = await self._fetch("job_replay", {"job_id": job_id, "budget": budget})
        return Job.from_row(rows[0]) if rows else None

    async def prune_finalized(self, statuses: Sequence[str], older_than_seconds: float, window_seconds: float,
                              batch: int, after: ListPosition | None = None
                              ) -> tuple[dict[str, int], ListPosition | None]:
        """One batch of retention, its own short transaction: deletes up to `batch` jobs of `statuses`
        finalized more than `older_than_seconds` ago whose submission key (if any) is older than
        `window_seconds`, skipping rows others hold, oldest first from just after `after`. Returns how
        many of each status went, and where the batch ended (the next one's `after`; None: it took none)."""
        (row,) = await self._fetch("job_prune_finalized", {
            "statuses": list(statuses), "older_than_seconds": older_than_seconds,
            "window_seconds": window_seconds, "batch": batch,
            "after_created_at": after.created_at if after else None, "after_id": after.id if after else None})
        ended = ListPosition(row["last_created_at"], row["last_id"]) if row["last_id"] else None
        return {"SUCCEEDED": row["succeeded"], "DEAD": row["dead"]}, ended

    async def get(self, job_id: uuid.UUID) -> Job | None:
        rows = await self._fetch("job_get", {"job_id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def attempts_of(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return await self._fetch("job_attempts_of", {"job_id": job_id})

    async def events_of(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return await self._fetch("job_events_of", {"job_id": job_id})

    async def list(self, status: str | None = None, limit: int = 100) -> list[Job]:
        """The newest `limit` jobs (of `status`): the listing's first page."""
        return (await self.page(status, limit)).jobs

    async def page(self, status: str | None = None, limit: int = 100, after: ListPosition | None = None) -> JobPage:
        """Up to `limit` jobs (of `status`), newest first, from just after `after` (from the newest when None)."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
        rows = await self._fetch("job_list", {
            "status": status, "limit": limit + 1,  # one more than a page: is there another?
            "before_created_at": after.created_at if after else None, "before_id": after.id if after else None})
        jobs = [Job.from_row(row) for row in rows[:limit]]
        more = len(rows) > limit
        return JobPage(jobs, ListPosition(jobs[-1].created_at, jobs[-1].id) if more else None)

    async def counts(self, within_seconds: float | None = None) -> dict[str, int]:
        """Jobs by status. `within_seconds`: wait at most that long for a connection (PoolTimeout) and have
        the server cancel the count past it (QueryCanceled), as a scrape must answer whatever the table's size."""
        if within_seconds is None:
            rows = await self._fetch("job_count_by_status", {})
        else:
            async with self.pool.connection(timeout=within_seconds) as conn, conn.transaction():
                await conn.execute(self.queries["transaction_statement_timeout"],
                                   {"milliseconds": str(max(int(within_seconds * 1000), 1))})
                cur = await conn.cursor(row_factory=dict_row).execute(self.queries["job_count_by_status"])
                rows = await cur.fetchall()
        return {status: 0 for status in STATUSES} | {row["status"]: row["jobs"] for row in rows}

    async def mark_idle(self, worker_id: str, seconds: float) -> bool:
        """Say that `worker_id` waits for work, for `seconds` unless said again: submissions notify only
        while some worker does. Whether its mark was still live when said."""
        return (await self._fetch("worker_idle", {"worker_id": worker_id, "seconds": seconds}))[0]["was_live"]

    async def mark_busy(self, worker_id: str) -> None:
        await self._execute("worker_busy", {"worker_id": worker_id})

    async def database_now(self) -> datetime:
        return (await self._fetch("database_now", {}))[0]["now"]

    async def database_commits(self, wait_seconds: float) -> None:
        """A writing transaction commits, waiting at most `wait_seconds` for a connection (PoolTimeout
        otherwise) and as long again for the commit (TimeoutError otherwise). Past that its wait is
        cancelled on the server, which ends this empty transaction instead of leaving a session waiting
        for a standby that may not come back."""
        async with self.pool.connection(timeout=wait_seconds) as conn:
            await asyncio.wait_for(conn.execute(self.queries["database_commit"]), wait_seconds)
