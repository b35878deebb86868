"""The queue's safety invariants, checked directly in PostgreSQL after a run has settled.

Used by the chaos suite and the benchmark's correctness gate. Each check names the invariant in words
a learner can repeat and lists the jobs that broke it; it reads, it never repairs.

Clocks. Every time an invariant compares is PostgreSQL's, never a worker's. Where a right answer may read
that clock at a different moment of one statement (now() is the start of the transaction,
clock_timestamp() the moment of the row), an invariant judges a claim by the latest moment its decision
can have been made, so a right answer is never rejected for its choice of clock: "reclaimed while its
lease was still running" places a claim at its row's recorded_at (written with clock_timestamp()) or its
claimed_at, whichever is later, against the earlier owner's expiry as last renewed. "Live leases never
exceeded the fleet limit" counts at each claim's claimed_at the leases from claimed_at to their expiry or
finish, all stamped by the shipped queries (the fleet limit is not an exercise). The outage bound counts
requests inside the outage window the charge service recorded on its own clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.db import Databases
from reliableq.lab.faults import STALLING_POINTS, Triggered
from reliableq.lab.ledger import job_counts


@dataclass(frozen=True)
class Check:
    name: str  # the invariant, as a sentence
    violations: list[dict] = field(default_factory=list)  # one row per offending job
    note: str = ""

    @property
    def held(self) -> bool:
        return not self.violations

    def line(self) -> str:
        verdict = "held" if self.held else f"BROKEN ({len(self.violations)} job(s))"
        return f"{verdict:<18} {self.name}" + (f"  [{self.note}]" if self.note else "")


async def _rows(url: str, database: str, query: str, params: dict | None = None) -> list[dict]:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        return await (await conn.execute(sql.queries(database)[query], params)).fetchall()


async def check_stored(databases: Databases, acknowledged: Iterable[uuid.UUID] = (),
                       enforce_budget: bool = True) -> list[Check]:
    """Every invariant that PostgreSQL alone can answer. `acknowledged`: ids the API answered 202 for."""
    stored = {row["job_id"] for row in await _rows(databases.queue_url, "lab_queue", "job_ids")}
    lost = [{"job_id": job_id} for job_id in acknowledged if job_id not in stored]
    succeeded_uncharged = await _succeeded_without_charge(databases)
    checks = [
        Check("every acknowledged job is stored", lost),
        Check("every job is SUCCEEDED or DEAD",
              await _rows(databases.queue_url, "lab_queue", "job_invariant_unfinished")),
        Check("no job was reclaimed while its lease was still running",
              await _rows(databases.queue_url, "lab_queue", "job_invariant_reclaimed_early")),
        Check("no stale owner finalized a job; each job was finalized once",
              await _rows(databases.queue_url, "lab_queue", "job_invariant_stale_finalize")),
        Check("at most one charge per job and per idempotency key",
              await _rows(databases.charge_url, "lab_charge", "charge_jobs_with_duplicates")
              + await _rows(databases.charge_url, "lab_charge", "charge_keys_with_duplicates")),
        Check("every SUCCEEDED job has its charge", succeeded_uncharged),
    ]
    if enforce_budget:
        checks.append(Check("attempt budgets held",
                            await _rows(databases.queue_url, "lab_queue", "job_invariant_over_budget")))
    return checks


async def _succeeded_without_charge(databases: Databases) -> list[dict]:
    return [{"job_id": c.job_id} for c in await job_counts(databases) if c.status == "SUCCEEDED" and c.charges == 0]


# Backoff is a load property, so its invariant is a bound, not an equality, and a bound on each job, not
# an average: an average over the three jobs a one-job-per-worker fleet has in flight was broken by chance.
# With full jitter and a first retry window twice the outage (chaos's setting), a job sends 1 to 3
# requests while it lasts (25 seeded runs, 2 to 12 jobs each); 6 or more has a chance of about 2 in 10^5
# per job even for one that meets it at its very start. Without backoff a job retries every poll and
# spends its whole remaining budget there (19 of 20 attempts), so only jobs with more than the bound's
# attempts left can show it: the backoff-off chaos test gives its jobs 20.
OUTAGE_REQUESTS_PER_JOB_LIMIT = 5


async def outage_check(databases: Databases) -> Check:
    """During an outage, retries backed off: no job sent more than a few requests while it lasted."""
    rows = await _rows(databases.charge_url, "lab_charge", "charge_outage_requests_by_job")
    over = [{"job_id": row["job_id"], "requests": row["requests"]} for row in rows
            if row["requests"] > OUTAGE_REQUESTS_PER_JOB_LIMIT]
    name = f"retries backed off during the outage (at most {OUTAGE_REQUESTS_PER_JOB_LIMIT} requests from any job)"
    most = rows[0]["requests"] if rows else 0
    return Check(name, over, note=f"{sum(row['requests'] for row in rows)} requests from {len(rows)} jobs, "
                                  f"at most {most} from one")


def capacity_check(worker_peaks: list[int], concurrency: int) -> Check:
    """In-flight handlers per worker never exceeded its permits."""
    over = [{"worker": i, "in_flight_peak": peak} for i, peak in enumerate(worker_peaks) if peak > concurrency]
    return Check(f"in-flight work never exceeded capacity ({concurrency} per worker)", over,
                 note=f"peaks {max(worker_peaks, default=0)}/{concurrency}")


async def fleet_limit_check(databases: Databases, fleet_limit: int) -> Check:
    """Live leases never exceeded the fleet limit: at no claim were more leases live than allowed."""
    over = await _rows(databases.queue_url, "lab_queue", "job_invariant_fleet_over_limit", {"fleet_limit": fleet_limit})
    return Check(f"live leases never exceeded the fleet limit ({fleet_limit})", over)


async def lease_loss_check(databases: Databases, triggered: Iterable[Triggered],
                           ran_out_unrenewed: Iterable[tuple[str, str]] = ()) -> Check:
    """A claim lost its lease only where a fault explains it: its worker crashed, or the claim was
    stalled at a point that stands for a stopped worker, or the worker itself was stalled: its lease ran
    out, by its own clock, before a renewal landed (`ran_out_unrenewed`, (job id, worker id) pairs its
    LeaseKeeper reported; a machine too busy for the lease, said in the note). A live worker keeps the
    leases it holds, while its handler works and while its finalize waits for a commit; a job it loses
    runs again for nothing. A lease taken or cut short while its worker still held it (a claim that
    grants less than the lease, a reclaim of a live one) is never explained by slowness: the keeper
    heard of that loss before its own estimate of the expiry."""
    crashed = {t.worker_id for t in triggered if t.action in ("crash", "kill")}
    stalled = {(str(t.job_id), t.worker_id) for t in triggered
               if t.action == "pause" and t.point in STALLING_POINTS}
    too_slow = set(ran_out_unrenewed) - stalled
    lost = [row for row in await _rows(databases.queue_url, "lab_queue", "job_attempts_lost")
            if row["worker_id"] not in crashed and (str(row["job_id"]), row["worker_id"]) not in stalled]
    unexplained = [row for row in lost if (str(row["job_id"]), row["worker_id"]) not in too_slow]
    slow = len(lost) - len(unexplained)
    note = (f"{slow} lease(s) ran out before a renewal landed: the machine was too busy for the lease"
            if slow else "")
    return Check("a lease was lost only by a crashed or stalled worker", unexplained, note=note)


# How a worker's counters name the finalizes PostgreSQL records on each claim.
_COUNTER_OF_OUTCOME = {"succeeded": "succeeded", "retried": "retried", "dead": "dead",
                       "lost_succeed": "lost_finalizes", "lost_retry": "lost_finalizes", "lost_dead": "lost_finalizes"}


async def accounts_check(databases: Databases, reports: dict[str, dict[str, int]]) -> Check:
    """Each worker's own account of its finalizes (won by kind, and lost) matches the outcomes PostgreSQL
    recorded on its claims. `reports`: worker id -> its counters, for workers that were not crashed."""
    recorded: dict[str, dict[str, int]] = {worker: dict.fromkeys(_COUNTER_OF_OUTCOME.values(), 0) for worker in reports}
    for row in await _rows(databases.queue_url, "lab_queue", "job_attempt_outcomes_by_worker"):
        counter = _COUNTER_OF_OUTCOME.get(row["outcome"])
        if row["worker_id"] in recorded and counter:
            recorded[row["worker_id"]][counter] += row["claims"]
    mismatched = []
    for worker, report in reports.items():
        reported = {counter: report[counter] for counter in recorded[worker]}
        if reported != recorded[worker]:
            mismatched.append({"worker": worker, "reported": reported, "recorded": recorded[worker]})
    return Check("every worker's account of its finalizes matches PostgreSQL", mismatched)


# Fairness: the bound, and why it holds. `fairness_check` judges every run of consecutive claims (in claimed_at
# order) that took none of tenant T's jobs, over its span: from the first one's claimed_at to the last moment
# any of them was still deciding (the latest decided_by). A run is judged when, throughout its span, the
# ledger says for sure that (a) T had a due job waiting (a first spell of one of its jobs covers the span),
# (b) every other tenant surely had one or surely had none, so every snapshot taken in the span saw the same
# K tenants with due work, and (c) no claim that took a lapsed lease, nor one that took a job of T, was
# deciding or uncommitted in it ([claimed_at, committed_by) of each such claim misses the span). The
# invariant: a judged run has at most fair_bound(K, W) = (K-1)(2W-1) claims, W the workers claiming.
#
# Why, from sql/queue.sql job_claim_due_fair. (1) Every claim statement takes the next turn of job_claim_turns
# (consecutive over all claims, the empty ones the ledger never sees included) and serves first the tenant at
# position turn mod K among its snapshot's tenants with due work, in name order. With the same K tenants for
# every snapshot in the span, T is first for one turn in any K consecutive ones. (2) A claim that decides
# within the span with T first takes one of T's jobs: lapsed leases come before anyone's job, but by (c) it
# took none; T's oldest unlocked due job is its first candidate; and T has one unlocked: by (a) a job never
# claimed, which nothing but a fair claim locks, and a fair claim that locks T's jobs takes the first of them
# unless lapsed leases filled its slots (else at most `place` < L first jobs come before T's); (c) leaves
# neither kind deciding or uncommitted in the span. So no claim deciding within the span, of the run or not,
# empty or not, has T first. (3) Take the range of turns from the run's lowest to its highest. A turn in it
# that puts T first belongs to a claim deciding partly outside the span: one already deciding when the run's
# first claim began (at most W-1, one per other worker), or one still deciding when the span ended (at most
# W-1). So the range holds f <= 2(W-1) turns with T first, is shorter than K(f+1), and besides those f turns
# holds the run's claims: at most K(f+1) - 1 - f = (K-1)(f+1) <= (K-1)(2W-1). For one worker, K-1: every other
# tenant once (stage 11); for one tenant, none.
#
# Boundary. Runs the ledger cannot vouch for are not judged: across a change in the tenants with due work
# (a retry coming due, a tenant's last job taken), T's place in the round is recomputed from the turn modulo
# a new K and may fall anywhere, so the fair claim promises no bound across changes, and none is checked;
# nor while a lapsed lease or T's own job was being taken. A claim that failed after taking its turn is not
# in the ledger and would be an unseen turn: in chaos no fault interrupts a claim.


def fair_bound(tenants_waiting: int, workers: int) -> int:
    """The most claims in a row that may take none of a waiting tenant's jobs (the comment above)."""
    return (tenants_waiting - 1) * (2 * workers - 1)


