"""The queue's safety invariants, checked directly in PostgreSQL after a run has settled.

Used by the chaos suite and the benchmark's correctness gate. Each check names the invariant in words
a learner can repeat and lists the jobs that broke it; it reads, it never repairs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.db import Databases
from reliableq.ledger import job_counts


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


async def _rows(url: str, database: str, query: str) -> list[dict]:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        return await (await conn.execute(sql.queries(database)[query])).fetchall()


async def check_stored(databases: Databases, acknowledged: Iterable[uuid.UUID] = (),
                       enforce_budget: bool = True) -> list[Check]:
    """Every invariant that PostgreSQL alone can answer. `acknowledged`: ids the API answered 202 for."""
    stored = {row["job_id"] for row in await _rows(databases.queue_url, "queue", "job_ids")}
    lost = [{"job_id": job_id} for job_id in acknowledged if job_id not in stored]
    succeeded_uncharged = await _succeeded_without_charge(databases)
    checks = [
        Check("every acknowledged job is stored", lost),
        Check("every job is SUCCEEDED or DEAD", await _rows(databases.queue_url, "queue", "job_invariant_unfinished")),
        Check("no job was reclaimed while its lease was still running",
              await _rows(databases.queue_url, "queue", "job_invariant_reclaimed_early")),
        Check("no stale owner finalized a job; each job was finalized once",
              await _rows(databases.queue_url, "queue", "job_invariant_stale_finalize")),
        Check("at most one charge per job and per idempotency key",
              await _rows(databases.charge_url, "charge", "charge_jobs_with_duplicates")
              + await _rows(databases.charge_url, "charge", "charge_keys_with_duplicates")),
        Check("every SUCCEEDED job has its charge", succeeded_uncharged),
    ]
    if enforce_budget:
        checks.append(Check("attempt budgets held",
                            await _rows(databases.queue_url, "queue", "job_invariant_over_budget")))
    return checks


async def _succeeded_without_charge(databases: Databases) -> list[dict]:
    return [{"job_id": c.job_id} for c in await job_counts(databases) if c.status == "SUCCEEDED" and c.charges == 0]


# Backoff is a load property, so its invariant is a bound, not an equality. With full jitter and a
# base delay as long as the outage, a job retries about once or twice while the dependency is down;
# without backoff it spends its whole budget there in milliseconds.
OUTAGE_REQUESTS_PER_JOB_LIMIT = 2.0


async def outage_check(databases: Databases) -> Check:
    """During an outage, retries backed off: few requests per affected job on average."""
    (row,) = await _rows(databases.charge_url, "charge", "charge_outage_requests")
    per_job = row["requests"] / row["jobs"] if row["jobs"] else 0.0
    name = f"retries backed off during the outage (at most {OUTAGE_REQUESTS_PER_JOB_LIMIT:g} requests per job)"
    violations = [{"requests": row["requests"], "jobs": row["jobs"]}] if per_job > OUTAGE_REQUESTS_PER_JOB_LIMIT else []
    return Check(name, violations, note=f"{row['requests']} requests from {row['jobs']} jobs, {per_job:.2f} per job")


def capacity_check(worker_peaks: list[int], concurrency: int) -> Check:
    """In-flight handlers per worker never exceeded its permits."""
    over = [{"worker": i, "in_flight_peak": peak} for i, peak in enumerate(worker_peaks) if peak > concurrency]
    return Check(f"in-flight work never exceeded capacity ({concurrency} per worker)", over,
                 note=f"peaks {max(worker_peaks, default=0)}/{concurrency}")
