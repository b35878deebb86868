"""The benchmark's peers: pgqueuer and procrastinate doing our benchmark's work through their own APIs.

`reliableq bench` sets each figure of ours beside two other PostgreSQL job queues for Python, on the same
server: `ingest` enqueues N no-op jobs from C concurrent clients, one job per call (as ours submit one);
`execute` drains N preloaded no-op jobs with one worker of concurrency C. Each run is its own process,

    python -m reliableq.bench.peers PEER ingest|execute --jobs N --concurrency C --dsn URL

printing one JSON line (a `PeerRun`), so its CPU is its own as our worker's is and a peer that crashes
cannot take the bench down. `measure` gives every run a fresh, empty database of the server, into which
the peer installs its own schema with its own API; both use psycopg 3.

A run has a figure only if the peer's own tables agree: after `ingest` every job is stored and waiting;
after `execute` every job ran exactly once and completed exactly once. Otherwise it has a note and no
figure. Execution is timed on the server's clock, from just before the worker starts to the last
completion the peer recorded: a worker's slow shutdown is not counted (ours is timed to its last
finalize too), its start-up is (ours is running before its jobs arrive; a peer's worker would exit on
an empty queue). What this module does not do: tune a peer beyond its concurrency settings.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from reliableq import db, sql

PEERS = ("pgqueuer", "procrastinate")
MODES = ("ingest", "execute")
TASK = "noop"  # the entrypoint / task name every run enqueues
_Q = sql.queries("peers")


@dataclass(frozen=True)
class PeerRun:
    """One run of one peer: its rate when its exactly-once check held, else a note saying why not."""

    peer: str
    mode: str  # ingest | execute
    jobs: int
    concurrency: int
    exactly_once: bool = False  # ingest: every job stored once and waiting; execute: ran and completed once
    per_second: float | None = None  # only when exactly_once held
    seconds: float | None = None
    version: str = ""
    note: str = ""

    @property
    def tool(self) -> str:
        return tool(self.peer, self.mode)


def tool(peer: str, mode: str) -> str:
    """The baseline's name in the bench's report: `pgqueuer-enqueue`, `procrastinate-execute`, ..."""
    return f"{peer}-{'enqueue' if mode == 'ingest' else 'execute'}"


def installed(peer: str) -> bool:
    return importlib.util.find_spec(peer) is not None


# -- what both peers share --------------------------------------------------------------------------

async def _from_clients(enqueuers: Sequence[Callable[[], Awaitable[int]]], jobs: int) -> tuple[list[int], float]:
    """Each client enqueues one job per call until `jobs` are enqueued, taking the next job number from a
    shared iterator as ours do (`reliableq.bench.ingest`); the ids, and the seconds it took."""
    remaining = iter(range(jobs))
    ids: list[int] = []

    async def client(enqueue: Callable[[], Awaitable[int]]) -> None:
        for _ in remaining:
            ids.append(await enqueue())
    start = time.monotonic()
    await asyncio.gather(*(client(enqueue) for enqueue in enqueuers))
    return ids, time.monotonic() - start


async def _connect(dsn: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_SECONDS)


async def _read(dsn: str, query: str, params: dict | None = None) -> dict:
    async with await _connect(dsn) as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q[query], params)
        return await cur.fetchone()


# -- the peers --------------------------------------------------------------------------------------

class _PeerRunner:
    """What every runner keeps: where the peer's database is, and how often the handler ran each job."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.handled: Counter[int] = Counter()

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

    peer = "pgqueuer"

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

    async def ingest(self, jobs: int, clients: int) -> tuple[list[int], float]:
        from pgqueuer import Queries
        connections = [await _connect(self.dsn) for _ in range(clients)]
        try:
            def enqueuer(queries: Queries) -> Callable[[], Awaitable[int]]:
                async def enqueue() -> int:
                    (job_id,) = await queries.enqueue(TASK, None)
                    return job_id
                return enqueue
            return await _from_clients([enqueuer(Queries.from_psycopg_connection(c)) for c in connections], jobs)
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
                self.handled[job.id] += 1
            # The largest batch its rule allows (see `unsupported`); drain mode returns once the queue is empty.
            await manager.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency,
                              mode=QueueExecutionMode.drain)


