"""The retention scenario: what a large finished history costs the queue's hot path, and what pruning
it gives back.

Two points on fresh databases, each holding the profile's history of SUCCEEDED jobs (with their attempts
and events) before the same no-op jobs are drained by one worker (no charge service: no-op jobs have no
effect): `kept` leaves the history in place,
`pruned` deletes it first with `reliableq.retention.prune` (timed: the pruner's own rate). Both then
VACUUM ANALYZE, as autovacuum would soon after a large delete, so that the two differ only in what the
tables hold. The headline is jobs per second; the worker's claim and finalize means say where a
difference comes from. `kept` also times the listing's first page and one halfway down the history
(a keyset cursor, not an offset), and lists the whole history page by page: its gate fails unless every
job came back exactly once (with the full profile, a million jobs). Not measured: a history deleted while
workers run, autovacuum's pace.
"""

from __future__ import annotations

import time
from collections import Counter

import psycopg
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.bench.gate import UNCHARGED_CHECK, gate
from reliableq.bench.results import Measured, worker_time_metrics
from reliableq.bench.runner import Bench
from reliableq.bench.stack import drain, run_system
from reliableq.lab.harness import LocalSystem
from reliableq.lab.invariants import Check
from reliableq.position import ListPosition
from reliableq.retention import RetentionPolicy, prune

_Q = sql.queries("bench")
PERMITS = 8  # one worker process with the permits the noop scenario's middle point has
PAGE = 100  # the API's default page
WHOLE_LISTING_PAGE = 1000  # the API's largest page
OLDER_THAN_SECONDS = 24 * 3600.0  # the history finished two days ago: all of it is old enough


async def _insert_history(system: LocalSystem, jobs: int) -> float:
    """The history, inserted by one statement; the seconds it took."""
    started = time.monotonic()
    async with system.queue.pool.connection() as conn:
        await conn.execute(_Q["job_insert_finished_history"], {"jobs": jobs})
    return time.monotonic() - started


async def _vacuum(system: LocalSystem) -> None:
    # Outside a transaction (VACUUM refuses one), so on a connection of its own.
    async with await psycopg.AsyncConnection.connect(system.databases.queue_url, autocommit=True) as conn:
        await conn.execute("VACUUM (ANALYZE) jobs, job_attempts, job_events, job_submission_keys")


async def _page_ms(system: LocalSystem, history: int) -> dict[str, float]:
    """Milliseconds for the listing's first page and for the page halfway down the history."""
    started = time.monotonic()
    await system.queue.page(limit=PAGE)
    first = time.monotonic() - started
    async with system.queue.pool.connection() as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q["job_bench_middle_position"],
                                                              {"offset": history // 2})
        row = await cur.fetchone()
    started = time.monotonic()
    await system.queue.page(limit=PAGE, after=ListPosition(row["created_at"], row["id"]))
    return {"list_first_page_ms": 1000 * first, "list_middle_page_ms": 1000 * (time.monotonic() - started)}


async def _listed_once(system: LocalSystem) -> tuple[Check, dict[str, float]]:
    """Every job listed, page by page from the newest: the check that each came back exactly once, and the
    seconds it took."""
    started = time.monotonic()
    listed: Counter = Counter()
    page = await system.queue.page(limit=WHOLE_LISTING_PAGE)
    pages = 1
    while True:
        listed.update(job.id for job in page.jobs)
        if page.next is None:
            break
        page = await system.queue.page(limit=WHOLE_LISTING_PAGE, after=page.next)
        pages += 1
    seconds = time.monotonic() - started
    stored = sum((await system.queue.counts()).values())
    violations = [{"job_id": job_id, "listed": times} for job_id, times in listed.items() if times > 1]
    if len(listed) != stored:
        violations.append({"stored": stored, "listed_distinct": len(listed)})
    check = Check("every job listed exactly once, page by page", violations,
                  note=f"{len(listed):,} jobs in {pages:,} pages of {WHOLE_LISTING_PAGE}, {seconds:.1f} s")
    return check, {"list_all_seconds": seconds}


async def retention(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for pruned_first in (False, True):
        point = f"history={p.retention_history:,} {'pruned' if pruned_first else 'kept'}"

        async def body(pruned_first=pruned_first, point=point) -> Measured:
            async with run_system(bench, f"retention-{point}-{repeat}", charge=False) as system:
                metrics = {"history_jobs": p.retention_history,
                           "history_insert_seconds": await _insert_history(system, p.retention_history)}
                if pruned_first:
                    started = time.monotonic()
                    pruned = await prune(system.queue, RetentionPolicy(OLDER_THAN_SECONDS))
                    seconds = time.monotonic() - started
                    metrics |= {"pruned_jobs": pruned.succeeded, "prune_seconds": seconds,
                                "pruned_per_second": pruned.succeeded / seconds}
                await _vacuum(system)
                listing: list[Check] = []
                if not pruned_first:
                    metrics |= await _page_ms(system, p.retention_history)
                    check, timed = await _listed_once(system)
                    listing.append(check)
                    metrics |= timed
                window = await drain(bench, system, p.execute_jobs, 1, PERMITS, "noop")
                stats = await system.stop_worker_processes()
                passed, checks = await gate(system.databases, waive={UNCHARGED_CHECK: "no-op jobs have no effect"},
                                            extra=listing)
            metrics |= {"jobs": p.execute_jobs, "seconds": window.seconds,
                        "jobs_per_second": p.execute_jobs / window.seconds} | worker_time_metrics(stats, p.execute_jobs)
            return Measured(metrics, passed, checks, [], window)
        await bench.measure("retention", point, {"history": p.retention_history, "jobs": p.execute_jobs,
                                                 "permits": PERMITS, "pruned": pruned_first},
                            "jobs_per_second", repeat, body)
