"""The API's /metrics over real HTTP on loopback and a real PostgreSQL: behind the token like the other
routes, a registry per app (two apps in one process count apart), and a jobs count bounded by a
statement timeout, so a table nobody can read in time costs the scrape its job counts, never its answer."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.metrics import JOB_COUNT_SECONDS
from reliableq.queue import Queue
from tests.conftest import serve

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_each_app_counts_what_it_acknowledged_in_its_own_registry(databases):
    """Two apps in one process over one database: each counts its own 202s (a batch counts its jobs);
    both see every job in reliableq_jobs. The second has a token: its /metrics is 401 without it, as
    every route but the health probes (a scraper sends it as any client does). One shared registry
    would refuse the second app's counter."""
    token = {"Authorization": "Bearer s3cret"}
    async with (serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as first,
                serve(create_api_app(databases.queue_url, api_token="s3cret", kinds=STANDARD_KINDS)) as second):
        assert (await first.post("/v1/jobs", json={"amount_cents": 100})).status_code == 202
        batch = {"jobs": [{"amount_cents": 200}, {"amount_cents": 300}]}
        assert (await second.post("/v1/jobs/batch", json=batch, headers=token)).status_code == 202
        assert (await second.post("/v1/jobs", json={"amount_cents": -1}, headers=token)).status_code == 422
        refused = await second.get("/metrics")
        scraped = [samples((await first.get("/metrics")).text),
                   samples((await second.get("/metrics", headers=token)).text)]
    assert refused.status_code == 401 and refused.json() == {"error": "missing or wrong bearer token"}
    assert [s[("reliableq_api_submissions_accepted_total", ())] for s in scraped] == [1, 2]  # the 422 is not
    assert all(s[("reliableq_jobs", (("status", "PENDING"),))] == 3 for s in scraped)
    # Why not the global registry: it holds one metric per name per process.
    shared = CollectorRegistry()
    Counter("reliableq_api_submissions_accepted", "first app", registry=shared)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("reliableq_api_submissions_accepted", "second app", registry=shared)


async def test_a_locked_jobs_table_costs_the_scrape_its_counts_not_its_answer(databases, pool):
    """While another session holds the jobs table locked, an unbounded count waits as long as the lock
    is held; /metrics answers within its bound, without the reliableq_jobs series, the rest intact."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as api:
        assert (await api.post("/v1/jobs", json={"amount_cents": 100})).status_code == 202
        async with await psycopg.AsyncConnection.connect(databases.queue_url) as holder:
            await holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # until this transaction ends
            unbounded = asyncio.create_task(Queue(pool).counts())
            started = time.monotonic()
            response = await api.get("/metrics")
            took = time.monotonic() - started
            assert not unbounded.done()  # still waiting for the lock
            await holder.rollback()
        assert (await unbounded)["PENDING"] == 1  # the lock gone, the same count answers
        after = samples((await api.get("/metrics")).text)
    scraped = samples(response.text)
    assert response.status_code == 200
    assert not any(name == "reliableq_jobs" for name, _ in scraped)
    assert scraped[("reliableq_api_submissions_accepted_total", ())] == 1
    assert took < JOB_COUNT_SECONDS + 2, took  # generous: the bound is the server's statement timeout
    assert after[("reliableq_jobs", (("status", "PENDING"),))] == 1
