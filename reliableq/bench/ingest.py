"""The ingest scenario: durable submission, over HTTP to the API process (one job per request, or a batch
per request) and straight into PostgreSQL through the queue in the bench's own process (the same inserts
without HTTP: the difference is the API's overhead, and these are the points set beside the peers'
in-process enqueue). Every acknowledged id is checked stored by the gate.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from reliableq import db
from reliableq.bench.gate import UNFINISHED_CHECK, gate
from reliableq.bench.http_load import LoopbackHttp
from reliableq.bench.profiles import BATCH_JOBS, PAYLOAD, batch_point_jobs
from reliableq.bench.results import Measured, Sample, Window
from reliableq.bench.runner import Bench
from reliableq.bench.stack import api_process, process_cpu_seconds, run_system
from reliableq.lab.harness import LocalSystem
from reliableq.payload import Submission
from reliableq.queue import Queue

INGEST_VIAS = ("http", "http-batch", "direct", "direct-batch")
# Requests (of one job) each HTTP client sends before the clock starts: they open its connection, let the API's pool
# grow to what the clients keep busy and pass psycopg's prepare threshold on its connections, as pgbench
# (the bound these points are set beside) connects and prepares before its own clock. 10 were too few: a
# fresh API's first 800 timed requests from 16 clients still met its pool growing (p99 59 ms, 2,108/s; a
# second round 7.9 ms, 3,103/s); after 30, 6.8 ms and 3,333/s in the first round. The in-process points
# are set beside the peers' enqueue, which starts as cold as they do: they are not warmed.
HTTP_WARM_UP_REQUESTS = 30


def is_batch(via: str) -> bool:
    return via.endswith("-batch")


def _spent(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


async def ingest(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for clients in p.ingest_clients:
        for via in INGEST_VIAS:
            point = f"{via} c={clients}"
            jobs = batch_point_jobs(p, clients) if is_batch(via) else p.ingest_jobs

            async def body(clients=clients, via=via, point=point, jobs=jobs) -> Measured:
                async with run_system(bench, f"ingest-{point}-{repeat}", charge=False) as system:
                    if via.startswith("http"):
                        async with api_process(system) as (served, server):
                            submitted = await submit_jobs(served, via, clients, jobs, HTTP_WARM_UP_REQUESTS,
                                                          cpu_of=server.process.pid)
                    else:
                        submitted = await submit_jobs(system, via, clients, jobs)
                    passed, checks = await gate(system.databases, submitted.acknowledged, waive={
                        UNFINISHED_CHECK: "ingestion runs store jobs and never execute them"})
                samples, cpu = submitted.samples, submitted.cpu_seconds
                metrics = {"jobs": submitted.timed_jobs, "requests": len(samples),
                           "jobs_per_second": submitted.jobs_per_second,
                           # What one API process's CPU caps it at: 1000 / this requests a second per core.
                           "api_cpu_ms_per_request": 1000 * cpu / len(samples) if cpu is not None else None}
                return Measured(metrics, passed, checks, samples, submitted.window)
            await bench.measure("ingest", point, {"clients": clients, "via": via, "jobs": jobs,
                                                  "jobs_per_request": BATCH_JOBS if is_batch(via) else 1},
                                "jobs_per_second", repeat, body)


@dataclass(frozen=True)
class Submitted:
    """What `submit_jobs` submitted. `acknowledged`: every acknowledged id, the warm-up's too (all are gated);
    `samples`, `window` and `timed_jobs`: the timed requests only; `cpu_seconds`: the CPU of the process
    it was asked to watch over that window (None when it could not be read)."""
    acknowledged: list[uuid.UUID]
    samples: list[Sample]
    window: Window
    timed_jobs: int
    cpu_seconds: float | None = None

    @property
    def jobs_per_second(self) -> float:
        return self.timed_jobs / self.window.seconds


async def submit_jobs(system: LocalSystem, via: str, clients: int, jobs: int, warm_up: int = 0,
                      cpu_of: int | None = None) -> Submitted:
    """`jobs` submitted `via` one of INGEST_VIAS by `clients` at once, after each client's first `warm_up`
    requests (untimed), with the CPU of process `cpu_of` over the timed window."""
    acknowledged: list[uuid.UUID] = []
    samples: list[Sample] = []
    submit = await _submitter(system, via, clients)
    try:
        async def warm() -> None:
            for _ in range(warm_up):  # one job each, a batch point's too: the connections warm, not the table
                acknowledged.extend(await submit(1))
        await asyncio.gather(*(warm() for _ in range(clients)))
        untimed = len(acknowledged)
        # A shared iterator: each request takes the next slice of job numbers (one, or a batch).
        starts = iter(range(0, jobs, submit.batch))

        async def client() -> None:
            for first in starts:
                begun = time.monotonic()
                acknowledged.extend(await submit(min(submit.batch, jobs - first)))
                samples.append(Sample(begun, time.monotonic()))
        cpu_before = process_cpu_seconds(cpu_of) if cpu_of is not None else None
        start = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        window = Window(start, time.monotonic())
        cpu = _spent(cpu_before, process_cpu_seconds(cpu_of)) if cpu_of is not None else None
        return Submitted(acknowledged, samples, window, len(acknowledged) - untimed, cpu)
    finally:
        await submit.aclose()


class _Submit:
    """Submits up to `batch` jobs per call and returns their acknowledged ids: one job per request over
    HTTP to the API process, `batch` per request through its batch endpoint, or the same straight into
    PostgreSQL through the queue (the same inserts without HTTP: the difference is the API's overhead)."""

    def __init__(self, submit: Callable[[int], Awaitable[list[uuid.UUID]]], close: Callable[[], Awaitable[None]],
                 batch: int = 1) -> None:
        self._submit, self._close, self.batch = submit, close, batch

    async def __call__(self, jobs: int) -> list[uuid.UUID]:
        return await self._submit(jobs)

    async def aclose(self) -> None:
        await self._close()


async def _submitter(system: LocalSystem, via: str, clients: int) -> _Submit:
    if via in ("http", "http-batch"):
        http = LoopbackHttp(system.api_url)  # its CPU shares the cores with the API it measures: see its module

        async def over_http(jobs: int) -> list[uuid.UUID]:
            return [uuid.UUID((await http.post_json("/v1/jobs", PAYLOAD, expect=202))["id"])]

        async def in_batches(jobs: int) -> list[uuid.UUID]:
            accepted = await http.post_json("/v1/jobs/batch", {"jobs": [PAYLOAD] * jobs}, expect=202)
            return [uuid.UUID(job["id"]) for job in accepted["jobs"]]
        if via == "http":
            return _Submit(over_http, http.aclose)
        return _Submit(in_batches, http.aclose, BATCH_JOBS)
    pool = await db.open_pool_checked(system.databases.queue_url, max_size=clients, min_size=clients)
    queue = Queue(pool)
    submission = Submission(payload=dict(PAYLOAD), max_attempts=5, kind="charge")

    async def direct(jobs: int) -> list[uuid.UUID]:
        return [(await queue.submit(submission)).id]

    async def direct_batch(jobs: int) -> list[uuid.UUID]:  # the API's unkeyed batch: one statement and commit
        return await queue.submit_many([submission] * jobs)
    if via == "direct":
        return _Submit(direct, pool.close)
    return _Submit(direct_batch, pool.close, BATCH_JOBS)
