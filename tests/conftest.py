"""Shared fixtures: a real PostgreSQL (embedded unless DATABASE_URL is set), one fresh pair of
databases per test cloned from migrated templates, async tests run on asyncio via anyio, and `serve`
for an app on real loopback HTTP."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from reliableq import db, scratch
from reliableq.cli.logs import CHATTY_LIBRARIES
from reliableq.config import Mechanisms
from reliableq.handlers import HandlerRegistry, JobContext, Outcome
from reliableq.lab.places import WORKSPACE_VARIABLE
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue
from reliableq.servers import LoopbackServer

# The learner's workspace (reliableq/lab/places.py) of a test run is a folder of its own, which the notebooks'
# kernels inherit too: no test and no panel writes into the developer's workspace.
os.environ[WORKSPACE_VARIABLE] = tempfile.mkdtemp(prefix="reliableq-test-workspace-")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Run every `async def test_*` on anyio, before parametrization sees it."""
    if collector.funcnamefilter(name) and inspect.iscoroutinefunction(obj):
        pytest.mark.anyio(obj)


# The tiers that run the whole system (real processes, stages, chaos, the benchmark, a browser): every
# test in them is slow, so the inner loop (`-m "not slow"`, CONTRIBUTING.md) leaves them out whole, and
# the stability tier with them (that -m replaces the default's "not stability").
END_TO_END_TIERS = tuple(Path(__file__).parent / tier for tier in ("browser", "bench", "chaos", "stages"))


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("stability") or any(item.path.is_relative_to(tier) for tier in END_TO_END_TIERS):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Seconds per test directory (setup, call and teardown; notebooks as one), after the slowest tests:
    where a run's time goes, to compare runs before and after a change (CONTRIBUTING.md)."""
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            parts = report.nodeid.split("::")[0].split("/")
            where = "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]
            seconds[where] = seconds.get(where, 0.0) + report.duration
            tests.setdefault(where, set()).add(report.nodeid)
    if not seconds:
        return
    terminalreporter.write_sep("=", "seconds per directory")
    for where, spent in sorted(seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{spent:8.1f} s  {len(tests[where]):5d} tests  {where}")
    terminalreporter.write_line(f"{sum(seconds.values()):8.1f} s  {sum(map(len, tests.values())):5d} tests  in all")


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """A test that runs the CLI in this process (`main([...])`) configures logging as a command does:
    it replaces the root's handlers (pytest's capture among them) and sets levels. Put them back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY_LIBRARIES}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, chatty_level in chatty.items():
        logging.getLogger(name).setLevel(chatty_level)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def databases():
    """A fresh queue database and charge database for one test (cloned from the server's migrated
    templates), dropped afterwards."""
    with scratch.scratch_databases("rq_test") as fresh:
        yield fresh


@pytest.fixture
async def pool(databases):
    pool = await db.open_pool_checked(databases.queue_url, max_size=10)
    yield pool
    await pool.close()


@pytest.fixture
def make_queue(pool):
    """A Queue over the test's database with the given mechanisms (all on by default)."""
    def make(mechanisms: Mechanisms = Mechanisms(), faults=None) -> Queue:
        return Queue(pool, mechanisms, faults)
    return make


@pytest.fixture
def submission():
    def make(amount_cents: int = 1250, max_attempts: int = 5) -> Submission:
        return Submission(payload={"amount_cents": amount_cents, "currency": "USD"}, max_attempts=max_attempts,
                          kind="charge")
    return make


def worker_name() -> str:
    return f"test-worker-{uuid.uuid4().hex[:6]}"


def recording_handlers(kind: str, outcome: Outcome) -> tuple[HandlerRegistry, list[JobContext]]:
    """A registry whose one handler, for `kind`, records each job it is given and answers `outcome`."""
    seen: list[JobContext] = []

    async def record(job: JobContext) -> Outcome:
        seen.append(job)
        return outcome

    handlers = HandlerRegistry()
    handlers.register(kind, record)
    return handlers, seen


@asynccontextmanager
async def serve(app) -> AsyncIterator[httpx.AsyncClient]:
    """Serve `app` with uvicorn on 127.0.0.1 and yield a client bound to it.

    Tests that may provoke a 500 assert only after this exits: uvicorn's thread logs the traceback after
    sending the response, and on Python 3.11 formatting it concurrently with pytest's own traceback
    rendering can trip CPython's shared AST recursion counter (an INTERNALERROR)."""
    server = LoopbackServer(app)
    url = await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            yield client
    finally:
        await asyncio.to_thread(server.stop)


async def stale_and_current(queue: Queue, submission, stale_worker: str = "paused-worker",
                            current_worker: str = "rescuer"):
    """One job claimed twice: `stale_worker`'s 1 s lease ran out and `current_worker` reclaimed the job
    (the claim's clock moved 2 s on); returns both claims."""
    await queue.submit(submission())
    (stale,) = await queue.claim(1, stale_worker, lease_seconds=1)
    later = await queue.database_now() + timedelta(seconds=2)
    (current,) = await queue.claim(1, current_worker, 30.0, now=later)
    return stale, current


async def wait_until_lease_ran_out(queue: Queue, job, timeout: float = 10.0) -> None:
    """Poll PostgreSQL's clock (the clock leases are measured by) until `job`'s lease, as claimed, ran out."""
    async def ran_out() -> bool:
        return await queue.database_now() > job.lease_expires_at
    await wait_until(ran_out, timeout, f"the lease of job {job.id} to run out")
