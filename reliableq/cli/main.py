"""The `reliableq` command: its parser, one subcommand per command of the families beside this module.

Errors are for people: one line saying what is wrong and what to do, and a non-zero exit; the
traceback only with --debug."""

from __future__ import annotations

import argparse
import os
import signal
import sys

import reliableq_stages
from reliableq import db
from reliableq.bench.scenarios import SCENARIOS
from reliableq.charge.client import DEFAULT_TIMEOUT_SECONDS as CHARGE_TIMEOUT_SECONDS
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.charge.service import ChargeFaults
from reliableq.cli.arguments import (
    UsageError,
    WholeWordsHelp,
    add_mechanism_option,
    job_uuid,
    non_negative_float,
    positive_float,
    positive_int,
    rate,
    tcp_port,
)
from reliableq.cli.bench import cmd_bench
from reliableq.cli.database import cmd_db, cmd_migrate
from reliableq.cli.doctor import cmd_doctor
from reliableq.cli.lab import cmd_chaos, cmd_demo, cmd_lab, cmd_stage
from reliableq.cli.logs import FORMATS, LEVELS, configure, level_for
from reliableq.cli.operators import cmd_jobs, cmd_prune, cmd_replay, cmd_submit
from reliableq.cli.services import cmd_api, cmd_charge_service, cmd_worker
from reliableq.config import DEFAULT_REPLAY_BUDGET, DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS, WorkerSettings
from reliableq.lab.chaos import ChaosConfig
from reliableq.lab.faults import API_KILL_POINTS, CRASH_POINTS
from reliableq.lab.places import WORKSPACE_VARIABLE
from reliableq.payload import InvalidSubmission
from reliableq.queue import STATUSES
from reliableq.retention import DEFAULT_PRUNE_BATCH, MAX_PRUNE_BATCH

# The defaults shown and used are the dataclasses' own: one place to change them.
CHARGE, WORKER, CHAOS = ChargeFaults(), WorkerSettings(), ChaosConfig()


