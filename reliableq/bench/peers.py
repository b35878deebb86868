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
settings. Each queue's adapter, the work itself, is `reliableq.bench.peer_runners`; this module runs one
and checks it (`run`, the command line) and gives it its database and process (`measure`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from reliableq import scratch, sql
from reliableq.bench.peer_runners import PICKUP, RUNNERS, connect
from reliableq.bench.profiles import BATCH_JOBS

PEERS = ("pgqueuer", "procrastinate")
# The peers' baselines beside our ingest (one per call, batches) and no-op execution, by their report name.
_TOOLS = {"ingest": "enqueue", "ingest-batch": "enqueue-batch", "execute": "execute"}
MODES = tuple(_TOOLS)
PICKUP_QUEUES = ("reliableq", "reliableq-poll-only", *PEERS)
# A pickup run's time allowed per job beyond the settle time: pgqueuer over psycopg takes about a second
# per job (see peer_runners.PgQueuerRunner), so a run of 200 takes minutes however idle the machine.
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


async def _read(dsn: str, query: str, params: dict | None = None) -> dict:
    async with await connect(dsn) as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_Q[query], params)
        return await cur.fetchone()


async def run(peer: str, mode: str, jobs: int, concurrency: int, dsn: str, seed: int = 0) -> PeerRun:
    """One run in this process, on the empty database `dsn`: install, enqueue or drain, check, time."""
    runner = RUNNERS[peer](dsn)
    done = PeerRun(peer, mode, jobs, concurrency, version=importlib.metadata.version(runner.package))
    async with await connect(dsn):
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
    # Dropped in the background, as every scratch database: a DROP waits for a checkpoint, which under
    # load waited past a test's two minutes.
    with ExitStack() as dropped_after:
        url = await asyncio.to_thread(dropped_after.enter_context, scratch.empty_database("rq_peer"))
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
    sys.exit(main())
