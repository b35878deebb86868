"""The fairness scenarios: what the fair claim costs, and what it buys a quiet tenant beside a flood.

`fairness`: at each point a scratch queue database holds the profile's `fairness_pending` due jobs shared
among 1, 10 or 1,000 tenants; the same claim of CLAIM_SIZE jobs is run again and again, FIFO
(job_claim_due_skip_locked) and fair (job_claim_due_fair) in turn, each in a transaction rolled back, so
every claim meets the same backlog. Its gate: each fair claim took every tenant's first before anyone's
second (as many tenants as the claim could take, each once). The report sets the fair claim's time beside
the FIFO one's as a ratio.

`quiet-tenant`: one tenant (FLOOD) has the profile's `flood_jobs` no-op jobs due at once, drained by
FLOOD_WORKERS worker processes of FLOOD_PERMITS permits; as they drain, another tenant (QUIET) submits the
profile's `quiet_jobs` no-op jobs one at a time, each after a pause drawn from the bench's seed (the pickup
scenario's pauses), whether or not its last one was claimed yet. Each quiet job's pickup is read from
PostgreSQL's clock: its first claim's claimed_at minus its created_at. Two points in one bench, on the
same schedule: first in first out (fairness off) and fair (fairness on). Its gate: the stored invariants;
every quiet job claimed; every one stored while the flood still had jobs waiting (else the run measured no
flood, and the profile's flood is too small for this machine); and, fair, every one claimed within
fair_bound claims. Not measured: tenants whose jobs differ in cost (the fair claim is fair by count).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from reliableq import db, scratch, sql
from reliableq.bench.gate import UNCHARGED_CHECK, gate, judged
from reliableq.bench.peer_runners import PICKUP_IDLE_SECONDS
from reliableq.bench.results import Measured, centile_metrics, worker_time_metrics
from reliableq.bench.runner import Bench
from reliableq.bench.stack import drain, run_span, run_system
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import read_rows
from reliableq.payload import Submission

TENANTS = (1, 10, 1000)
CLAIM_SIZE = 8
CLAIMS = {"fifo": "job_claim_due_skip_locked", "fair": "job_claim_due_fair"}
PARAMS = {"now": None, "limit": CLAIM_SIZE, "reclaim_expired": True, "enforce_budget": True, "worker_id": "bench",
          "lease_seconds": 30.0}


async def fairness(bench: Bench, repeat: int) -> None:
    pending = bench.profile.fairness_pending
    for tenants in TENANTS:
        async def body(tenants=tenants) -> Measured:
            return _claim_costs(tenants, pending, bench.profile.fairness_claims)
        await bench.measure("fairness", f"{tenants} tenants", {"tenants": tenants, "pending": pending,
                                                               "claim_size": CLAIM_SIZE},
                            "fair_claim_ms", repeat, body)


def _claim_costs(tenants: int, pending: int, claims: int) -> Measured:
    times: dict[str, list[float]] = {name: [] for name in CLAIMS}
    unfair: list[dict] = []
    with scratch.scratch_databases("rq_bench_fair") as databases:
        db.migrate(databases)
        with psycopg.connect(databases.queue_url, autocommit=True) as conn:
            conn.execute(sql.queries("bench")["job_insert_many_tenants"], {"jobs": pending, "tenants": tenants})
            conn.execute("ANALYZE jobs")
            for _ in range(claims + 1):  # the first round warms the caches and is not counted
                for name, query in CLAIMS.items():
                    began = time.perf_counter()
                    with conn.transaction(force_rollback=True):
                        cursor = conn.cursor(row_factory=dict_row)
                        rows = cursor.execute(sql.queries("queue")[query], PARAMS).fetchall()
                    times[name].append(time.perf_counter() - began)
                    if name == "fair":
                        taken = Counter(row["tenant"] for row in rows)
                        if len(taken) != min(tenants, CLAIM_SIZE) or len(rows) != CLAIM_SIZE:
                            unfair.append({"claim took": dict(taken)})
    fifo, fair = (1000 * sum(times[name][1:]) / claims for name in CLAIMS)
    passed, checks = judged([Check(f"a fair claim of {CLAIM_SIZE} takes {min(tenants, CLAIM_SIZE)} tenants' first jobs "
                                   "before anyone's second, and fills the claim", unfair[:3])])
    return Measured({"tenants": tenants, "pending": pending, "fifo_claim_ms": fifo, "fair_claim_ms": fair,
                     "fair_over_fifo": fair / fifo}, passed, checks)


# -- a quiet tenant beside a flood ------------------------------------------------------------------

FLOOD, QUIET = "flood", "quiet"
FLOOD_WORKERS, FLOOD_PERMITS = 2, 4  # two processes, so claims race as a fleet's do
QUIET_TENANT = "quiet-tenant"  # the scenario's name


def fair_bound(workers: int, tenants: int = 2) -> int:
    """Claims that may come, when the claim is fair, between a quiet job's becoming claimable (visible, and
    its tenant's earlier jobs claimed) and its own claim. One claimer alone needs at most `tenants` (K):
    a claim of L >= K jobs takes every waiting tenant's first, a smaller one starts its round one tenant
    further on (sql/queue.sql job_claim_due_fair). Beside W claimers, a turn may go to a claim already under
    way when the job became claimable (one per worker), which costs another round of K - 1, and up to W - 1
    claims running beside the one that takes it may find it locked or be timed before it: at most
    (K - 1) 2W + 2 (W - 1) < 2 K W. First in first out, it is the flood's backlog over L: hundreds."""
    return 2 * tenants * workers


