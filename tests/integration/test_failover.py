"""The queue over a primary and a streaming standby (reliableq/standby.py), through one multi-host URL:
after the primary is SIGKILLed and the standby promoted, a `reliableq api` process and a `reliableq
worker` process carry on against the promoted server without a restart."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from reliableq import db, scratch
from reliableq.api import MAY_BE_STORED, create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.config import Mechanisms
from reliableq.db import Databases
from reliableq.lab.harness import local_system
from reliableq.lab.waiting import wait_until
from reliableq.standby import StandbyPair
from tests.conftest import serve
from tests.integration.ledger_counts import counts_by_job

pytestmark = pytest.mark.slow
CHARGE = {"amount_cents": 1250, "currency": "USD"}


async def _submit_until_accepted(system, amount_cents: int) -> uuid.UUID:
    """POST with a key until a 202: a submission in the failover's gap is answered 503, and its retry
    with the same key never stores a second job."""
    key = f"failover-{amount_cents}"

    async def accepted() -> uuid.UUID | None:
        response = await system.http.post(f"{system.api_url}/v1/jobs", headers={"Idempotency-Key": key},
                                          json={"amount_cents": amount_cents, "currency": "USD"})
        assert response.status_code in (202, 503), response.text
        return uuid.UUID(response.json()["id"]) if response.status_code == 202 else None
    return await wait_until(accepted, 60, f"the API to accept job {amount_cents} after the failover", 0.2)


async def test_the_api_and_a_worker_follow_a_promotion_without_a_restart(tmp_path):
    with StandbyPair.start(synchronous=True) as pair, scratch.empty_database("rq_test_failover") as charge_url:
        databases = Databases(pair.url("reliableq_failover"), charge_url)
        async with local_system(databases=databases, servers="processes", worker_pool_size=0,
                                logs=tmp_path) as system:
            system.spawn_worker("worker-1", 5.0)
            before = [await _submit_until_accepted(system, 100 + i) for i in range(5)]
            await system.wait_settled(before, timeout=60)

            pair.fail_over()
            after = [await _submit_until_accepted(system, 200 + i) for i in range(5)]
            await system.wait_settled(after, timeout=60)
            counts = await counts_by_job(system)
            assert sorted(counts) == sorted(before + after)  # no job lost, none stored twice
            assert {(c.status, c.charges, c.finalizations) for c in counts.values()} == {("SUCCEEDED", 1, 1)}


@pytest.mark.parametrize("sync_standby", [True, False], ids=["commits wait", "commits do not wait"])
async def test_readiness_turns_503_while_commits_wait_for_an_unreachable_standby(sync_standby):
    """A synchronous standby cut off: reads still answer, but a submission's commit would wait, so
    readiness is 503 (an API whose commits do not wait stays 200), and the probes leave no session
    waiting for the standby. The link restored, readiness is 200 again."""
    mechanisms = Mechanisms() if sync_standby else Mechanisms().without("sync_standby")
    with StandbyPair.start(synchronous=True) as pair:
        url = pair.url("rq_test_ready")
        db.ensure_database(url)
        db.apply_schema(url, "queue")
        async with serve(create_api_app(url, mechanisms, kinds=STANDARD_KINDS)) as api:
            assert (await api.get("/health/ready")).status_code == 200
            pair.link.cut()
            try:
                probes = [await api.get("/health/ready") for _ in range(3)]
                assert (await api.get("/v1/jobs")).status_code == 200  # reads are answered
                # Each probe's wait is cancelled: no session is left waiting for the standby.
                await wait_until(lambda: pair.commits_waiting() == 0, 5,
                                 "the probes' waits to be cancelled")
            finally:
                pair.link.restore()
            if sync_standby:
                assert [p.status_code for p in probes] == [503] * 3
                assert "no commit within 0.5 s (a synchronous standby unreachable" in probes[0].json()["error"]
            else:
                assert [p.status_code for p in probes] == [200] * 3
            ready = await wait_until(lambda: _ready(api), 10, "readiness after the link is restored", 0.1)
            assert ready.json()["status"] == "ok"


async def _ready(api):
    response = await api.get("/health/ready")
    return response if response.status_code == 200 else None



@pytest.mark.parametrize("sync_standby", [False, True], ids=["the hole", "closed"])
async def test_a_keyed_retry_is_not_answered_replayed_for_a_job_only_the_primary_has(sync_standby):
    """The cancelled-wait hole through the API. A keyed submission's commit waits for the cut-off standby
    and is answered 503; its wait is then cancelled (as a restarted session or an operator would), so the
    job is visible on the primary though the standby never had it. The client retries with its key.
    With its commits not waiting for the standby the API answers 202 "replayed" for that job, and the
    failover loses an acknowledged job. With them waiting, the retry's own commit (it locks the key's
    row, a write) waits too, is answered 503, and nothing acknowledged is lost."""
    mechanisms = Mechanisms() if sync_standby else Mechanisms().without("sync_standby")
    with StandbyPair.start(synchronous=True) as pair:
        url = pair.url("rq_test_replayed")
        db.ensure_database(url)
        db.apply_schema(url, "queue")
        app = create_api_app(url, mechanisms, kinds=STANDARD_KINDS, db_timeout=1.0)
        async with serve(app) as api:
            pair.link.cut()
            first = await api.post("/v1/jobs", headers={"Idempotency-Key": "order-1"}, json=CHARGE)
            if sync_standby:  # the commit waited for the standby, past the API's timeout
                assert first.status_code == 503 and first.json()["error"].endswith(MAY_BE_STORED)
                await wait_until(lambda: pair.commits_waiting() == 1, 5, "the commit's wait")
                pair.cancel_waiting_commits()
            else:
                assert first.status_code == 202
            with psycopg.connect(pair.primary.url("rq_test_replayed"), autocommit=True) as conn:
                assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1  # only the primary has it

            retry = await api.post("/v1/jobs", headers={"Idempotency-Key": "order-1"}, json=CHARGE)
            pair.fail_over()
            acknowledged = [r.json()["id"] for r in (first, retry) if r.status_code == 202]
            with psycopg.connect(url, autocommit=True) as conn:
                kept = {str(row[0]) for row in conn.execute("SELECT id FROM jobs")}
        if sync_standby:
            assert retry.status_code == 503 and acknowledged == [] and kept == set()
        else:
            assert retry.status_code == 202 and retry.json()["replayed"] is True
            assert acknowledged and not set(acknowledged) & kept  # acknowledged, and gone