FAIRNESS = "a waiting tenant was passed over by at most (K-1)(2W-1) claims in a row (K tenants waiting, W workers)"
_FOREVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ClaimBounds:
    """One claim as job_claims_with_bounds reads it; None for committed_by: nothing came after it."""

    worker_id: str
    claimed_at: datetime
    decided_by: datetime
    committed_by: datetime | None
    took_lapsed: bool
    tenants: list[str]


@dataclass(frozen=True)
class WaitBounds:
    """One spell a job may have spent waiting, as job_waits_with_bounds reads it (None: open or unknown)."""

    job_id: uuid.UUID
    tenant: str
    maybe_from: datetime
    maybe_to: datetime | None
    surely_from: datetime | None
    surely_to: datetime | None

    def surely_covers(self, start: datetime, end: datetime) -> bool:
        return self.surely_from is not None and self.surely_from <= start and (self.surely_to or _FOREVER) >= end

    def maybe_meets(self, start: datetime, end: datetime) -> bool:
        # Both ends are strict bounds: the job became visible after maybe_from, its taker committed before maybe_to.
        return self.maybe_from < end and (self.maybe_to or _FOREVER) > start


async def fairness_check(databases: Databases, workers: int, visible_from: datetime) -> Check:
    """While a tenant had a due job, at most fair_bound(K, W) claims in a row took none of its jobs, in every
    run the ledger can vouch for (the comment above). `workers`: how many workers claimed at once;
    `visible_from`: a moment by which every submission had committed."""
    claims = [ClaimBounds(**row) for row in await _rows(databases.queue_url, "lab_queue", "job_claims_with_bounds")]
    waits = [WaitBounds(**row) for row in await _rows(databases.queue_url, "lab_queue", "job_waits_with_bounds",
                                                       {"visible_from": visible_from})]
    runs = runs_past_waiting_tenants(claims, waits, workers)
    over = [run for run in runs if run["passed_over_by"] > run["bound"]]
    tightest = max(runs, key=lambda run: (run["passed_over_by"] - run["bound"], run["passed_over_by"]), default=None)
    note = ("no judged claim passed over a waiting tenant" if tightest is None else
            f"longest: {tightest['passed_over_by']} claim(s) past {tightest['tenant']} while "
            f"{tightest['tenants_waiting']} tenants waited; bound {tightest['bound']} with {workers} workers")
    return Check(FAIRNESS, over, note=note)


