"""Retention against a real PostgreSQL: old SUCCEEDED jobs go in batches with their attempts, events and
keys; recent, DEAD (unless asked), PENDING and RUNNING jobs stay; a locked row is skipped, never waited
for (and shown waited for when SKIP LOCKED is off); a job whose key is inside the idempotency window
stays, so that a retry finds it (and shown duplicated when the window is ignored). Histories are
inserted by one statement each, backdated; the pruner then runs as it would in production."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest

from reliableq import sql
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue, Stored
from reliableq.retention import RetentionPolicy, prune

HOUR = 3600.0
DAY = 24 * HOUR
BOUND_SECONDS = 10.0  # generous: a pass over these few rows takes well under a second

HISTORY = """
WITH made AS (
    INSERT INTO jobs (payload, status, attempts, created_at, finalized_at)
    SELECT jsonb_build_object('n', n), %(status)s, 1, now() - make_interval(secs => %(ago)s + 60),
           CASE WHEN %(status)s IN ('SUCCEEDED', 'DEAD') THEN now() - make_interval(secs => %(ago)s) END
    FROM generate_series(1, %(count)s) AS n
    RETURNING id, created_at
), attempts AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, finished_at, outcome)
    SELECT id, 1, 'history', gen_random_uuid(), created_at, created_at, 'succeeded' FROM made
), events AS (
    INSERT INTO job_events (job_id, event) SELECT id, 'submitted' FROM made
), keys AS (
    INSERT INTO job_submission_keys (key, job_id, fingerprint, created_at)
    SELECT 'key-' || id, id, 'fingerprint', now() - make_interval(secs => %(key_age)s::float8)
    FROM made WHERE %(key_age)s::float8 IS NOT NULL
)
SELECT id FROM made
"""


async def execute(url: str, query: str, params: dict | tuple = ()) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def history(url: str, status: str, count: int, finished_ago: float, key_age: float | None = None) -> set:
    """`count` jobs of `status`, created a minute before `finished_ago` seconds ago and (SUCCEEDED, DEAD)
    finalized then, each with an attempt, an event and (`key_age`) a client key that old."""
    rows = await execute(url, HISTORY, {"status": status, "count": count, "ago": finished_ago, "key_age": key_age})
    return {row[0] for row in rows}


async def remaining(url: str) -> dict[str, set]:
    """The ids left in each table."""
    tables = {"jobs": "id", "job_attempts": "job_id", "job_events": "job_id", "job_submission_keys": "job_id"}
    return {table: {row[0] for row in await execute(url, f"SELECT {column} FROM {table}")}
            for table, column in tables.items()}


async def test_old_succeeded_jobs_go_in_batches_with_their_history_and_the_rest_stays(make_queue, databases):
    """1,200 SUCCEEDED jobs finished two days ago go in three batches of 500, with their attempts, events
    and expired keys; SUCCEEDED ones finished a minute ago, DEAD, PENDING and RUNNING ones stay. With
    --dead, the old DEAD ones go too, the recent ones stay."""
    url = databases.queue_url
    old = await history(url, "SUCCEEDED", 1200, 2 * DAY, key_age=2 * DAY)
    kept = {status: await history(url, status, 20, 2 * DAY) for status in ("DEAD", "PENDING", "RUNNING")}
    recent = await history(url, "SUCCEEDED", 20, 60)
    recent_dead = await history(url, "DEAD", 20, 60)

    pruned = await prune(make_queue(), RetentionPolicy(older_than_seconds=DAY))
    assert (pruned.succeeded, pruned.dead, pruned.batches) == (1200, 0, 3)
    left = await remaining(url)
    survivors = recent | recent_dead | set().union(*kept.values())
    for table in ("jobs", "job_attempts", "job_events"):
        assert left[table] == survivors, table
    assert left["job_submission_keys"] == set() and not old & left["jobs"]

    pruned = await prune(make_queue(), RetentionPolicy(older_than_seconds=DAY, include_dead=True))
    assert (pruned.succeeded, pruned.dead) == (0, 20)
    assert (await remaining(url))["jobs"] == recent | recent_dead | kept["PENDING"] | kept["RUNNING"]


@asynccontextmanager
async def row_locks_held(url: str, job_ids: list[uuid.UUID]) -> AsyncIterator[None]:
    """A transaction holding these jobs' rows, as a worker finalizing them or an operator replaying does,
    until the block ends. The locks are gone when it has ended: a rollback is answered after they are
    released, while closing the connection alone lets its server process release them some time later."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("SELECT id FROM jobs WHERE id = ANY(%s) FOR UPDATE", (job_ids,))
        try:
            yield
        finally:
            await conn.rollback()


