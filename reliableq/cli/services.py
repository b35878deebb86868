"""`reliableq api`, `reliableq charge-service` and `reliableq worker`: the parts, run as processes.

Every server binds 127.0.0.1 unless told otherwise, and the API refuses to bind elsewhere without a
bearer token. Each logs its lifecycle at INFO (reliableq/cli/logs.py): a server once listening, a worker
when it starts, stops claiming and stops (with its stats). With `--status-file` a worker also keeps a
JSON file for programs (its state, then its stats), so that a supervisor or the benchmark never parses
what is logged for people. With `--metrics-port` a worker also serves Prometheus metrics (reliableq/metrics.py),
on loopback unless told otherwise, and beyond it only behind a token, as the API."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from reliableq import db
from reliableq.cli.arguments import UsageError, check_fleet_limit, mechanisms_from, run_coroutine, seconds_from
from reliableq.config import DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS, WorkerSettings
from reliableq.hooks import FaultHook
from reliableq.lab.faults import FaultPlan

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

LOOPBACK = ("127.0.0.1", "localhost", "::1")
log = logging.getLogger("reliableq.cli")


def _serve(app, name: str, host: str, port: int, detail: str = "") -> int:
    """Bind first, then announce, then serve: a busy port is a one-line error, not a false banner.
    log_config=None: uvicorn's own loggers then go through ours (one format, JSON too), at WARNING."""
    import uvicorn

    from reliableq.servers import bind_listener, uvicorn_config
    try:
        listener = bind_listener(host, port)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}; choose another --port") from None
    log.info("%s listening on http://%s:%d%s", name, host, port, detail)
    # uvicorn answers a SIGTERM by finishing in-flight requests, puts back the handler it found and raises
    # the signal again: with this one the process then exits 0 after saying so, as a worker does, instead
    # of dying by the signal without a word. (A SIGTERM before uvicorn starts ends the process at once.)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.Server(uvicorn_config(app, log_config=None)).run(sockets=[listener])
    finally:
        log.info("%s stopped", name)
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    from reliableq.api import create_api_app
    from reliableq.charge.handler import STANDARD_KINDS
    mechanisms_from(args)
    token = args.token or os.environ.get("RELIABLEQ_API_TOKEN")
    if args.host not in LOOPBACK and not token:
        raise UsageError(f"binding {args.host} exposes the API beyond this machine: set --token or RELIABLEQ_API_TOKEN")
    db_timeout = seconds_from(args.db_timeout, "RELIABLEQ_DB_TIMEOUT", db.DEFAULT_DB_TIMEOUT_SECONDS)
    key_window = seconds_from(args.idempotency_window, "RELIABLEQ_IDEMPOTENCY_WINDOW",
                              DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS)
    databases = db.resolve()
    db.migrate(databases)
    mechanisms = mechanisms_from(args)
    faults = FaultPlan()
    if args.crash_at:
        faults.arm_crash(args.crash_at, real_kill=True)
    app = create_api_app(databases.queue_url, mechanisms, faults, api_token=token, kinds=STANDARD_KINDS,
                         db_timeout=db_timeout, key_window=key_window)
    with _profiled_if_asked(args):
        return _serve(app, "API", args.host, args.port, f" ({mechanisms.describe()})")


def _profiled_if_asked(args: argparse.Namespace) -> AbstractContextManager:
    """`--cprofile PATH`: the process's serving profiled, its round trips counted, written when it stops."""
    if args.cprofile is None:
        return nullcontext()
    from reliableq.bench.client_cost import profiled
    return profiled(Path(args.cprofile))


def cmd_charge_service(args: argparse.Namespace) -> int:
    from reliableq.charge.service import ChargeFaults, create_charge_app
    faults = ChargeFaults(latency_seconds=args.latency, transient_rate=args.transient_rate,
                          timeout_rate=args.timeout_rate, permanent_rate=args.permanent_rate,
                          lost_response_rate=args.lost_response_rate, capacity=args.capacity, seed=args.seed,
                          retry_after_seconds=args.retry_after)
    databases = db.resolve()
    db.migrate(databases)
    return _serve(create_charge_app(databases.charge_url, faults), "charge service", args.host, args.port)


