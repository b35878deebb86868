"""A whole system for one experiment: fresh databases, the charge service and the API on loopback,
and workers in this process, all over the same core and the same mechanism switches.

Tests, stages, notebooks and the demo use it so that every experiment starts clean and leaves nothing
behind. The HTTP is real (uvicorn on 127.0.0.1) and so is PostgreSQL; only process boundaries are
collapsed, which is why crashes here are simulated by the fault plan (the CLI demos use real signals).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from reliableq import db
from reliableq.api import create_api_app
from reliableq.charge.client import ChargeClient
from reliableq.charge.handler import standard_handlers
from reliableq.charge.service import ChargeFaults, create_charge_app
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.handlers import HandlerRegistry
from reliableq.lab.faults import FaultPlan
from reliableq.lab.ledger import JobCounts, job_counts
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Job, Queue
from reliableq.servers import LoopbackServer
from reliableq.worker import Worker, WorkerStats


@dataclass
class LocalSystem:
    databases: db.Databases
    mechanisms: Mechanisms
    api_url: str
    charge_url: str
    charge_faults: ChargeFaults
    api_faults: FaultPlan
    queue: Queue  # the harness's own view of the jobs, on its own pool: it never waits behind the workers
    http: httpx.AsyncClient
    worker_pool: AsyncConnectionPool  # shared by the workers started here
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _workers: list[Worker] = field(default_factory=list)
    _charge_clients: list[ChargeClient] = field(default_factory=list)  # closed when the workers stop

    async def submit_http(self, amount_cents: int = 1250, **fields: Any) -> uuid.UUID:
        """Submit one job through the API; returns its id once the API answered 202."""
        response = await self.http.post(f"{self.api_url}/v1/jobs", json={"amount_cents": amount_cents, **fields})
        if response.status_code != 202:
            raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
        return uuid.UUID(response.json()["id"])

    async def submit_direct(self, submission: Submission, job_id: uuid.UUID | None = None) -> Job:
        """Insert one job straight through the queue (when the API is not what is being shown)."""
        return await self.queue.submit(submission, job_id)

    def worker(self, settings: WorkerSettings = WorkerSettings(), faults: FaultPlan | None = None,
               mechanisms: Mechanisms | None = None, handlers: HandlerRegistry | None = None) -> Worker:
        """A worker over this system, running the standard job kinds unless given `handlers`. Start it
        with `start_worker`, or `await worker.run()`."""
        m = mechanisms or self.mechanisms
        queue = Queue(self.worker_pool, m, faults)
        if handlers is None:
            charges = ChargeClient(self.charge_url, settings.charge_timeout_seconds, send_idempotency_key=m.idempotency)
            self._charge_clients.append(charges)
            handlers = standard_handlers(charges)
        worker = Worker(queue, handlers, settings, faults)
        self._workers.append(worker)
        return worker

    def start_worker(self, worker: Worker) -> asyncio.Task[WorkerStats]:
        """Run `worker` (made here or not) until stop_workers, which asks it to stop."""
        if worker not in self._workers:
            self._workers.append(worker)
        task = asyncio.create_task(worker.run(), name=worker.worker_id)
        self._tasks.append(task)
        return task

    async def wait_until(self, condition: Callable[[], Awaitable[bool]], timeout: float,
                         what: str = "condition", poll_seconds: float = 0.02) -> None:
        """Poll `condition` until true; TimeoutError naming `what` after `timeout` seconds."""
        await wait_until(condition, timeout, what, poll_seconds)

    async def wait_for_status(self, job_id: uuid.UUID, statuses: set[str], timeout: float = 30.0) -> Job:
        async def reached() -> bool:
            job = await self.queue.get(job_id)
            return job is not None and job.status in statuses
        await self.wait_until(reached, timeout, f"job {job_id} to become {'/'.join(sorted(statuses))}")
        return await self.queue.get(job_id)

    async def wait_all_terminal(self, timeout: float = 60.0) -> None:
        async def settled() -> bool:
            counts = await self.queue.counts()
            return counts["PENDING"] == 0 and counts["RUNNING"] == 0
        await self.wait_until(settled, timeout, "every job to be SUCCEEDED or DEAD")

    async def counts(self) -> list[JobCounts]:
        return await job_counts(self.databases)

    async def charge_stats(self) -> dict[str, Any]:
        return (await self.http.get(f"{self.charge_url}/v1/stats")).json()

    async def stop_workers(self) -> list[WorkerStats]:
        for worker in self._workers:
            worker.request_stop()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for charges in self._charge_clients:
            await charges.aclose()
        self._tasks.clear()
        self._workers.clear()
        self._charge_clients.clear()
        return [r for r in results if isinstance(r, WorkerStats)]


@asynccontextmanager
async def local_system(mechanisms: Mechanisms = Mechanisms(), charge_faults: ChargeFaults | None = None,
                       api_faults: FaultPlan | None = None, databases: db.Databases | None = None,
                       database_prefix: str = "rq_lab", worker_pool_size: int = 20) -> AsyncIterator[LocalSystem]:
    """Start a LocalSystem; on exit stop its workers and servers and drop its scratch databases.
    `worker_pool_size`: connections the workers share (their claims, renewals and finalizes)."""
    charge_faults = charge_faults or ChargeFaults()
    api_faults = api_faults or FaultPlan()
    async with AsyncExitStack() as stack:
        if databases is None:
            databases = stack.enter_context(db.scratch_databases(database_prefix))
        else:
            await asyncio.to_thread(db.migrate, databases)
        charge_server = LoopbackServer(create_charge_app(databases.charge_url, charge_faults))
        charge_url = await asyncio.to_thread(charge_server.start)
        stack.callback(charge_server.stop)
        api_server = LoopbackServer(create_api_app(databases.queue_url, mechanisms, api_faults))
        api_url = await asyncio.to_thread(api_server.start)
        stack.callback(api_server.stop)
        own_pool = await db.open_pool_checked(databases.queue_url, max_size=4)
        stack.push_async_callback(own_pool.close)
        worker_pool = await db.open_pool_checked(databases.queue_url, max_size=worker_pool_size)
        stack.push_async_callback(worker_pool.close)
        http = httpx.AsyncClient(timeout=10)
        stack.push_async_callback(http.aclose)
        system = LocalSystem(databases, mechanisms, api_url, charge_url, charge_faults, api_faults,
                             Queue(own_pool, mechanisms), http, worker_pool)
        try:
            yield system
        finally:
            await system.stop_workers()


def fast_settings(**overrides: Any) -> WorkerSettings:
    """Worker settings for experiments: short lease, quick polls, short grace, seeded jitter."""
    base = WorkerSettings(concurrency=4, lease_seconds=1.0, poll_seconds=0.02, charge_timeout_seconds=2.0,
                          backoff_base_seconds=0.05, backoff_max_seconds=0.5, backoff_seed=7,
                          shutdown_grace_seconds=2.0)
    return replace(base, **overrides)
