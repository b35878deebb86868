"""Each queue's adapter for the benchmark's peer runs: pgqueuer and procrastinate through their own APIs,
and ours (`reliableq`, `reliableq-poll-only`) run as they are for pickup, with what the adapters share.

A runner installs its queue's schema into an empty database, enqueues from C concurrent clients (one job
per call or in batches), preloads jobs and drains them with one worker of concurrency C, or times pickup
one job at a time; its no-op handler counts how often each job ran. Whether that count and the queue's
own tables agree, and the timing, are `reliableq.bench.peers.run`'s; a runner only does the work.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from reliableq import db

PICKUP = "pickup"  # our pickup scenario's runs, ours among them (the one mode ReliableqRunner runs)
TASK = "noop"  # the entrypoint / task name every run enqueues
# Between two pickups the worker goes idle for a pause drawn from this range (seeded), out of step with
# any poll interval, as jobs arrive at a quiet system.
PICKUP_IDLE_SECONDS = (0.01, 0.05)
PICKUP_WAIT_SECONDS = 10.0  # a handler not started by then: the run fails


# -- what both peers share --------------------------------------------------------------------------

async def _from_clients(enqueuers: Sequence[Callable[[int], Awaitable[list[int]]]], jobs: int,
                        batch: int) -> tuple[list[int], float]:
    """Each client enqueues `batch` jobs per call (the last call the rest) until `jobs` are enqueued, taking
    the next slice of job numbers from a shared iterator as ours do (`reliableq.bench.ingest`); the ids,
    and the seconds it took."""
    starts = iter(range(0, jobs, batch))
    ids: list[int] = []

    async def client(enqueue: Callable[[int], Awaitable[list[int]]]) -> None:
        for first in starts:
            ids.extend(await enqueue(min(batch, jobs - first)))
    start = time.monotonic()
    await asyncio.gather(*(client(enqueue) for enqueue in enqueuers))
    return ids, time.monotonic() - start


async def _one_at_a_time(enqueue: Callable[[], Awaitable[object]], started: asyncio.Queue[float], jobs: int,
                         seed: int) -> list[float]:
    """Seconds from each enqueue call to its handler's start (`started` gets the handler's perf_counter),
    one job at a time after an idle pause; a first job, not timed, makes sure the worker is up."""
    rng = random.Random(seed)
    await enqueue()
    await asyncio.wait_for(started.get(), PICKUP_WAIT_SECONDS * 3)  # a worker's start-up included
    latencies = []
    for _ in range(jobs):
        await asyncio.sleep(rng.uniform(*PICKUP_IDLE_SECONDS))  # the load's pacing: the worker goes idle
        sent = time.perf_counter()
        await enqueue()
        latencies.append(await asyncio.wait_for(started.get(), PICKUP_WAIT_SECONDS) - sent)
    return latencies


async def connect(dsn: str) -> psycopg.AsyncConnection:
    """A connection of its own in autocommit: a runner's, or a run's check of the queue's tables."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_SECONDS)


# -- the peers --------------------------------------------------------------------------------------

class _PeerRunner:
    """What every runner keeps: where the peer's database is, and how often the handler ran each job."""

    package = ""  # what must be importable to run it

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.handled: Counter[int] = Counter()
        self.started: asyncio.Queue[float] = asyncio.Queue()  # each handler's start, for pickup

    def ran(self, job_id: Any) -> None:
        """What every runner's no-op handler does first."""
        self.started.put_nowait(time.perf_counter())
        self.handled[job_id] += 1

    @staticmethod
    def unsupported(mode: str, concurrency: int) -> str | None:
        """Why this peer cannot run `mode` at `concurrency`, or None when it can."""
        return None


class PgQueuerRunner(_PeerRunner):
    """pgqueuer over its psycopg 3 driver, which wraps one connection: so one per client, and one for the
    worker, as pgqueuer's own benchmark does. That driver shares the worker's connection between queries
    and its NOTIFY watcher, which holds it for up to a second while no notification comes: a drain here
    logged its first completions about 1 s after its first pick (over asyncpg, pgqueuer's other driver,
    0.05 s), so at a few thousand jobs the figure is partly that second."""

    peer = package = "pgqueuer"

    @staticmethod
    def unsupported(mode: str, concurrency: int) -> str | None:
        # A worker is capped by max_concurrent_tasks, which pgqueuer requires to be at least twice its batch
        # size: one job at a time is not expressible. The entrypoint's concurrency_limit=1 is, but a drain with
        # it ran a batch about every 2.5 s here, which measures its polling rather than its throughput.
        if mode == "execute" and concurrency < 2:
            return "pgqueuer cannot cap a worker at one job (max_concurrent_tasks must be >= 2 x batch_size)"
        return None

    async def install(self) -> None:
        from pgqueuer import Queries
        async with await connect(self.dsn) as conn:
            await Queries.from_psycopg_connection(conn).install()

    async def ingest(self, jobs: int, clients: int, batch: int) -> tuple[list[int], float]:
        from pgqueuer import Queries
        connections = [await connect(self.dsn) for _ in range(clients)]
        try:
            def enqueuer(queries: Queries) -> Callable[[int], Awaitable[list[int]]]:
                async def enqueue(n: int) -> list[int]:
                    if batch == 1:  # its one-job call, as a user enqueues one job
                        return await queries.enqueue(TASK, None)
                    return await queries.enqueue([TASK] * n, [None] * n, [0] * n)  # one statement for the list
                return enqueue
            return await _from_clients([enqueuer(Queries.from_psycopg_connection(c)) for c in connections], jobs,
                                       batch)
        finally:
            for conn in connections:
                await conn.close()

    async def preload(self, jobs: int) -> list[int]:
        from pgqueuer import Queries
        async with await connect(self.dsn) as conn:
            return await Queries.from_psycopg_connection(conn).enqueue([TASK] * jobs, [None] * jobs, [0] * jobs)

    async def execute(self, concurrency: int) -> None:
        from pgqueuer import Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode
        async with await connect(self.dsn) as conn:
            manager = QueueManager(Queries.from_psycopg_connection(conn))

            @manager.entrypoint(TASK)
            async def noop(job) -> None:
                self.ran(job.id)
            # The largest batch its rule allows (see `unsupported`); drain mode returns once the queue is empty.
            await manager.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency,
                              mode=QueueExecutionMode.drain)

    async def pickup(self, jobs: int, seed: int) -> list[float]:
        from pgqueuer import Queries, QueueManager
        async with await connect(self.dsn) as worker_conn, await connect(self.dsn) as client_conn:
            manager = QueueManager(Queries.from_psycopg_connection(worker_conn))

            @manager.entrypoint(TASK)
            async def noop(job) -> None:
                self.ran(job.id)
            worker = asyncio.create_task(manager.run())  # its defaults: LISTEN/NOTIFY, continuous
            client = Queries.from_psycopg_connection(client_conn)
            try:
                return await _one_at_a_time(lambda: client.enqueue(TASK, None), self.started, jobs, seed)
            finally:
                manager.shutdown.set()
                await asyncio.wait({worker}, timeout=PICKUP_WAIT_SECONDS)


