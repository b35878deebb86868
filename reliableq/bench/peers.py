"""The benchmark's peers: pgqueuer and procrastinate doing our benchmark's work through their own APIs.

`reliableq bench` sets each figure of ours beside two other PostgreSQL job queues for Python, on the
same server: `ingest` enqueues N no-op jobs from C concurrent clients, one job per call (as ours submit
one), and `ingest-batch` the same in batches of our batch points' size (pgqueuer's `Queries.enqueue`
with lists, procrastinate's `batch_defer_async`, as our batch insert); `execute` drains N preloaded
no-op jobs with one worker of concurrency C; `pickup` runs a worker and enqueues N no-op jobs one at a
time, each after the last one's handler started and an idle pause, and times each from its enqueue call
to its handler's start (in one process, on one clock). Pickup runs ours too, the same way (`reliableq`,
and `reliableq-poll-only` without wake-on-submit): in-process beside in-process. Each run is its own
process,

    python -m reliableq.bench.peers QUEUE ingest|ingest-batch|execute|pickup --jobs N --concurrency C --dsn URL

printing one JSON line (a `PeerRun`), so its CPU is its own as our worker's is and a peer that crashes
cannot take the bench down. `measure` gives every run a fresh, empty database of the server, into which
the peer installs its own schema with its own API; both use psycopg 3.

A run has a figure only if the peer's own tables agree: after `ingest` or `ingest-batch` every job is
stored once and waiting; after `execute` every job ran exactly once and completed exactly once.
Otherwise it has a note and no figure. Execution is timed on the server's clock, from just before the
worker starts to the last completion the peer recorded: a worker's slow shutdown is not counted (ours is
timed to its last finalize too), its start-up is (ours is running before its jobs arrive; a peer's
worker would exit on an empty queue). What this module does not do: tune a peer beyond its concurrency
settings.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from reliableq import db, scratch, sql
from reliableq.bench.profiles import BATCH_JOBS

PEERS = ("pgqueuer", "procrastinate")
# The peers' baselines beside our ingest (one per call, batches) and no-op execution, by their report name.
_TOOLS = {"ingest": "enqueue", "ingest-batch": "enqueue-batch", "execute": "execute"}
MODES = tuple(_TOOLS)
PICKUP = "pickup"  # our pickup scenario's runs, ours among them
PICKUP_QUEUES = ("reliableq", "reliableq-poll-only", *PEERS)
TASK = "noop"  # the entrypoint / task name every run enqueues
# Between two pickups the worker goes idle for a pause drawn from this range (seeded), out of step with
# any poll interval, as jobs arrive at a quiet system.
PICKUP_IDLE_SECONDS = (0.01, 0.05)
PICKUP_WAIT_SECONDS = 10.0  # a handler not started by then: the run fails
# A pickup run's time allowed per job beyond the settle time: pgqueuer over psycopg takes about a second
# per job (see PgQueuerRunner), so a run of 200 takes minutes however idle the machine.
PICKUP_SECONDS_PER_JOB = 2.0
_Q = sql.queries("peers")


@dataclass(frozen=True)
class PeerRun:
    """One run of one peer: its rate when its exactly-once check held, else a note saying why not."""

    peer: str
    mode: str  # ingest | ingest-batch | execute | pickup
    jobs: int
    concurrency: int
    exactly_once: bool = False  # ingest(-batch): every job stored once and waiting; execute: ran, completed once
    per_second: float | None = None  # only when exactly_once held
    seconds: float | None = None
    pickup_p50_ms: float | None = None  # pickup: from the enqueue call to the handler's start
    pickup_p99_ms: float | None = None
    version: str = ""
    note: str = ""

    @property
    def tool(self) -> str:
        return tool(self.peer, self.mode)


def tool(peer: str, mode: str) -> str:
    """The baseline's name in the bench's report: `pgqueuer-enqueue`, `procrastinate-enqueue-batch`, ..."""
    return f"{peer}-{_TOOLS[mode]}"


def installed(peer: str) -> bool:
    return importlib.util.find_spec(RUNNERS[peer].package) is not None


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


async def _connect(dsn: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_SECONDS)


async def _read(dsn: str, query: str, params: dict | None = None) -> dict:
    async with await _connect(dsn) as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q[query], params)
        return await cur.fetchone()


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
        async with await _connect(self.dsn) as conn:
            await Queries.from_psycopg_connection(conn).install()

    async def ingest(self, jobs: int, clients: int, batch: int) -> tuple[list[int], float]:
        from pgqueuer import Queries
        connections = [await _connect(self.dsn) for _ in range(clients)]
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
        async with await _connect(self.dsn) as conn:
            return await Queries.from_psycopg_connection(conn).enqueue([TASK] * jobs, [None] * jobs, [0] * jobs)

    async def execute(self, concurrency: int) -> None:
        from pgqueuer import Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode
        async with await _connect(self.dsn) as conn:
            manager = QueueManager(Queries.from_psycopg_connection(conn))

            @manager.entrypoint(TASK)
            async def noop(job) -> None:
                self.ran(job.id)
            # The largest batch its rule allows (see `unsupported`); drain mode returns once the queue is empty.
            await manager.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency,
                              mode=QueueExecutionMode.drain)

    async def pickup(self, jobs: int, seed: int) -> list[float]:
        from pgqueuer import Queries, QueueManager
        async with await _connect(self.dsn) as worker_conn, await _connect(self.dsn) as client_conn:
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


async def run(peer: str, mode: str, jobs: int, concurrency: int, dsn: str, seed: int = 0) -> PeerRun:
    """One run in this process, on the empty database `dsn`: install, enqueue or drain, check, time."""
    runner = RUNNERS[peer](dsn)
    done = PeerRun(peer, mode, jobs, concurrency, version=importlib.metadata.version(runner.package))
    async with await _connect(dsn):
        pass  # fail fast with the server's own reason: a peer's pool would retry for half a minute first
    await runner.install()
    if mode == PICKUP:
        latencies = sorted(await runner.pickup(jobs, seed))
        runs = runner.handled.total()
        if runs != jobs + 1 or any(count != 1 for count in runner.handled.values()):
            return replace(done, note=f"check failed: {runs} handler runs for {jobs + 1} jobs")
        centiles = statistics.quantiles(latencies, n=100, method="inclusive")
        return replace(done, exactly_once=True, seconds=sum(latencies),
                       pickup_p50_ms=1000 * statistics.median(latencies), pickup_p99_ms=1000 * centiles[98])
    if mode in ("ingest", "ingest-batch"):
        ids, seconds = await runner.ingest(jobs, concurrency, BATCH_JOBS if mode == "ingest-batch" else 1)
        outcome = await _read(dsn, f"{peer}_outcome", {"ids": ids})
        if len(set(ids)) != jobs or outcome["waiting"] != jobs:
            return replace(done, note=f"check failed: {len(set(ids))} distinct ids for {jobs} jobs, "
                                      f"{outcome['waiting']} stored and waiting")
    else:
        ids = await runner.preload(jobs)
        started = (await _read(dsn, "server_clock_now"))["now"]
        await runner.execute(concurrency)
        outcome = await _read(dsn, f"{peer}_outcome", {"ids": ids})
        ran_once = sum(runner.handled[job_id] == 1 for job_id in set(ids))
        runs = runner.handled.total()
        if len(set(ids)) != jobs or ran_once != jobs or runs != jobs or outcome["completed_once"] != jobs:
            return replace(done, note=f"check failed: of {jobs} jobs {ran_once} ran exactly once ({runs} runs), "
                                      f"{outcome['completed_once']} completed exactly once, "
                                      f"{outcome['waiting']} still waiting")
        seconds = (outcome["last_completed_at"] - started).total_seconds()
    return replace(done, exactly_once=True, seconds=seconds, per_second=jobs / seconds)


# -- the bench's side: a fresh database and a process per run ---------------------------------------

async def measure(peer: str, mode: str, jobs: int, concurrency: int, timeout: float, seed: int = 0) -> PeerRun:
    """Run `peer` in its own process on a fresh, empty database of our server, dropped afterwards. A crash,
    a refusal or a timeout comes back as a note, never as an exception."""
    failed = PeerRun(peer, mode, jobs, concurrency)
    reason = RUNNERS[peer].unsupported(mode, concurrency)
    if reason:
        return replace(failed, note=f"not run: {reason}")
    admin_url = await asyncio.to_thread(db.server_url)
    name = await asyncio.to_thread(scratch.owned_name, admin_url, "rq_peer")
    url = await asyncio.to_thread(db.create_database, admin_url, name)
    try:
        # The password, if any, travels in the environment: a command line is visible to every local user.
        parts = conninfo_to_dict(url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUER_")}  # its default table names
        if parts.get("password"):
            env["PGPASSWORD"] = str(parts.pop("password"))
        command = [sys.executable, "-m", "reliableq.bench.peers", peer, mode, "--jobs", str(jobs),
                   "--concurrency", str(concurrency), "--seed", str(seed), "--dsn", make_conninfo(**parts)]
        process = await asyncio.create_subprocess_exec(*command, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return replace(failed, note=f"did not finish within {timeout:g} s")
    finally:
        await asyncio.to_thread(db.drop_database, admin_url, name)
    lines = out.decode(errors="replace").strip().splitlines()
    if process.returncode != 0 or not lines:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return replace(failed, note=f"exited with {process.returncode}: {last[-300:]}")
    try:
        return PeerRun(**json.loads(lines[-1]))
    except (ValueError, TypeError):
        return replace(failed, note=f"unreadable report: {lines[-1][:300]}")


# -- the command line -------------------------------------------------------------------------------

def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _conninfo(text: str) -> str:
    try:
        parts = conninfo_to_dict(text)
    except psycopg.ProgrammingError:
        raise argparse.ArgumentTypeError("not a PostgreSQL URL or connection string") from None
    if not parts.get("dbname"):
        # Never libpq's default database: the peer installs its schema into this one.
        raise argparse.ArgumentTypeError("name the database to use (it gets the peer's schema)")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliableq.bench.peers",
        description="Run one peer's ingest, ingest-batch, execute or pickup on an empty database and print "
                    "one JSON line. "
                    "The database gets the peer's schema: use a scratch one.")
    parser.add_argument("peer", choices=PICKUP_QUEUES)
    parser.add_argument("mode", choices=(*MODES, PICKUP),
                        help=f"ingest: enqueue one job per call; ingest-batch: {BATCH_JOBS} per call; "
                             "execute: drain preloaded jobs; "
                             "pickup: one job at a time, each timed to its handler's start")
    parser.add_argument("--jobs", type=_positive, required=True, help="jobs to enqueue or drain")
    parser.add_argument("--concurrency", type=_positive, required=True,
                        help="ingest(-batch): concurrent clients; execute: the worker's concurrency")
    parser.add_argument("--dsn", type=_conninfo, required=True, help="an empty database of the server to measure")
    parser.add_argument("--seed", type=int, default=0, help="seed of pickup's idle pauses")
    parser.add_argument("--debug", action="store_true", help="show a failure's traceback")
    args = parser.parse_args(argv)
    if not installed(args.peer):
        parser.error(f"{args.peer} is not installed (pip install 'reliableq[peers]')")
    reason = RUNNERS[args.peer].unsupported(args.mode, args.concurrency)
    if reason:
        parser.error(reason)
    try:
        result = asyncio.run(run(args.peer, args.mode, args.jobs, args.concurrency, args.dsn, args.seed))
    except Exception as error:
        if args.debug:
            raise
        print(f"{args.peer} {args.mode} failed: {type(error).__name__}: {' '.join(str(error).split())}",
              file=sys.stderr)
        return 1
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy: procrastinate warns about an App made in
    # __main__ (its task names would not match another process's).
    from reliableq.bench.peers import main as importable_main
    sys.exit(importable_main())