def runs_past_waiting_tenants(claims: list[ClaimBounds], waits: list[WaitBounds], workers: int) -> list[dict]:
    """Per tenant, its judged run of claims with the most claims over its bound (then the longest): the
    tenant, a job of it that surely waited throughout, how many claims passed it over, the tenants waiting
    (K), the bound, and when the run began and ended. Claims in claimed_at order."""
    claims = sorted(claims, key=lambda c: (c.claimed_at, c.worker_id))
    runs = []
    for tenant in sorted({wait.tenant for wait in waits}):
        holders = [(c.claimed_at, c.committed_by or _FOREVER) for c in claims if c.took_lapsed or tenant in c.tenants]
        best: dict | None = None
        last = -1
        for first in range(len(claims)):
            # A run that is judged stays judged without its first claim: the longest from each first claim
            # ends no earlier than the longest from the one before.
            last = max(last, first - 1)
            while last + 1 < len(claims) and _judged(tenant, claims[first:last + 2], holders, waits):
                last += 1
            if last < first:
                continue
            tenants_waiting, job_id = _judged(tenant, claims[first:last + 1], holders, waits)
            run = {"tenant": tenant, "job_id": job_id, "passed_over_by": last - first + 1,
                   "tenants_waiting": tenants_waiting, "bound": fair_bound(tenants_waiting, workers),
                   "from": claims[first].claimed_at, "to": claims[last].claimed_at}
            if best is None or ((run["passed_over_by"] - run["bound"], run["passed_over_by"])
                                > (best["passed_over_by"] - best["bound"], best["passed_over_by"])):
                best = run
        if best is not None:
            runs.append(best)
    return runs


def _judged(tenant: str, run: list[ClaimBounds], holders: list[tuple[datetime, datetime]],
            waits: list[WaitBounds]) -> tuple[int, uuid.UUID] | None:
    """(K, a job of `tenant` that surely waited throughout) if the ledger vouches for `run`, else None."""
    start, end = run[0].claimed_at, max(claim.decided_by for claim in run)
    if any(taken < end and committed > start for taken, committed in holders):
        return None
    sure = sorted((wait for wait in waits if wait.tenant == tenant and wait.surely_covers(start, end)),
                  key=lambda wait: wait.maybe_from)
    if not sure:
        return None
    tenants_waiting = 1
    for other in {wait.tenant for wait in waits} - {tenant}:
        spells = [wait for wait in waits if wait.tenant == other]
        if any(wait.surely_covers(start, end) for wait in spells):
            tenants_waiting += 1
        elif any(wait.maybe_meets(start, end) for wait in spells):
            return None  # whether it had due work changed, or may have, within the span
    return tenants_waiting, sure[0].job_id
