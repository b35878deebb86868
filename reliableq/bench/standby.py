"""The standby scenario: what a standby costs the queue, and how long a failover leaves it without one.

Three points on servers of the same making (reliableq/standby.py: the wheel's `initdb`, on loopback): a
primary whose commits wait for a synchronous standby's flush, one streaming to an asynchronous standby,
and one alone (its standby stopped before the run). At each, one job per HTTP request to the API process
from STANDBY_CLIENTS clients, then one worker process of STANDBY_PERMITS permits running them with a
charge each: ingest and execute jobs/s, which the report sets beside the point alone as ratios. The fourth
point is a failover (reliableq/lab/failover_chaos.py with the bench's seed): seconds from the primary's
death to the first 202 and to the first claim on the promoted server, gated by that run's invariants.
"""

from __future__ import annotations

import asyncio
import time

from reliableq import scratch
from reliableq.bench.gate import gate, judged
from reliableq.bench.ingest import submit_jobs
from reliableq.bench.results import Measured, Window, worker_time_metrics
from reliableq.bench.runner import Bench
from reliableq.bench.stack import run_system, start_workers
from reliableq.db import Databases
from reliableq.lab.failover_chaos import FailoverConfig, run_failover_chaos
from reliableq.standby import StandbyPair, start_pair

STANDBY_CLIENTS = 4
STANDBY_PERMITS = 4
REPLICATIONS = ("synchronous", "asynchronous", "none")
FAILOVER = "failover"
POINTS = (*REPLICATIONS, FAILOVER)


async def standby(bench: Bench, repeat: int) -> None:
    jobs = bench.profile.standby_jobs
    for replication in REPLICATIONS:
        async def body(replication=replication) -> Measured:
            return await _replicated(bench, f"standby-{replication}-{repeat}", replication, jobs)
        await bench.measure("standby", replication, {"replication": replication, "jobs": jobs,
                                                     "clients": STANDBY_CLIENTS, "permits": STANDBY_PERMITS},
                            "execute_jobs_per_second", repeat, body)

    async def failover() -> Measured:
        report = await run_failover_chaos(FailoverConfig(seed=bench.seed + repeat))
        passed, checks = judged(report.checks)
        return Measured({"first_202_after_death_seconds": report.first_acknowledged_after_seconds,
                         "first_claim_after_death_seconds": report.first_claim_after_seconds,
                         "acknowledged": len(report.acknowledged), "lost": len(report.lost),
                         "refused_and_retried": report.refused}, passed, checks)
    await bench.measure("standby", FAILOVER, {"replication": "synchronous", "seed": bench.seed + repeat},
                        "first_claim_after_death_seconds", repeat, failover)


async def _replicated(bench: Bench, label: str, replication: str, jobs: int) -> Measured:
    pair = await start_pair(synchronous=replication == "synchronous")
    try:
        if replication == "none":
            await asyncio.to_thread(_alone, pair)
        with scratch.empty_database("rq_bench_standby_charge") as charge_url:
            databases = Databases(pair.url("rq_bench_standby"), charge_url)
            async with run_system(bench, label, api=True, databases=databases) as system:
                submitted = await submit_jobs(system, "http", STANDBY_CLIENTS, jobs)
                acknowledged, samples, ingest = submitted.acknowledged, submitted.samples, submitted.window
                await start_workers(bench, system, 1, STANDBY_PERMITS)
                began = time.monotonic()
                await system.wait_settled(acknowledged, timeout=bench.profile.settle_seconds)
                execute = Window(began, time.monotonic())
                stats = await system.stop_worker_processes()
                passed, checks = await gate(system.databases, acknowledged)
    finally:
        await asyncio.to_thread(pair.stop)
    metrics = {"jobs": len(acknowledged), "ingest_jobs_per_second": len(acknowledged) / ingest.seconds,
               "execute_jobs_per_second": len(acknowledged) / execute.seconds} | worker_time_metrics(stats, jobs)
    return Measured(metrics, passed, checks, samples, Window(ingest.start, execute.end))


def _alone(pair: StandbyPair) -> None:
    """The primary without its standby: the same server, nothing to send its WAL to."""
    pair.standby.stop()
    pair.link.kill()