class ProcrastinateRunner(_PeerRunner):
    """procrastinate over its PsycopgConnector (a psycopg 3 pool), sized as ours: a connection per ingest
    client, and our worker's pool size for a worker of concurrency C."""

    peer = package = "procrastinate"

    def _app(self, pool_min: int, pool_max: int):
        import procrastinate
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=self.dsn, min_size=pool_min, max_size=pool_max))

        @app.task(name=TASK, pass_context=True)
        async def noop(context) -> None:
            self.ran(context.job.id)
        return app, noop

    async def install(self) -> None:
        app, _ = self._app(1, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def ingest(self, jobs: int, clients: int, batch: int) -> tuple[list[int], float]:
        app, noop = self._app(clients, clients)  # opened with every connection, as ours

        async def enqueue(n: int) -> list[int]:
            if batch == 1:
                return [await noop.defer_async()]
            return await noop.batch_defer_async(*({} for _ in range(n)))
        async with app.open_async():
            return await _from_clients([enqueue] * clients, jobs, batch)

    async def preload(self, jobs: int) -> list[int]:
        app, noop = self._app(1, 1)
        async with app.open_async():
            return await noop.batch_defer_async(*({} for _ in range(jobs)))

    async def execute(self, concurrency: int) -> None:
        app, _ = self._app(1, min(concurrency, 32) + 2)  # reliableq.worker sizes its pool so
        async with app.open_async():
            # wait=False: the worker stops once it finds no job left, after its running jobs finish.
            await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)

    async def pickup(self, jobs: int, seed: int) -> list[float]:
        app, noop = self._app(1, 4)
        async with app.open_async():
            # Its defaults: LISTEN/NOTIFY, polling as the fallback; one job at a time.
            worker = asyncio.create_task(app.run_worker_async(concurrency=1, install_signal_handlers=False))
            try:
                return await _one_at_a_time(noop.defer_async, self.started, jobs, seed)
            finally:
                worker.cancel()
                await asyncio.wait({worker}, timeout=PICKUP_WAIT_SECONDS)


class ReliableqRunner(_PeerRunner):
    """Ours, run as the peers are for pickup: a Worker in this process over a pool of the database, jobs
    submitted through Queue.submit (one statement and commit each, as the API's lone submission)."""

    peer = package = "reliableq"
    wake_on_submit = True

    @staticmethod
    def unsupported(mode: str, concurrency: int) -> str | None:
        return None if mode == PICKUP else "ours runs ingest and execute as the bench's own scenarios"

    async def install(self) -> None:
        await asyncio.to_thread(db.apply_schema, self.dsn, "queue")

    async def pickup(self, jobs: int, seed: int) -> list[float]:
        from reliableq.config import WorkerSettings
        from reliableq.handlers import HandlerRegistry, Outcome
        from reliableq.payload import Submission
        from reliableq.queue import Queue
        from reliableq.worker import Worker

        async def noop(job) -> Outcome:
            self.ran(job.id)
            return Outcome("ok", "no-op")
        handlers = HandlerRegistry()
        handlers.register(TASK, noop)
        pool = await db.open_pool_checked(self.dsn, max_size=4)
        queue = Queue(pool)
        worker = Worker(queue, handlers, WorkerSettings(wake_on_submit=self.wake_on_submit, backoff_seed=seed))
        running = asyncio.create_task(worker.run())
        try:
            return await _one_at_a_time(lambda: queue.submit(Submission({}, kind=TASK)), self.started, jobs, seed)
        finally:
            worker.request_stop()
            await asyncio.wait({running}, timeout=PICKUP_WAIT_SECONDS)
            await pool.close()


class ReliableqPollOnlyRunner(ReliableqRunner):
    """Ours without wake-on-submit: a job waits for the worker's next poll (0.2 s by default)."""

    peer = "reliableq-poll-only"
    wake_on_submit = False


RUNNERS = {runner.peer: runner for runner in (PgQueuerRunner, ProcrastinateRunner, ReliableqRunner,
                                                ReliableqPollOnlyRunner)}

