"""The one harness: a whole system for one run. Fresh databases, the charge service and the API on
loopback, and workers, all over the same core and the same mechanism switches; everything it started is
stopped, and its databases dropped, on exit.

Two ways to run the parts, one system either way. `servers="threads"` (tests, stages, notebooks): the
servers run in this process on real loopback HTTP and workers are asyncio tasks here, so crashes are
simulated by the fault plan. `servers="processes"` (the benchmark): the servers are real `reliableq`
processes, so nothing shares this process's interpreter. Either way `spawn_worker` starts a real
`reliableq worker` process, for what only real signals show (the kill -9 and pause stories, the
benchmark). Settled means one thing everywhere: no job PENDING or RUNNING (`wait_settled`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from reliableq import db, scratch, sql
from reliableq.api import create_api_app
from reliableq.cancelling import cancel_and_wait, to_thread_to_its_end
from reliableq.charge.client import ChargeClient
from reliableq.charge.handler import STANDARD_KINDS, standard_handlers
from reliableq.charge.service import ChargeFaults, create_charge_app
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.handlers import HandlerRegistry
from reliableq.lab import processes
from reliableq.lab.faults import FaultPlan
from reliableq.lab.ledger import JobCounts, job_counts
from reliableq.lab.pieces import LEARNER_STATEMENT_SECONDS, SHIPPED, Pieces
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Job, Queue
from reliableq.servers import LoopbackServer
from reliableq.worker import Worker, WorkerStats

SETTLED_STATUSES = frozenset({"SUCCEEDED", "DEAD"})
FAST_CHARGE_TIMEOUT_SECONDS = 2.0  # an experiment's in-process workers give a charge up as ambiguous sooner
_LAB_Q = sql.queries("lab_queue")


@dataclass
class LocalSystem:
    databases: db.Databases
    mechanisms: Mechanisms
    api_url: str  # "" when started without the API
    charge_url: str  # "" when started without the charge service
    charge_faults: ChargeFaults | None  # live knobs of an in-process charge service; None for a process
    api_faults: FaultPlan
    queue: Queue  # the harness's own view of the jobs, on its own pool: it never waits behind the workers
    http: httpx.AsyncClient
    worker_pool: AsyncConnectionPool | None  # shared by in-process workers; None if started without one
    logs: Path | None = None  # where worker processes write their output; a pipe each without it
    pieces: Pieces = SHIPPED  # what the in-process workers run in place of the shipped queries and policy
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _workers: list[Worker] = field(default_factory=list)
    _charge_clients: list[ChargeClient] = field(default_factory=list)  # closed when the workers stop
    worker_processes: list[processes.CliProcess] = field(default_factory=list)

    async def submit_http(self, amount_cents: int = 1250, **fields: Any) -> uuid.UUID:
        """Submit one job through the API; returns its id once the API answered 202."""
        response = await self.http.post(f"{self.api_url}/v1/jobs", json={"amount_cents": amount_cents, **fields})
        if response.status_code != 202:
            raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
        return uuid.UUID(response.json()["id"])

    async def submit_direct(self, submission: Submission, job_id: uuid.UUID | None = None) -> Job:
        """Insert one job straight through the queue (when the API is not what is being shown)."""
        return await self.queue.submit(submission, job_id)

    # -- workers in this process ---------------------------------------------------------------

    def worker(self, settings: WorkerSettings = WorkerSettings(), faults: FaultPlan | None = None,
               mechanisms: Mechanisms | None = None, handlers: HandlerRegistry | None = None,
               charge_timeout_seconds: float = FAST_CHARGE_TIMEOUT_SECONDS) -> Worker:
        """A worker over this system, running the standard job kinds (charges given up as ambiguous after
        `charge_timeout_seconds`) unless given `handlers`. Start it with `start_worker`, or
        `await worker.run()`."""
        if self.worker_pool is None:
            raise RuntimeError("this system was started without a pool for in-process workers")
        if settings.db_wait_seconds != self.worker_pool.timeout:
            raise ValueError(f"db_wait_seconds={settings.db_wait_seconds:g}: the in-process workers share one "
                             f"pool, which waits {self.worker_pool.timeout:g} s for a connection")
        m = mechanisms or self.mechanisms
        queue = Queue(self.worker_pool, m, faults, self.pieces.queue_queries)
        if handlers is None:
            charges = ChargeClient(self.charge_url, charge_timeout_seconds, send_idempotency_key=m.idempotency)
            self._charge_clients.append(charges)
            handlers = standard_handlers(charges)
        retry_delays = self.pieces.retry_delays(settings) if self.pieces.retry_delays else None
        permits = self.pieces.permits(settings.concurrency) if self.pieces.permits else None
        worker = Worker(queue, handlers, settings, faults, retry_delays, self.pieces.decision, permits)
        self._workers.append(worker)
        return worker

    def start_worker(self, worker: Worker) -> asyncio.Task[WorkerStats]:
        """Run `worker` (made here or not) until stop_workers, which asks it to stop."""
        if worker not in self._workers:
            self._workers.append(worker)
        task = asyncio.create_task(worker.run(), name=worker.worker_id)
        self._tasks.append(task)
        return task

    async def stop_workers(self, at_once: bool = False) -> list[WorkerStats]:
        """Ask every in-process worker to stop; their stats once each has (in-flight handlers finish
        within their grace). `at_once`: cancel them instead, wherever they are (a claim or a handler
        paused for good included); a cancelled worker has no stats."""
        if at_once:
            await cancel_and_wait(self._tasks)
        for worker in () if at_once else self._workers:
            worker.request_stop()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for charges in self._charge_clients:
            await charges.aclose()
        self._tasks.clear()
        self._workers.clear()
        self._charge_clients.clear()
        return [r for r in results if isinstance(r, WorkerStats)]

    # -- workers as real processes -------------------------------------------------------------

    def spawn_worker(self, worker_id: str, lease_seconds: float, *extra: str) -> processes.CliProcess:
        """A real `reliableq worker` process over this system, with its switches (`extra`: more CLI
        arguments). Killed on exit if still running; stop it with `stop_worker_processes`."""
        log_path = self.logs / f"{worker_id}.log" if self.logs else None
        worker = processes.spawn_worker(self.databases, self.charge_url, worker_id, lease_seconds,
                                        *off_args(self.mechanisms), *extra, log_path=log_path)
        self.worker_processes.append(worker)
        return worker

    async def stop_worker_processes(self) -> list[dict[str, Any]]:
        """SIGTERM every running worker process; the stats each wrote to its status file as it stopped."""
        running = [w for w in self.worker_processes if w.process.poll() is None]
        await asyncio.gather(*(processes.stop(w) for w in running))
        return [status["stats"] for w in running if (status := w.status()) and status["state"] == "stopped"]

    # -- waiting and reading -------------------------------------------------------------------

    async def wait_until(self, condition: Callable[[], Awaitable[bool]], timeout: float,
                         what: str = "condition", poll_seconds: float = 0.02) -> None:
        """Poll `condition` until true; TimeoutError naming `what` after `timeout` seconds."""
        await wait_until(condition, timeout, what, poll_seconds)

    async def wait_for_status(self, job_id: uuid.UUID, statuses: set[str], timeout: float = 30.0) -> Job:
        async def reached() -> bool:
            job = await self.queue.get(job_id)
            return job is not None and job.status in statuses
        await self._wait_on_jobs(reached, timeout, f"job {job_id} to become {'/'.join(sorted(statuses))}")
        return await self.queue.get(job_id)

    async def wait_settled(self, job_ids: Sequence[uuid.UUID] | None = None, timeout: float = 60.0, *,
                           give_up: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Until every job (or every one of `job_ids`) is SUCCEEDED or DEAD: True. Raises RuntimeError at once
        if nobody is left to settle them (every worker process exited, no in-process worker runs). Returns
        False, unsettled, as soon as `give_up` says that waiting longer cannot settle them."""
        gave_up = False

        async def settled() -> bool:
            nonlocal gave_up
            if job_ids is None:
                counts = await self.queue.counts()
                done = counts["PENDING"] == 0 and counts["RUNNING"] == 0
            else:
                jobs = [await self.queue.get(job_id) for job_id in job_ids]
                done = all(job is not None and job.status in SETTLED_STATUSES for job in jobs)
            if not done and self._everyone_stopped():
                said = "; ".join(f"{w.name} exited {w.process.returncode}: {w.last_line() or 'nothing printed'}"
                                 for w in self.worker_processes)
                raise RuntimeError(f"every worker stopped before the run settled: {await self.queue.counts()} "
                                   f"({said})")
            gave_up = not done and give_up is not None and await give_up()
            return done or gave_up
        what = "every job" if job_ids is None else f"{len(job_ids)} job(s)"
        await self._wait_on_jobs(settled, timeout, f"{what} to be SUCCEEDED or DEAD")
        return not gave_up

    async def only_jobs_past_their_budget_unsettled(self) -> bool:
        """Whether jobs are unsettled and every one has already been claimed more times than its attempt
        budget allows: such a job (dead-lettering off retries it forever) can never settle as it should.
        False once every job settled (in the moment since the caller looked)."""
        async with self.queue.pool.connection() as conn:
            unsettled, within_budget = await (await conn.execute(_LAB_Q["lab_unsettled_within_budget"])).fetchone()
        return unsettled > 0 and within_budget == 0

    async def _wait_on_jobs(self, condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
        """wait_until, and on a timeout what there is to read about why: the unsettled jobs, what the
        database's sessions are doing, and what each worker process last said."""
        try:
            await self.wait_until(condition, timeout, what)
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{await self.stuck_report()}") from None

    async def stuck_report(self) -> str:
        lines = []
        async with self.queue.pool.connection() as conn:
            for query in ("lab_stuck_jobs", "lab_busy_sessions"):
                cur = await conn.cursor(row_factory=dict_row).execute(_LAB_Q[query])
                lines += [f"{query.removeprefix('lab_').replace('_', ' ')}: {row}" for row in await cur.fetchall()]
        for worker in self.worker_processes:
            state = "running" if worker.process.poll() is None else f"exited {worker.process.returncode}"
            lines.append(f"{worker.name} (pid {worker.pid}, {state}) last said: {worker.last_line() or '-'}")
        return "\n".join(lines)

    def _everyone_stopped(self) -> bool:
        """Whether every worker process of this system exited and no in-process worker runs, so nothing
        can settle a job. Never while it has spawned no process: in-process workers come and go (the
        chaos supervisor restarts crashed ones), and a test may run its own."""
        return (bool(self.worker_processes) and all(w.process.poll() is not None for w in self.worker_processes)
                and all(task.done() for task in self._tasks))

    async def counts(self) -> list[JobCounts]:
        return await job_counts(self.databases)

    async def charge_stats(self) -> dict[str, Any]:
        """The charge service's own counters (in-flight peak, requests, its process's CPU seconds)."""
        return (await self.http.get(f"{self.charge_url}/v1/stats")).json()


@asynccontextmanager
async def local_system(mechanisms: Mechanisms = Mechanisms(), charge_faults: ChargeFaults | None = None,
                       api_faults: FaultPlan | None = None, databases: db.Databases | None = None,
                       database_prefix: str = "rq_lab", worker_pool_size: int = 20,
                       servers: Literal["threads", "processes"] = "threads", charge_args: Sequence[str] = (),
                       api: bool = True, charge: bool = True, logs: Path | None = None,
                       pieces: Pieces = SHIPPED) -> AsyncIterator[LocalSystem]:
    """Start a LocalSystem; on exit stop its workers and servers and drop its scratch databases.

    `databases`: use these (migrated here) instead of fresh scratch ones. `servers`: run the API and the
    charge service in this process ("threads", with live `charge_faults` and `api_faults`) or as
    `reliableq` processes ("processes", the charge service given `charge_args`). `api`, `charge`: start
    that server at all. `worker_pool_size`: connections the in-process workers share (0: none). `logs`: a
    folder for the processes' output. `pieces`: what its in-process workers and in-process charge service
    run in place of the shipped queries and retry policy, and its in-process API in place of the shipped
    submission order and session setting (processes run the shipped ones)."""
    in_threads = servers == "threads"
    if not in_threads and (charge_faults is not None or api_faults is not None):
        raise ValueError("server processes take their faults as charge_args, not live fault objects")
    if in_threads and charge_args:
        raise ValueError("an in-process charge service takes its faults as charge_faults, not charge_args")
    api_faults = api_faults or FaultPlan()
    if in_threads:
        charge_faults = charge_faults or ChargeFaults()
    async with AsyncExitStack() as stack:
        if databases is None:
            databases = stack.enter_context(scratch.scratch_databases(database_prefix))
        else:
            await to_thread_to_its_end(db.migrate, databases)
        started: list[processes.CliProcess] = []
        stack.callback(_kill_all, started)
        charge_url = api_url = ""
        if in_threads:
            if charge:
                # As for the workers' pool below: a learner's SQL is cancelled rather than left hanging.
                limit = LEARNER_STATEMENT_SECONDS if pieces.charge_queries else None
                app = create_charge_app(databases.charge_url, charge_faults, pieces.charge_queries, limit)
                charge_url = await _serve_in_thread(stack, app)
            if api:
                api_url = await _serve_in_thread(stack, create_api_app(databases.queue_url, mechanisms, api_faults,
                                                                        kinds=STANDARD_KINDS,
                                                                        order=pieces.submission_order,
                                                                        standby_session=pieces.standby_session))
        else:
            # One after the other: a server that fails to start is killed by spawn_server, and every
            # one started before it is in `started` for the exit to kill.
            if charge:
                server, charge_url = await processes.spawn_server(
                    databases, "charge-service", *charge_args, log_path=logs / "charge.log" if logs else None)
                started.append(server)
            if api:
                server, api_url = await processes.spawn_server(
                    databases, "api", *off_args(mechanisms), log_path=logs / "api.log" if logs else None)
                started.append(server)
        own_pool = await db.open_pool_checked(databases.queue_url, max_size=4)
        stack.push_async_callback(own_pool.close)
        worker_pool = None
        if worker_pool_size:
            # A learner's SQL that waits for a lock or never ends is cancelled with PostgreSQL's own message.
            limit = LEARNER_STATEMENT_SECONDS if pieces.queue_queries else None
            # Its workers wait for a connection as `reliableq worker` does, not psycopg_pool's 30 s: a claim
            # waiting when an outage ends gives way soon to a new one, served by a fresh connection.
            worker_pool = await db.open_pool_checked(databases.queue_url, max_size=worker_pool_size,
                                                     statement_seconds=limit,
                                                     db_timeout_seconds=WorkerSettings().db_wait_seconds)
            stack.push_async_callback(worker_pool.close)
        http = httpx.AsyncClient(timeout=10)
        stack.push_async_callback(http.aclose)
        system = LocalSystem(databases, mechanisms, api_url, charge_url, charge_faults, api_faults,
                             Queue(own_pool, mechanisms), http, worker_pool, logs, pieces)
        stack.callback(_kill_all, system.worker_processes)
        try:
            yield system
        except BaseException:
            # A run that ends early (Stop, an error) is not waited for: a handler paused for good would hold
            # the teardown for its worker's whole grace (stage 05's worker-1 has 60 s).
            await system.stop_workers(at_once=True)
            raise
        await system.stop_workers()


async def _serve_in_thread(stack: AsyncExitStack, app) -> str:
    server = LoopbackServer(app)
    stack.callback(server.stop)
    return await to_thread_to_its_end(server.start)


def off_args(mechanisms: Mechanisms) -> list[str]:
    """The CLI's spelling of these switches, for a process started over this system."""
    return ["--off", ",".join(mechanisms.off())] if mechanisms.off() else []


def _kill_all(started: list[processes.CliProcess]) -> None:
    for process in started:
        process.kill()


def fast_settings(**overrides: Any) -> WorkerSettings:
    """Worker settings for experiments: short lease, quick polls, short grace, seeded jitter."""
    base = WorkerSettings(concurrency=4, lease_seconds=1.0, poll_seconds=0.02, backoff_base_seconds=0.05,
                          backoff_max_seconds=0.5, backoff_seed=7, shutdown_grace_seconds=2.0)
    return replace(base, **overrides)
