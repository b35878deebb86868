"""One benchmark run's processes: fresh scratch databases and real `reliableq` processes on loopback (a
charge service, the API when the run needs it, workers on demand), stopped and dropped on exit.

Processes are started with the CLI as an operator would (`reliableq.lab.processes`). What this module
does not do: decide what a run measures (the scenarios do) or judge it (the gate does).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from reliableq import db, sql
from reliableq.bench.profiles import PAYLOAD
from reliableq.bench.results import Window
from reliableq.bench.runner import Bench
from reliableq.lab import processes
from reliableq.lab.waiting import wait_until
from reliableq.queue import Queue

_Q = sql.queries("bench")
WORKER_READY_SECONDS = 30.0


class RunStack:
    """Fresh databases and real processes for one run: a charge service (with `charge_args`), the API
    when asked, and workers on demand. Everything it started is stopped and its databases dropped on exit."""

    def __init__(self, bench: Bench, label: str, charge_args: Sequence[str] = (), api: bool = False,
                 charge: bool = True) -> None:
        self.bench, self.label = bench, label
        self.charge_args, self.want_api, self.want_charge = list(charge_args), api, charge
        self.workers: list[processes.CliProcess] = []
        self._started: list[processes.CliProcess] = []
        self.charge_url = self.api_url = ""

    @property
    def logs(self) -> Path:
        return self.bench.out_dir / "logs" / re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.label)

    async def __aenter__(self) -> RunStack:
        self._exit = AsyncExitStack()
        await self._exit.__aenter__()
        try:
            self.databases = self._exit.enter_context(
                db.scratch_databases("rq_bench", templates=self.bench.templates))
            self._exit.callback(self._kill_all)
            servers = []
            if self.want_charge:
                servers.append(processes.spawn_server(self.databases, "charge-service", *self.charge_args,
                                                      log_path=self.logs / "charge.log"))
            if self.want_api:
                servers.append(processes.spawn_server(self.databases, "api", log_path=self.logs / "api.log"))
            started = await asyncio.gather(*servers)
            self._started += [server for server, _ in started]
            if self.want_charge:
                self.charge_url = started[0][1]
            if self.want_api:
                self.api_url = started[-1][1]
            self.pool = await db.open_pool_checked(self.databases.queue_url, max_size=4)
            self._exit.push_async_callback(self.pool.close)
            self.queue = Queue(self.pool)
        except BaseException:
            await self._exit.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._exit.aclose()

    def _kill_all(self) -> None:
        for process in self._started:
            process.kill()

    async def start_workers(self, count: int, permits: int, lease_seconds: float = 30.0,
                            extra: Sequence[str] = ()) -> list[processes.CliProcess]:
        """`count` worker processes with `permits` each; returns once every one is claiming."""
        started = []
        for n in range(count):
            worker = processes.spawn_worker(
                self.databases, self.charge_url, f"bench-w{len(self.workers) + 1}", lease_seconds,
                "--concurrency", str(permits), "--seed", str(self.bench.seed + n),
                *self.bench.worker_off_args(), *extra, log_path=self.logs / f"worker-{len(self.workers) + 1}.log")
            self.workers.append(worker)
            self._started.append(worker)
            started.append(worker)
        await asyncio.gather(*(processes.wait_running(w, WORKER_READY_SECONDS) for w in started))
        return started

    async def stop_workers(self) -> list[dict[str, Any]]:
        """SIGTERM every worker; the stats each wrote to its status file as it stopped."""
        running = [w for w in self.workers if w.process.poll() is None]
        await asyncio.gather(*(processes.stop(w) for w in running))
        return [status["stats"] for w in running if (status := w.status()) and status["state"] == "stopped"]

    async def preload(self, jobs: int, max_attempts: int = 5, kind: str = "charge") -> None:
        """Insert `jobs` due jobs in one transaction: every worker sees the whole batch at once."""
        async with self.pool.connection() as conn:
            await conn.execute(_Q["job_insert_many"], {"payload": Jsonb(PAYLOAD), "max_attempts": max_attempts,
                                                       "jobs": jobs, "kind": kind})

    async def drain(self, jobs: int, workers: int, permits: int, kind: str = "charge") -> Window:
        """Start the workers, preload `jobs` due at once, and wait until all settled; the run's window."""
        await self.start_workers(workers, permits)
        start = time.monotonic()
        await self.preload(jobs, kind=kind)
        await self.wait_settled(self.bench.profile.settle_seconds)
        return Window(start, time.monotonic())

    async def wait_settled(self, timeout: float) -> None:
        async def settled() -> bool:
            counts = await self.queue.counts()
            if self.workers and all(w.process.poll() is not None for w in self.workers):
                raise RuntimeError(f"every worker exited before the run settled: {counts}")
            return counts["PENDING"] == 0 and counts["RUNNING"] == 0
        await wait_until(settled, timeout, "every job to be SUCCEEDED or DEAD")

    async def charge_stats(self) -> dict[str, Any]:
        """The charge service's own counters (in-flight peak, requests, its process's CPU seconds)."""
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(f"{self.charge_url}/v1/stats")).json()

    async def span(self) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(_Q["job_bench_span"])
            return await cur.fetchone()

    async def reclaim_lags(self) -> list[float]:
        async with self.pool.connection() as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(_Q["job_bench_reclaim_lag"])
            return [row["reclaim_lag_seconds"] for row in await cur.fetchall()]
