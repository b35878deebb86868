"""One benchmark run over the lab's harness: fresh scratch databases (cloned from migrated templates)
and real `reliableq` processes on loopback (a charge service, the API when the run needs it, workers on
demand), each writing its log under the bench's output folder.

Everything here is what only the benchmark asks of a system: workers seeded and numbered per run, jobs
preloaded all due at once, and the run's span and reclaim lags read back. What this module does not do:
decide what a run measures (the scenarios do) or judge it (the gate does).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from reliableq import db, sql
from reliableq.bench.profiles import PAYLOAD
from reliableq.bench.results import Window
from reliableq.bench.runner import Bench
from reliableq.config import Mechanisms
from reliableq.db import Databases
from reliableq.lab import processes
from reliableq.lab.harness import LocalSystem, local_system, off_args
from reliableq.payload import DEFAULT_TENANT

_Q = sql.queries("bench")
WORKER_READY_SECONDS = 30.0


@asynccontextmanager
async def run_system(bench: Bench, label: str, charge_args: Sequence[str] = (), api: bool = False,
                     charge: bool = True, mechanisms: Mechanisms | None = None,
                     databases: Databases | None = None) -> AsyncIterator[LocalSystem]:
    """The harness with every server a real process: a charge service (with `charge_args`) and the API
    when asked, each with `mechanisms` (default: the bench's). Stopped, and its scratch databases dropped, on
    exit. `databases`: run on these (another server's) instead, left for their owner to remove."""
    logs = bench.out_dir / "logs" / re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)
    async with local_system(mechanisms or bench.mechanisms, servers="processes", charge_args=charge_args, api=api,
                            charge=charge, database_prefix="rq_bench", databases=databases,
                            worker_pool_size=0, logs=logs) as system:
        yield system


@asynccontextmanager
async def api_process(system: LocalSystem, *extra: str) -> AsyncIterator[tuple[LocalSystem, processes.CliProcess]]:
    """The API as a process of the bench's own over `system`'s databases, with its switches and `extra`
    arguments: `system` pointed at it, and the process (its CPU can be read); stopped with SIGTERM on exit."""
    server, url = await processes.spawn_server(system.databases, "api", *off_args(system.mechanisms), *extra,
                                               log_path=system.logs / "api.log" if system.logs else None)
    try:
        yield replace(system, api_url=url), server
    finally:
        await processes.stop(server)


async def start_workers(bench: Bench, system: LocalSystem, count: int, permits: int, lease_seconds: float = 30.0,
                        extra: Sequence[str] = ()) -> list[processes.CliProcess]:
    """`count` worker processes with `permits` each, each seeded apart; returns once every one is claiming."""
    first = len(system.worker_processes)
    started = [system.spawn_worker(f"bench-w{first + n + 1}", lease_seconds, "--concurrency", str(permits),
                                   "--seed", str(bench.seed + n), *extra) for n in range(count)]
    await asyncio.gather(*(processes.wait_running(w, WORKER_READY_SECONDS) for w in started))
    return started


async def preload(system: LocalSystem, jobs: int, max_attempts: int = 5, kind: str = "charge",
                  tenant: str = DEFAULT_TENANT) -> None:
    """Insert `jobs` due jobs of `tenant` in one transaction: every worker sees the whole batch at once."""
    async with system.queue.pool.connection() as conn:
        await conn.execute(_Q["job_insert_many"], {"payload": Jsonb(PAYLOAD), "max_attempts": max_attempts,
                                                   "jobs": jobs, "kind": kind, "tenant": tenant})


async def drain(bench: Bench, system: LocalSystem, jobs: int, workers: int, permits: int,
                kind: str = "charge", tenant: str = DEFAULT_TENANT,
                while_draining: Callable[[], Awaitable[object]] | None = None, extra: Sequence[str] = ()) -> Window:
    """Start the workers (`extra`: more arguments for each), preload `jobs` of `tenant` due at once, run
    `while_draining` (if any) as they drain them, and wait until all settled; the run's window."""
    await start_workers(bench, system, workers, permits, extra=extra)
    start = time.monotonic()
    await preload(system, jobs, kind=kind, tenant=tenant)
    if while_draining is not None:
        await while_draining()
    await system.wait_settled(timeout=bench.profile.settle_seconds)
    return Window(start, time.monotonic())


async def run_span(system: LocalSystem) -> dict[str, Any]:
    async with system.queue.pool.connection() as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q["job_bench_span"])
        return await cur.fetchone()


async def reclaim_lags(system: LocalSystem) -> list[float]:
    async with system.queue.pool.connection() as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q["job_bench_reclaim_lag"])
        return [row["reclaim_lag_seconds"] for row in await cur.fetchall()]


def process_cpu_seconds(pid: int, children: bool = False) -> float | None:
    """User and system CPU of process `pid` so far, from /proc (`children`: with its children that exited
    and were waited for); None where there is none (not Linux, or no such process)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command's ")": state is field 0, utime 11, stime 12, cutime 13, cstime 14.
    ticks = sum(int(fields[i]) for i in ((11, 12, 13, 14) if children else (11, 12)))
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds() -> float | None:
    """CPU the embedded PostgreSQL has used so far, for whatever asked it: its postmaster, every live process
    it started (sessions, checkpointer, WAL writer) and those that ended. None with DATABASE_URL (another
    machine's, perhaps) or without /proc."""
    if os.environ.get("DATABASE_URL"):
        return None
    try:
        postmaster = int((db.embedded_data_dir() / "postmaster.pid").read_text().split()[0])
        children = [int(p) for p in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()]
    except (OSError, ValueError, IndexError):
        return None
    total = process_cpu_seconds(postmaster, children=True)
    return None if total is None else total + sum(process_cpu_seconds(p) or 0.0 for p in children)