def cmd_exercise(args: argparse.Namespace) -> int:
    """`reliableq exercise`, imported when it runs: the exercises need the lab's extras (hypothesis,
    pglast), which an install for serving jobs (the Docker image's `pip install .`) does not have."""
    try:
        from reliableq.cli.exercise import cmd_exercise as run_exercise
    except ModuleNotFoundError as missing:
        raise UsageError(f"the exercises need the lab's packages ({missing.name} is missing): "
                         "pip install 'reliableq[lab]'") from None
    return run_exercise(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reliableq", formatter_class=WholeWordsHelp,
                                     description="ReliableQ: a PostgreSQL job queue and its failure lab.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    add_logging_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("db", help="start, show or migrate the database (the embedded PostgreSQL unless DATABASE_URL "
                                  "is set); migrate: apply the pending migrations and say which")
    p.add_argument("action", choices=["start", "url", "stop", "migrate", "failover"], nargs="?", default="url")
    p.add_argument("--standby", action="store_true",
                   help="a primary and a streaming standby of its own on loopback (start, url, stop; failover "
                        "SIGKILLs the primary and promotes the standby): use the URL it prints as DATABASE_URL")
    p.add_argument("--synchronous", action="store_true",
                   help="with start --standby: a commit waits until the standby has its WAL")
    p.set_defaults(run=cmd_db)

    p = sub.add_parser("migrate", help="create the databases and apply their pending migrations, saying which "
                                       "(the same as `reliableq db migrate`)")
    p.set_defaults(run=cmd_migrate)

    p = sub.add_parser("api", help="serve the HTTP API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=tcp_port, default=8000)
    p.add_argument("--token", help="require this bearer token (required when binding beyond loopback)")
    p.add_argument("--db-timeout", metavar="SECONDS", type=positive_float, default=None,
                   help="seconds a request waits for the database before it is answered 503 "
                        f"(default: RELIABLEQ_DB_TIMEOUT, else {db.DEFAULT_DB_TIMEOUT_SECONDS:g})")
    p.add_argument("--crash-at", choices=API_KILL_POINTS,
                   help="SIGKILL this process right after the first submission commits, before its 202 is sent")
    p.add_argument("--idempotency-window", metavar="SECONDS", type=positive_float, default=None,
                   help="seconds a submission's Idempotency-Key names its job; an older key names a new one "
                        f"(default: RELIABLEQ_IDEMPOTENCY_WINDOW, else {DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS:g})")
    p.add_argument("--cprofile", metavar="PATH",
                   help="profile this process (cProfile) and count its round trips to PostgreSQL; written to PATH "
                        "(pstats), PATH's .txt (top entries) and .json when it stops (`reliableq bench`'s client-cost)")
    add_mechanism_option(p)
    p.set_defaults(run=cmd_api)

    p = sub.add_parser("charge-service", help="serve the charge service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=tcp_port, default=8001)
    p.add_argument("--latency", type=non_negative_float, default=CHARGE.latency_seconds,
                   help="seconds added to every request")
    p.add_argument("--transient-rate", type=rate, default=CHARGE.transient_rate, help="share of requests answered 503")
    p.add_argument("--timeout-rate", type=rate, default=CHARGE.timeout_rate, help="share of requests left hanging")
    p.add_argument("--permanent-rate", type=rate, default=CHARGE.permanent_rate, help="share of requests answered 422")
    p.add_argument("--lost-response-rate", type=rate, default=CHARGE.lost_response_rate,
                   help="share charged, then left hanging")
    p.add_argument("--capacity", type=positive_int, help="refuse requests beyond this many in flight")
    p.add_argument("--retry-after", type=positive_int, metavar="SECONDS",
                   help="send Retry-After: SECONDS with every 503 (a worker then retries no sooner)")
    p.add_argument("--seed", type=int, default=CHARGE.seed, help="seed of the failure draws")
    p.set_defaults(run=cmd_charge_service)

    p = sub.add_parser("worker", help="run a worker")
    p.add_argument("--charge-url", default="http://127.0.0.1:8001")
    p.add_argument("--concurrency", type=positive_int, default=WORKER.concurrency, help="jobs handled at once")
    p.add_argument("--lease", type=positive_float, default=WORKER.lease_seconds, help="lease length in seconds")
    p.add_argument("--poll", type=positive_float, default=WORKER.poll_seconds, help="idle poll interval in seconds")
    p.add_argument("--poll-only", action="store_true",
                   help="find new jobs only by polling (no LISTEN connection): a submission waits for the next poll")
    p.add_argument("--charge-timeout", type=positive_float, default=CHARGE_TIMEOUT_SECONDS,
                   help="seconds to wait for the charge service")
    p.add_argument("--grace", type=non_negative_float, default=WORKER.shutdown_grace_seconds,
                   help="seconds in-flight work may finish after SIGTERM")
    p.add_argument("--seed", type=int, help="seed of the backoff jitter")
    p.add_argument("--worker-id", help="name of this worker (default: host-pid-n)")
    p.add_argument("--fleet-limit", type=positive_int,
                   help="jobs in flight across every worker of this database (enforced in PostgreSQL)")
    p.add_argument("--db-wait", metavar="SECONDS", type=positive_float, default=None,
                   help="seconds a claim or a finalize waits for a database connection before it fails and is "
                        f"tried again (default: RELIABLEQ_DB_WAIT, else {WORKER.db_wait_seconds:g})")
    p.add_argument("--crash-at", choices=CRASH_POINTS[:3], help="SIGKILL this process the first time it gets there")
    p.add_argument("--status-file", metavar="PATH",
                   help='keep a JSON file of this worker\'s state: {"state": "running"}, then its stats when it stops')
    p.add_argument("--metrics-port", metavar="PORT", type=tcp_port,
                   help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (default: none)")
    p.add_argument("--metrics-host", metavar="HOST",
                   help="address the metrics are served on (default 127.0.0.1; beyond loopback needs a token)")
    p.add_argument("--metrics-token", metavar="TOKEN",
                   help="bearer token /metrics requires (default: RELIABLEQ_API_TOKEN, the API's)")
    p.add_argument("--cprofile", metavar="PATH",
                   help="profile this process (cProfile) and count its round trips to PostgreSQL; written to PATH "
                        "(pstats), PATH's .txt (top entries) and .json when it stops (`reliableq bench`'s client-cost)")
    add_mechanism_option(p)
    p.set_defaults(run=cmd_worker)

    p = sub.add_parser("submit", help="submit a job, a charge unless --kind says otherwise (straight to the "
                                      "database, or through --api-url)")
    p.add_argument("--kind", default=STANDARD_KINDS.default, choices=sorted(STANDARD_KINDS.checks),
                   help=f"the job's kind (default {STANDARD_KINDS.default})")
    p.add_argument("--amount", type=int, help="amount in cents (a charge requires it)")
    p.add_argument("--currency", help="a charge's currency (default USD)")
    p.add_argument("--description")
    p.add_argument("--max-attempts", type=positive_int)
    p.add_argument("--tenant", help="whose work it is: the fair claim takes due jobs tenant by tenant in turn "
                                    "(default: the shared tenant 'default')")
    p.add_argument("--api-url", help="submit through this API instead of the database")
    p.add_argument("--token", help="with --api-url: the API's bearer token (default: RELIABLEQ_API_TOKEN)")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs (DEAD included) or show one with its attempts")
    p.add_argument("action", choices=["list", "show"], nargs="?", default="list")
    p.add_argument("job_id", type=job_uuid, nargs="?")
    p.add_argument("--status", type=str.upper, choices=STATUSES)
    p.add_argument("--limit", type=positive_int, default=50)
    p.set_defaults(run=cmd_jobs)

    p = sub.add_parser("replay", help="send a DEAD job back to PENDING (same id and idempotency key)")
    p.add_argument("job_id", type=job_uuid)
    p.add_argument("--budget", type=positive_int, default=DEFAULT_REPLAY_BUDGET, help="fresh attempts it gets")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("prune", help="delete SUCCEEDED jobs (DEAD too with --dead) finished long enough ago, "
                                     "in small batches beside running workers")
    p.add_argument("--older-than", metavar="SECONDS", type=non_negative_float, required=True,
                   help="prune jobs finalized more than this many seconds ago")
    p.add_argument("--dead", action="store_true", help="prune DEAD jobs too (kept by default, for replay)")
    p.add_argument("--batch", type=positive_int, default=DEFAULT_PRUNE_BATCH,
                   help=f"jobs deleted per transaction (default {DEFAULT_PRUNE_BATCH}, at most {MAX_PRUNE_BATCH})")
    p.add_argument("--idempotency-window", metavar="SECONDS", type=positive_float, default=None,
                   help="keep jobs whose Idempotency-Key is younger than this: give the API's "
                        f"(default: RELIABLEQ_IDEMPOTENCY_WINDOW, else {DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS:g})")
    p.add_argument("--every", metavar="SECONDS", type=positive_float,
                   help="run a pass every this many seconds until SIGTERM or Ctrl-C (default: one pass)")
    p.set_defaults(run=cmd_prune)

    p = sub.add_parser("demo", help="crash a worker after its charge commits, recover, print A H C F")
    p.add_argument("story", nargs="?", default="crash", choices=["crash", "kill9", "pause"],
                   help="crash: in-process (default); kill9: real SIGKILL; pause: real SIGSTOP/SIGCONT")
    p.add_argument("--lease", type=positive_float, help="lease seconds (kill9: 2, pause: 1)")
    add_mechanism_option(p)
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("stage", help="run one stage's scenario with its mechanism off, on, or both")
    p.add_argument("name", help=", ".join(reliableq_stages.names()))
    p.add_argument("mode", nargs="?", default="compare", choices=["compare", "off", "on"])
    p.add_argument("--seed", type=int, default=1, help="the scenario's seed (default 1, as in the notebooks)")
    p.set_defaults(run=cmd_stage)

    p = sub.add_parser("lab", help="start PostgreSQL, apply the schemas and open JupyterLab on the notebooks")
    p.add_argument("--notebooks", help="the notebooks to copy into your workspace (default: the clone's notebooks/)")
    p.add_argument("--workspace", help=f"the folder JupyterLab serves: your notebooks, exercise files and progress "
                                       f"(default: ${WORKSPACE_VARIABLE}, else the clone's workspace/)")
    p.add_argument("--fresh-notebooks", action="store_true",
                   help="replace your copies of the notebooks the clone has changed (yours are backed up)")
    p.add_argument("--port", type=tcp_port, default=8888)
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--token", help="JupyterLab access token (default: a random one, printed by JupyterLab)")
    p.set_defaults(run=cmd_lab)

    p = sub.add_parser("doctor", help="check this machine is ready for the lab: a line per check, a failed one "
                                      "with its fix (exit 1 if any failed)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list of {check, ok, detail, fix}")
    p.add_argument("--skip-stage", action="store_true", help="do not run a stage end to end")
    p.set_defaults(run=cmd_doctor)

    p = sub.add_parser("chaos", help="seeded crashes, pauses and failures; then check the invariants")
    p.add_argument("--seed", type=int, default=CHAOS.seed)
    p.add_argument("--jobs", type=positive_int, default=CHAOS.jobs)
    p.add_argument("--workers", type=positive_int, default=CHAOS.workers)
    p.add_argument("--concurrency", type=positive_int, default=CHAOS.concurrency, help="permits per worker")
    p.add_argument("--lease", type=positive_float, default=CHAOS.lease_seconds, help="lease seconds")
    p.add_argument("--settle", type=positive_float, default=CHAOS.settle_seconds,
                   help="seconds the run may take to settle")
    p.add_argument("--fleet-limit", type=positive_int,
                   help="jobs in flight across all workers (checked: live leases never exceed it)")
    p.add_argument("--failover", action="store_true",
                   help="instead: real API and worker processes over a primary and a synchronous standby, the "
                        "primary SIGKILLed mid-submission and the standby promoted (uses --seed, --workers, --lease, "
                        "--settle and --off; shows sync_standby)")
    add_mechanism_option(p)
    p.set_defaults(run=cmd_chaos)

    p = sub.add_parser("exercise", help="write a mechanism yourself; the lab's checker grades it")
    p.add_argument("action", choices=["list", "start", "check", "hint", "solution", "reset", "progress", "room",
                                      "mutants"])
    p.add_argument("name", nargs="?", help="the exercise (see: reliableq exercise list); mutants: all if none; "
                                           "room: the folder of the room's progress records")
    p.add_argument("--workspace", help=f"your notebooks, exercise files and progress (default: ${WORKSPACE_VARIABLE}, "
                                       "else the clone's workspace/ folder)")
    p.add_argument("--json", action="store_true", help="list, progress: print a record for tools")
    p.add_argument("--to", metavar="DIR", help="progress: also write your record into DIR (a folder the room shares)")
    p.add_argument("--learner", help="progress: your name in the room (default: login@machine)")
    p.add_argument("--seed", type=int, default=1, help="check: the seed of the scenario and the first chaos run; "
                                                       "mutants: the seed of --sample")
    p.add_argument("--seeds", type=positive_int, help="check: how many seeded chaos runs (default 2)")
    p.add_argument("--sample", type=positive_int, metavar="N",
                   help="mutants: grade a seeded sample of N mutants per exercise (default: every mutant)")
    p.add_argument("--give-up", action="store_true", help="solution: show it before a pass")
    p.set_defaults(run=cmd_exercise)

    p = sub.add_parser("bench", help="benchmark real processes against pgbench; gated by the invariants")
    p.add_argument("--profile", choices=["tiny", "quick", "full"], default="quick",
                   help="quick (default): about 4-5 minutes on 2 cores, retention left to full; full: larger "
                        "sizes, every point 3 times; tiny: seconds, for tests")
    p.add_argument("--out", help="results folder (default: results/bench/<timestamp> in the clone, whatever the "
                                 "current folder, linked as results/bench/latest, which notebook 13 shows)")
    p.add_argument("--scenarios", help="comma-separated subset: " + ",".join(SCENARIOS))
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (failure draws, jitter)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--note", default="", help="a line kept with the machine's description in the results, e.g. "
                                              "what else ran on it")
    p.add_argument("--reference", action="store_true",
                   help="also copy what notebook 13 shows (results.json cut down, the charts) into "
                        "notebooks/bench_reference/, the results shipped for a fresh clone")
    p.set_defaults(run=cmd_bench)
    parser.set_defaults(log_level=None, log_format="text")
    for command in sub.choices.values():
        add_logging_options(command)
        command.formatter_class = WholeWordsHelp
    return parser


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """Accepted before or after the command name (`reliableq worker --log-format json`). SUPPRESS: an
    option not given sets nothing, so the command's copy never overwrites one given before the command;
    the defaults are the main parser's."""
    parser.add_argument("--log-level", type=str.upper, choices=LEVELS, default=argparse.SUPPRESS,
                        help="log this level and above (default: INFO for api, worker and charge-service, "
                             "ERROR for the other commands; --debug means DEBUG)")
    parser.add_argument("--log-format", choices=FORMATS, default=argparse.SUPPRESS,
                        help="text (default) or json: one JSON object per line, for log collectors")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(level_for(args.command, args.log_level, args.debug), args.log_format)
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