async def test_a_locked_job_is_skipped_not_waited_for_and_a_running_job_never_touched(make_queue, submission,
                                                                                      databases):
    """A worker's RUNNING job and an old SUCCEEDED job are row-locked by another transaction; the pass
    finishes within a bound, deletes the other old jobs and leaves both; once the lock goes, the next
    pass takes the SUCCEEDED one and the RUNNING one still stays."""
    url, queue = databases.queue_url, make_queue()
    old = await history(url, "SUCCEEDED", 30, 2 * DAY)
    await queue.submit(submission())
    (running,) = await queue.claim(1, "worker-1", lease_seconds=60)
    await execute(url, "UPDATE jobs SET created_at = now() - interval '3 days' WHERE id = %s", (running.id,))
    locked = sorted(old)[0]
    async with row_locks_held(url, [running.id, locked]):
        pruned = await asyncio.wait_for(prune(queue, RetentionPolicy(older_than_seconds=HOUR)), BOUND_SECONDS)
        assert pruned.succeeded == 29
        assert (await remaining(url))["jobs"] == {running.id, locked}
    assert (await prune(queue, RetentionPolicy(older_than_seconds=HOUR))).succeeded == 1
    assert (await remaining(url))["jobs"] == {running.id}
    assert (await queue.get(running.id)).status == "RUNNING"


async def test_without_skip_locked_the_pruner_waits_for_a_locked_job(pool, databases):
    """The mechanism off (the same statement without SKIP LOCKED): the pass queues behind the lock
    PostgreSQL reports it waiting on, and finishes only once the lock is released."""
    url = databases.queue_url
    old = await history(url, "SUCCEEDED", 5, 2 * DAY)
    blocking = sql.queries("queue")["job_prune_finalized"].replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")
    queue = Queue(pool, replaced_queries={"job_prune_finalized": blocking})
    async with row_locks_held(url, [sorted(old)[0]]):
        running = asyncio.create_task(prune(queue, RetentionPolicy(older_than_seconds=HOUR)))

        async def waiting_on_a_lock() -> bool:
            rows = await execute(url, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND wait_event_type = 'Lock' AND query LIKE %s", ("%doomed%",))
            return bool(rows)
        await wait_until(waiting_on_a_lock, BOUND_SECONDS, "the pruner to wait on the held row lock")
        assert not running.done()
    assert (await asyncio.wait_for(running, BOUND_SECONDS)).succeeded == 5


async def test_a_job_whose_key_is_inside_the_window_stays_so_a_retry_finds_it(make_queue, databases):
    """A keyed job, claimed and succeeded, finalized two hours ago but keyed a minute ago: a pass at one
    hour keeps it and the client's retry is answered with it. Ignoring the window (one of a microsecond),
    the pass deletes it and the same retry makes a second job."""
    url, queue = databases.queue_url, make_queue()
    keyed = Submission(payload={"amount_cents": 1250, "currency": "USD"}, key="order-17", kind="charge")
    (first,) = await queue.submit_keyed([keyed], [uuid.uuid4()], DAY, all_or_none=True)
    (claimed,) = await queue.claim(1, "worker-1", lease_seconds=60)
    assert await queue.succeed(claimed)
    await execute(url, "UPDATE jobs SET created_at = now() - interval '3 hours', "
                       "finalized_at = now() - interval '2 hours'")
    await execute(url, "UPDATE job_submission_keys SET created_at = now() - interval '1 minute'")

    assert (await prune(queue, RetentionPolicy(older_than_seconds=HOUR, key_window_seconds=DAY))).succeeded == 0
    (retried,) = await queue.submit_keyed([keyed], [uuid.uuid4()], DAY, all_or_none=True)
    assert retried == Stored(first.job_id, replayed=True, status="SUCCEEDED")

    ignoring = RetentionPolicy(older_than_seconds=HOUR, key_window_seconds=1e-6)
    assert (await prune(queue, ignoring)).succeeded == 1
    (duplicate,) = await queue.submit_keyed([keyed], [uuid.uuid4()], DAY, all_or_none=True)
    assert not duplicate.replayed and duplicate.job_id != first.job_id


@pytest.mark.parametrize("fields", [{"older_than_seconds": -1}, {"older_than_seconds": float("nan")},
                                    {"older_than_seconds": HOUR, "batch": 0},
                                    {"older_than_seconds": HOUR, "batch": 10_001},
                                    {"older_than_seconds": HOUR, "key_window_seconds": 0}])
def test_a_bad_policy_is_refused_with_one_line(fields):
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        RetentionPolicy(**fields)
