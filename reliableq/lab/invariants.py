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
