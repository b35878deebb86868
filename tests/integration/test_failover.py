"""The queue over a primary and a streaming standby (reliableq/standby.py), through one multi-host URL:
after the primary is SIGKILLed and the standby promoted, a `reliableq api` process and a `reliableq
worker` process carry on against the promoted server without a restart."""

from __future__ import annotations

import uuid

import pytest

from reliableq import scratch
from reliableq.db import Databases
from reliableq.lab.harness import local_system
from reliableq.lab.waiting import wait_until
from reliableq.standby import StandbyPair
from tests.integration.ledger_counts import counts_by_job

pytestmark = pytest.mark.slow


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
