"""Steps the API tests take with jobs: submit them over HTTP, read what a brand-new connection sees
stored, and make one DEAD as a worker giving up would."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg


async def fetch_one(url: str, query: str, params: tuple = ()) -> tuple | None:
    """One row read on a brand-new connection: what any other process would see right now."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchone()


async def row_visible(queue_url: str, job_id: str | uuid.UUID) -> bool:
    return await fetch_one(queue_url, "SELECT 1 FROM jobs WHERE id = %s", (uuid.UUID(str(job_id)),)) is not None


async def stored_rows(queue_url: str) -> tuple[int, int]:
    """(jobs, job_events) row counts: a submission without a key writes its job alone."""
    row = await fetch_one(queue_url, "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events)")
    return row[0], row[1]


async def submit(client: httpx.AsyncClient, amount_cents: int = 1250, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"amount_cents": amount_cents, **fields})
    assert response.status_code == 202, response.text
    return response.json()


async def submit_batch(client: httpx.AsyncClient, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 202, response.text
    return response.json()["jobs"]


async def count_visible(queue_url: str, job_ids: list[str]) -> int:
    """How many of `job_ids` a brand-new connection sees stored."""
    row = await fetch_one(queue_url, "SELECT count(*) FROM jobs WHERE id = ANY(%s)",
                          ([uuid.UUID(job_id) for job_id in job_ids],))
    return row[0]


async def make_dead(make_queue, job_id: str, error: str = "card rejected: do not honor") -> None:
    """Claim the job with the queue and finalize it as DEAD, as a worker giving up would."""
    queue = make_queue()
    claimed = await queue.claim(1, "test-worker", 30.0)
    assert [str(job.id) for job in claimed] == [job_id]
    assert await queue.dead(claimed[0], error)
