"""The fairness scenario: what one claim costs, first in first out and fair, over a large backlog.

At each point a scratch queue database holds the profile's `fairness_pending` due jobs shared among 1, 10
or 1,000 tenants; the same claim of CLAIM_SIZE jobs is run again and again, FIFO (job_claim_due_skip_locked)
and fair (job_claim_due_fair) in turn, each in a transaction rolled back, so every claim meets the same
backlog. Its gate: each fair claim took every tenant's first before anyone's second (as many tenants as the
claim could take, each once). The report sets the fair claim's time beside the FIFO one's as a ratio.
"""

from __future__ import annotations

import time
from collections import Counter

import psycopg
from psycopg.rows import dict_row

from reliableq import db, scratch, sql
from reliableq.bench.gate import judged
from reliableq.bench.results import Measured
from reliableq.bench.runner import Bench
from reliableq.lab.invariants import Check

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