def cmd_worker(args: argparse.Namespace) -> int:
    mechanisms = mechanisms_from(args)  # bad switches are a usage error, reported before touching the database
    check_fleet_limit(args.fleet_limit, mechanisms)
    settings = WorkerSettings(concurrency=args.concurrency, lease_seconds=args.lease, poll_seconds=args.poll,
                              shutdown_grace_seconds=args.grace,
                              backoff_seed=args.seed, worker_id=args.worker_id, fleet_limit=args.fleet_limit,
                              wake_on_submit=not args.poll_only,
                              db_wait_seconds=seconds_from(args.db_wait, "RELIABLEQ_DB_WAIT",
                                                           WorkerSettings().db_wait_seconds))
    _check_metrics_options(args)
    faults = FaultHook()  # no plan unless one is asked for: a plan keeps each finalize in a transaction
    if args.crash_at:
        faults = FaultPlan()
        faults.arm_crash(args.crash_at, real_kill=True)
    with _profiled_if_asked(args):
        return run_coroutine(_run_worker(args, settings, faults))


def _check_metrics_options(args: argparse.Namespace) -> None:
    """--metrics-host only with --metrics-port; beyond loopback, only behind a token (as the API)."""
    args.metrics_token = args.metrics_token or os.environ.get("RELIABLEQ_API_TOKEN")
    if args.metrics_host is not None and args.metrics_port is None:
        raise UsageError("--metrics-host needs --metrics-port")
    if args.metrics_port is not None and args.metrics_host is None:
        args.metrics_host = LOOPBACK[0]
    if args.metrics_port is not None and args.metrics_host not in LOOPBACK and not args.metrics_token:
        raise UsageError(f"binding {args.metrics_host} exposes the worker's metrics beyond this machine: "
                         "set --metrics-token or RELIABLEQ_API_TOKEN")


async def _serve_metrics(args: argparse.Namespace, registry: CollectorRegistry) -> web.AppRunner:
    from reliableq.metrics import serve_worker_metrics
    try:
        server = await serve_worker_metrics(registry, args.metrics_host, args.metrics_port, args.metrics_token)
    except OSError as error:
        raise UsageError(f"cannot listen on {args.metrics_host}:{args.metrics_port}: {error.strerror}; "
                         "choose another --metrics-port") from None
    log.info("worker metrics on http://%s:%d/metrics", args.metrics_host, args.metrics_port)
    return server


async def _run_worker(args: argparse.Namespace, settings: WorkerSettings, faults: FaultHook) -> int:
    from reliableq.charge.client import ChargeClient
    from reliableq.charge.handler import standard_handlers
    from reliableq.metrics import WorkerMetrics
    from reliableq.queue import Queue
    from reliableq.worker import Worker
    databases = db.resolve()
    await asyncio.to_thread(db.migrate, databases)
    mechanisms = mechanisms_from(args)
    # A transaction left idle for a whole lease is a stalled worker's: the server ends it, freeing the row.
    pool = await db.open_pool_checked(databases.queue_url, max_size=min(settings.concurrency, 32) + 2,
                                      idle_in_transaction_seconds=settings.lease_seconds,
                                      db_timeout_seconds=settings.db_wait_seconds)
    charges = ChargeClient(args.charge_url, args.charge_timeout, mechanisms.idempotency)
    metrics = WorkerMetrics() if args.metrics_port is not None else None
    worker = Worker(Queue(pool, mechanisms, faults), standard_handlers(charges), settings, faults,
                    stats=metrics.stats if metrics else None)
    metrics_server = None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop)
    try:
        if metrics:
            metrics.watch(worker)
            metrics_server = await _serve_metrics(args, metrics.registry)
        _write_status(args.status_file, {"worker_id": worker.worker_id, "state": "running"})
        cpu_started = time.process_time()
        stats = await worker.run()
        cpu_seconds = time.process_time() - cpu_started
        # The pool's own counters (requests_wait_ms, requests_num, ...) tell waits for a connection
        # apart from time spent in PostgreSQL; the benchmark reads them from this line.
        pool_stats = pool.get_stats()
    finally:
        if metrics_server:
            await metrics_server.cleanup()
        await charges.aclose()
        await pool.close()
    report = dataclasses.asdict(stats) | {"pool": pool_stats, "cpu_seconds": cpu_seconds}
    _write_status(args.status_file, {"worker_id": worker.worker_id, "state": "stopped", "stats": report})
    return 0


def _write_status(path: str | None, status: dict) -> None:
    """Replace the status file whole (a reader never sees half of it)."""
    if path is None:
        return
    partial = Path(path).with_suffix(".partial")
    partial.write_text(json.dumps(status))
    os.replace(partial, path)