class ProcrastinateRunner(_PeerRunner):
    """procrastinate over its PsycopgConnector (a psycopg 3 pool), sized as ours: a connection per ingest
    client, and our worker's pool size for a worker of concurrency C."""

    peer = "procrastinate"

    def _app(self, pool_min: int, pool_max: int):
        import procrastinate
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=self.dsn, min_size=pool_min, max_size=pool_max))

        @app.task(name=TASK, pass_context=True)
        async def noop(context) -> None:
            self.handled[context.job.id] += 1
        return app, noop

    async def install(self) -> None:
        app, _ = self._app(1, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def ingest(self, jobs: int, clients: int) -> tuple[list[int], float]:
        app, noop = self._app(clients, clients)  # opened with every connection, as ours
        async with app.open_async():
            return await _from_clients([noop.defer_async] * clients, jobs)

    async def preload(self, jobs: int) -> list[int]:
        app, noop = self._app(1, 1)
        async with app.open_async():
            return await noop.batch_defer_async(*({} for _ in range(jobs)))

    async def execute(self, concurrency: int) -> None:
        app, _ = self._app(1, min(concurrency, 32) + 2)  # reliableq.worker sizes its pool so
        async with app.open_async():
            # wait=False: the worker stops once it finds no job left, after its running jobs finish.
            await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)


RUNNERS = {"pgqueuer": PgQueuerRunner, "procrastinate": ProcrastinateRunner}


async def run(peer: str, mode: str, jobs: int, concurrency: int, dsn: str) -> PeerRun:
    """One run in this process, on the empty database `dsn`: install, enqueue or drain, check, time."""
    runner = RUNNERS[peer](dsn)
    done = PeerRun(peer, mode, jobs, concurrency, version=importlib.metadata.version(peer))
    async with await _connect(dsn):
        pass  # fail fast with the server's own reason: a peer's pool would retry for half a minute first
    await runner.install()
    if mode == "ingest":
        ids, seconds = await runner.ingest(jobs, concurrency)
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

async def measure(peer: str, mode: str, jobs: int, concurrency: int, timeout: float) -> PeerRun:
    """Run `peer` in its own process on a fresh, empty database of our server, dropped afterwards. A crash,
    a refusal or a timeout comes back as a note, never as an exception."""
    failed = PeerRun(peer, mode, jobs, concurrency)
    reason = RUNNERS[peer].unsupported(mode, concurrency)
    if reason:
        return replace(failed, note=f"not run: {reason}")
    admin_url = await asyncio.to_thread(db.server_url)
    name = f"rq_peer_{uuid.uuid4().hex[:10]}"
    url = await asyncio.to_thread(db.create_database, admin_url, name)
    try:
        # The password, if any, travels in the environment: a command line is visible to every local user.
        parts = conninfo_to_dict(url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUER_")}  # its default table names
        if parts.get("password"):
            env["PGPASSWORD"] = str(parts.pop("password"))
        command = [sys.executable, "-m", "reliableq.bench.peers", peer, mode, "--jobs", str(jobs),
                   "--concurrency", str(concurrency), "--dsn", make_conninfo(**parts)]
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
        description="Run one peer's ingest or execute on an empty database and print one JSON line. "
                    "The database gets the peer's schema: use a scratch one.")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("mode", choices=MODES, help="ingest: enqueue one job per call; execute: drain preloaded jobs")
    parser.add_argument("--jobs", type=_positive, required=True, help="jobs to enqueue or drain")
    parser.add_argument("--concurrency", type=_positive, required=True,
                        help="ingest: concurrent clients; execute: the worker's concurrency")
    parser.add_argument("--dsn", type=_conninfo, required=True, help="an empty database of the server to measure")
    parser.add_argument("--debug", action="store_true", help="show a failure's traceback")
    args = parser.parse_args(argv)
    if not installed(args.peer):
        parser.error(f"{args.peer} is not installed (pip install 'reliableq[peers]')")
    reason = RUNNERS[args.peer].unsupported(args.mode, args.concurrency)
    if reason:
        parser.error(reason)
    try:
        result = asyncio.run(run(args.peer, args.mode, args.jobs, args.concurrency, args.dsn))
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
