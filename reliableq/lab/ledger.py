"""The lab's counts per job, read from PostgreSQL after the fact: A, H, C, F.

A (attempts) and F (successful finalizations) come from the queue's database; H (handler runs, as the
charge service saw them) and C (committed charges) from the charge service's. The honest guarantee of
the full system is A >= 1, H >= 1, C = 1, F = 1 for every succeeded job. Reading only; no judgement.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass

import psycopg
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.db import Databases


@dataclass(frozen=True)
class JobCounts:
    job_id: uuid.UUID
    status: str
    attempts: int  # A
    handler_runs: int  # H
    charges: int  # C
    finalizations: int  # F
    max_attempts: int

    def short(self) -> str:
        return f"A={self.attempts} H={self.handler_runs} C={self.charges} F={self.finalizations}"

    def as_dict(self) -> dict:
        return asdict(self) | {"job_id": str(self.job_id)}


async def read_rows(url: str, database: str, query: str, params: dict | None = None) -> list[dict]:
    """The rows of a lab's named query (sql/<database>.sql) on a fresh connection: what any other process
    would see right now."""
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        return await (await conn.execute(sql.queries(database)[query], params)).fetchall()


async def job_counts(databases: Databases) -> list[JobCounts]:
    """A, H, C and F of every job, oldest job first."""
    async with await psycopg.AsyncConnection.connect(databases.queue_url, row_factory=dict_row) as conn:
        jobs = await (await conn.execute(sql.queries("lab_queue")["job_ledger"])).fetchall()
    async with await psycopg.AsyncConnection.connect(databases.charge_url, row_factory=dict_row) as conn:
        effects = {row["job_id"]: row for row in
                   await (await conn.execute(sql.queries("lab_charge")["charge_counts_by_job"])).fetchall()}
    return [
        JobCounts(job_id=row["job_id"], status=row["status"], attempts=row["attempts"],
                  handler_runs=effects.get(row["job_id"], {}).get("requests", 0),
                  charges=effects.get(row["job_id"], {}).get("charges", 0),
                  finalizations=row["finalizations"], max_attempts=row["max_attempts"])
        for row in jobs
    ]
