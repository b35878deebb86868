"""The client-cost scenario: where a no-op job's time goes at one permit, and a submission's over HTTP from
one client. A worker process at concurrency 1 drains the profile's no-op jobs, and the API process takes one
job per request, each under cProfile (`--cprofile FILE`), counting its round trips: the operations that had
to wait for the server's answer. Per job (per request): round trips and the process's CPU; each profile's
top entries are kept beside the results (profiles/*.txt, and *.pstats for pstats or snakeviz). The
profiler adds its own cost (here a third to twice the worker's CPU): its times say where the time goes,
the noop and ingest scenarios how long it takes.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.waiting import Wait

from reliableq.bench.gate import UNCHARGED_CHECK, UNFINISHED_CHECK, gate
from reliableq.bench.ingest import submit_jobs
from reliableq.bench.results import Measured, worker_time_metrics
from reliableq.bench.runner import Bench
from reliableq.bench.stack import api_process, drain, run_span, run_system

TOP_ENTRIES = 30  # lines of each ordering kept in a profile's .txt


class RoundTrips:
    """Round trips of every async psycopg connection in this process: each operation whose generator
    waited to read the server's answer, counted by wrapping AsyncConnection.wait, psycopg's one way of
    waiting for a server, for as long as `counting` lasts. Only `--cprofile` runs count: the wrapper costs
    a generator per operation."""

    count = 0

    @classmethod
    @contextmanager
    def counting(cls) -> Iterator[None]:
        unwrapped = psycopg.AsyncConnection.wait

        async def wait(conn: psycopg.AsyncConnection, gen: Generator, *args: Any, **kwargs: Any) -> Any:
            return await unwrapped(conn, cls._counted(gen), *args, **kwargs)
        psycopg.AsyncConnection.wait = wait
        try:
            yield
        finally:
            psycopg.AsyncConnection.wait = unwrapped

    @classmethod
    def _counted(cls, gen: Generator) -> Generator:
        """`gen`, passed through, counting one round trip the first time it waits only to read (waiting to read
        or write is a pipeline still sending, not waiting for an answer)."""
        waited = False
        try:
            wait = next(gen)
            while True:
                if not waited and wait == Wait.R:
                    waited = True
                    cls.count += 1
                wait = gen.send((yield wait))
        except StopIteration as stop:
            return stop.value


@contextmanager
def profiled(path: Path) -> Iterator[None]:
    """Profile what runs inside (cProfile) and count its round trips; on the way out write `path` (pstats),
    its top entries by own and by cumulative time (`.txt`), and the round trips and CPU (`.json`)."""
    profile = cProfile.Profile()
    cpu_started, wall_started, counted_before = time.process_time(), time.monotonic(), RoundTrips.count
    with RoundTrips.counting():
        profile.enable()
        try:
            yield
        finally:
            profile.disable()
            path.parent.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(path)
            totals = {"round_trips": RoundTrips.count - counted_before,
                      "cpu_seconds": time.process_time() - cpu_started,
                      "wall_seconds": time.monotonic() - wall_started}
            path.with_suffix(".json").write_text(json.dumps(totals))
            path.with_suffix(".txt").write_text(top_entries(path, totals))


def top_entries(path: Path, totals: dict[str, float]) -> str:
    out = io.StringIO()
    out.write(f"{path.name}: {totals['round_trips']} round trips, {totals['cpu_seconds']:.2f} s CPU in "
              f"{totals['wall_seconds']:.2f} s\n")
    stats = pstats.Stats(str(path), stream=out)
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(TOP_ENTRIES)
    return out.getvalue()


async def client_cost(bench: Bench, repeat: int) -> None:
    folder = bench.out_dir / "profiles"
    jobs = bench.profile.execute_jobs

    async def worker_body() -> Measured:
        path = folder / f"worker-c1-{repeat}.pstats"
        async with run_system(bench, f"client-cost-worker-{repeat}") as system:
            window = await drain(bench, system, jobs, 1, 1, kind="noop", extra=("--cprofile", str(path)))
            stats = await system.stop_worker_processes()
            span = await run_span(system)
            passed, checks = await gate(system.databases, waive={UNCHARGED_CHECK: "no-op jobs have no effect"})
        done = span["jobs"]
        seconds = span["seconds"] or window.seconds
        metrics = {"jobs": done, "jobs_per_second": done / seconds if seconds else None,
                   "round_trips_per_job": _counted(path)["round_trips"] / done if done else None,
                   } | worker_time_metrics(stats, done)
        return Measured(metrics, passed, checks, [], window)

    async def api_body() -> Measured:
        path = folder / f"api-c1-{repeat}.pstats"
        async with run_system(bench, f"client-cost-api-{repeat}", charge=False) as system:
            async with api_process(system, "--cprofile", str(path)) as (served, server):
                submitted = await submit_jobs(served, "http", 1, jobs, cpu_of=server.process.pid)
            # After the API stopped: its profile is written.
            passed, checks = await gate(system.databases, submitted.acknowledged, waive={
                UNFINISHED_CHECK: "submissions only: no worker runs them"})
        requests, cpu = len(submitted.samples), submitted.cpu_seconds
        metrics = {"requests": requests, "requests_per_second": requests / submitted.window.seconds,
                   "round_trips_per_request": _counted(path)["round_trips"] / requests,
                   "api_cpu_ms_per_request": 1000 * cpu / requests if cpu is not None else None}
        return Measured(metrics, passed, checks, submitted.samples, submitted.window)

    await bench.measure("client-cost", "worker c=1", {"jobs": jobs, "kind": "noop", "permits": 1,
                                                      "profile": f"profiles/worker-c1-{repeat}.txt"},
                        "round_trips_per_job", repeat, worker_body)
    await bench.measure("client-cost", "api c=1", {"requests": jobs, "clients": 1,
                                                   "profile": f"profiles/api-c1-{repeat}.txt"},
                        "round_trips_per_request", repeat, api_body)


def _counted(path: Path) -> dict[str, float]:
    return json.loads(path.with_suffix(".json").read_text())
