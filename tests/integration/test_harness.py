"""The one harness (reliableq/lab/harness.py) on its own: a wait nobody can finish fails at once, a wait
that times out says why, and faults go only where the servers run."""

from __future__ import annotations

import signal
import uuid

import psycopg
import pytest

from reliableq.charge.service import ChargeFaults
from reliableq.config import WorkerSettings
from reliableq.lab import harness, processes
from reliableq.lab.harness import local_system
from reliableq.lab.pieces import LEARNER_STATEMENT_SECONDS, SHIPPED, Pieces
from reliableq.payload import Submission

CHARGE = Submission(payload={"amount_cents": 1250, "currency": "USD"}, kind="charge")


async def test_a_timed_out_wait_says_which_jobs_wait_and_what_holds_them(databases):
    """A job no worker takes, and a session sitting in a transaction on its row: the timeout names both."""
    async with local_system(databases=databases, api=False, worker_pool_size=0) as system:
        job = await system.submit_direct(CHARGE)
        with psycopg.connect(databases.queue_url) as holder:
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job.id,))
            with pytest.raises(TimeoutError) as timeout:
                await system.wait_settled([job.id], timeout=0.2)
    report = str(timeout.value)
    assert report.startswith("timed out after 0.2s waiting for 1 job(s) to be SUCCEEDED or DEAD\n")
    assert f"stuck jobs: {{'job_id': UUID('{job.id}'), 'status': 'PENDING'" in report
    assert "busy sessions: " in report and "'state': 'idle in transaction'" in report and "FOR UPDATE" in report


async def test_settling_fails_at_once_when_every_worker_process_is_gone(databases, tmp_path):
    """The harness does not wait out its deadline for a run nobody can finish: its only worker process
    was SIGKILLed holding the job, so waiting for it to settle fails at once, saying why."""
    async with local_system(databases=databases, api=False, worker_pool_size=0, logs=tmp_path) as system:
        await system.submit_direct(CHARGE)
        worker = system.spawn_worker("worker", 30.0, "--crash-at", "after_claim_before_effect")
        assert await processes.wait_exit(worker, 30) == -signal.SIGKILL
        with pytest.raises(RuntimeError, match="every worker stopped before the run settled"):
            await system.wait_settled(timeout=600)


async def test_settling_gives_up_once_only_jobs_past_their_budget_are_left(databases):
    """With dead-lettering off, a job claimed more times than its budget retries forever: a wait told to
    give up then stops at once, unsettled, instead of waiting out its deadline; while any job is within
    its budget the wait goes on."""
    async with local_system(databases=databases, api=False, worker_pool_size=0) as system:
        give_up = system.only_jobs_past_their_budget_unsettled
        assert not await give_up()  # nothing unsettled: settled, not given up on
        within, past = [await system.submit_direct(CHARGE) for _ in range(2)]
        with psycopg.connect(databases.queue_url, autocommit=True) as conn:
            conn.execute("UPDATE jobs SET attempts = max_attempts + 1 WHERE id = %s", (past.id,))
            assert not await give_up()
            with pytest.raises(TimeoutError):
                await system.wait_settled(timeout=0.2, give_up=give_up)
            conn.execute("UPDATE jobs SET attempts = max_attempts + 1 WHERE id = %s", (within.id,))
            assert await give_up()
            assert await system.wait_settled(timeout=600, give_up=give_up) is False


async def test_faults_go_where_the_servers_run(databases):
    """Live fault objects only for servers in this process, CLI arguments only for server processes."""
    with pytest.raises(ValueError, match="charge_args"):
        async with local_system(databases=databases, servers="processes", charge_faults=ChargeFaults()):
            pass
    with pytest.raises(ValueError, match="charge_faults, not charge_args"):
        async with local_system(databases=databases, charge_args=["--latency", "1"]):
            pass


async def test_a_learners_replaced_queries_run_under_a_statement_timeout(databases):
    """A learner's claim that waits for a lock or never ends is cancelled by PostgreSQL in a real run;
    the shipped queries keep no limit (a long lock wait is a fault the chaos runs stage on purpose)."""
    learner = Pieces(queue_queries={"database_now": "SELECT pg_sleep(60), now() AS now"})
    for pieces, expected in [(SHIPPED, "0"), (learner, f"{int(LEARNER_STATEMENT_SECONDS)}s")]:
        async with local_system(databases=databases, api=False, charge=False, pieces=pieces) as system:
            async with system.worker_pool.connection() as conn:
                shown = await (await conn.execute("SHOW statement_timeout")).fetchone()
        assert shown[0] == expected


async def test_a_learners_charge_query_that_never_ends_is_cancelled(databases, monkeypatch):
    """The charge service answers a request whose learner's insert sleeps with an error once the
    statement timeout cancels it, instead of holding the worker's request for ever."""
    monkeypatch.setattr(harness, "LEARNER_STATEMENT_SECONDS", 0.3)
    learner = Pieces(charge_queries={"charge_insert_once": "SELECT pg_sleep(60)"})
    async with local_system(databases=databases, api=False, worker_pool_size=0, pieces=learner) as system:
        response = await system.http.post(f"{system.charge_url}/v1/charges", headers={"Idempotency-Key": "k-1"},
                                          json={"job_id": str(uuid.uuid4()), "amount_cents": 1250, "currency": "USD"})
    assert response.status_code >= 500


async def test_in_process_workers_wait_for_a_connection_as_a_worker_process_does(databases):
    """The workers' pool waits WorkerSettings.db_wait_seconds (as `reliableq worker` does), not
    psycopg_pool's 30 s; a worker asking for another wait is refused, not silently given this one."""
    async with local_system(databases=databases, api=False, charge=False) as system:
        assert system.worker_pool.timeout == WorkerSettings().db_wait_seconds == 1.0
        with pytest.raises(ValueError, match="db_wait_seconds=5: the in-process workers share one pool, "
                                             "which waits 1 s for a connection"):
            system.worker(WorkerSettings(db_wait_seconds=5))