def quiet_pickups(claims: Sequence[dict[str, Any]], quiet: Sequence[tuple[uuid.UUID, datetime]], workers: int,
                  fair: bool) -> tuple[dict[str, Any], list[Check]]:
    """The quiet tenant's pickups and the checks on them, from every job's first claim (lab_queue
    job_first_claims: job_id, tenant, created_at, claimed_at, worker_id) and the quiet jobs in the order they
    were submitted, each with PostgreSQL's clock read once its insert had committed (`visible`). A claim is
    a worker's jobs sharing one claimed_at; those ahead of a quiet job took jobs at or after the moment it
    became claimable (visible, and every earlier quiet job claimed) and before its own claim."""
    first = {row["job_id"]: row for row in claims}
    claim_times = sorted(at for at, _ in {(row["claimed_at"], row["worker_id"]) for row in claims})
    flood_times = sorted(row["claimed_at"] for row in claims if row["tenant"] == FLOOD)
    bound = fair_bound(workers)
    waits_ms: list[float] = []
    unclaimed, unmet, beyond = [], [], []
    ahead_most, met_fewest = 0, None
    earlier_claimed: datetime | None = None  # the latest claim of an earlier quiet job
    for job_id, visible in quiet:
        met = len(flood_times) - bisect_right(flood_times, visible)  # the flood's jobs still waiting then
        met_fewest = met if met_fewest is None else min(met_fewest, met)
        if met == 0:
            unmet.append({"job_id": job_id, "visible": visible})
        row = first.get(job_id)
        if row is None:
            unclaimed.append({"job_id": job_id})
            continue
        waits_ms.append(1000 * (row["claimed_at"] - row["created_at"]).total_seconds())
        claimable = visible if earlier_claimed is None else max(visible, earlier_claimed)
        ahead = max(0, bisect_left(claim_times, row["claimed_at"]) - bisect_left(claim_times, claimable))
        ahead_most = max(ahead_most, ahead)
        if ahead > bound:
            beyond.append({"job_id": job_id, "claims_ahead": ahead})
        earlier_claimed = row["claimed_at"] if earlier_claimed is None else max(earlier_claimed, row["claimed_at"])
    checks = [Check("every quiet job was claimed", unclaimed, note=f"{len(quiet) - len(unclaimed)} of {len(quiet)}"),
              Check("every quiet job was stored while the flooding tenant still had jobs waiting", unmet,
                    note=f"fewest waiting: {met_fewest}")]
    if fair:
        checks.append(Check(f"each quiet job was claimed within {bound} claims of becoming claimable "
                            f"(2 x 2 tenants x {workers} workers)", beyond, note=f"most: {ahead_most}"))
    metrics = {"quiet_jobs": len(quiet), "quiet_claimed": len(waits_ms), "claims_ahead_max": ahead_most,
               "flood_waiting_min": met_fewest, "fair_bound_claims": bound} | centile_metrics(waits_ms, "pickup")
    return metrics, checks


async def quiet_tenant(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for fair in (False, True):
        point = "fair" if fair else "FIFO"

        async def body(fair=fair, point=point) -> Measured:
            return await _quiet_beside_flood(bench, f"{QUIET_TENANT}-{point}-{repeat}", fair, bench.seed + repeat)
        await bench.measure(QUIET_TENANT, point, {"fairness": fair, "flood_jobs": p.flood_jobs,
                                                  "quiet_jobs": p.quiet_jobs, "workers": FLOOD_WORKERS,
                                                  "permits": FLOOD_PERMITS, "seed": bench.seed + repeat},
                            "pickup_p50_ms", repeat, body)


async def _quiet_beside_flood(bench: Bench, label: str, fair: bool, seed: int) -> Measured:
    p = bench.profile
    pauses = random.Random(seed)  # the same schedule at both points
    quiet: list[tuple[uuid.UUID, datetime]] = []
    async with run_system(bench, label, charge=False, mechanisms=bench.mechanisms.with_flags(fairness=fair)) as system:
        async def submit_quietly() -> None:
            for _ in range(p.quiet_jobs):
                await asyncio.sleep(pauses.uniform(*PICKUP_IDLE_SECONDS))
                job = await system.queue.submit(Submission({}, kind="noop", tenant=QUIET))
                quiet.append((job.id, await system.queue.database_now()))  # read after its commit
        window = await drain(bench, system, p.flood_jobs, FLOOD_WORKERS, FLOOD_PERMITS, "noop", FLOOD,
                             submit_quietly)
        stats = await system.stop_worker_processes()
        span = await run_span(system)
        claims = await read_rows(system.databases.queue_url, "lab_queue", "job_first_claims")
        metrics, checks = quiet_pickups(claims, quiet, FLOOD_WORKERS, fair)
        passed, rows = await gate(system.databases, waive={UNCHARGED_CHECK: "no-op jobs have no effect"},
                                  extra=checks)
    seconds = span["seconds"] or window.seconds
    metrics |= {"jobs": span["jobs"], "seconds": seconds, "jobs_per_second": span["jobs"] / seconds
                } | worker_time_metrics(stats, span["jobs"])
    return Measured(metrics, passed, rows, [], window)
