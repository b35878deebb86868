"""The bench's HTTP load generator (reliableq/bench/http_load.py) against the real API on loopback: answers
read whole, a connection reused for the next request, one per request in flight, a refusal raised with
its status and message, and a server's closing of a connection honoured. The ingest scenario's warm-up:
untimed requests whose jobs are still gated."""

from __future__ import annotations

import asyncio
import os
import types
import uuid

import pytest

from reliableq.api import create_api_app
from reliableq.bench.http_load import HttpRefused, LoopbackHttp
from reliableq.bench.ingest import submit_jobs
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.servers import LoopbackServer
from tests.api.job_steps import count_visible

CHARGE = {"amount_cents": 1250, "currency": "USD"}


@pytest.fixture
async def api_url(databases):
    server = LoopbackServer(create_api_app(databases.queue_url, kinds=STANDARD_KINDS))
    yield await asyncio.to_thread(server.start)
    await asyncio.to_thread(server.stop)


async def test_jobs_and_batches_are_acknowledged_over_connections_kept_for_the_next_request(api_url, databases):
    http = LoopbackHttp(api_url)
    try:
        ids = [uuid.UUID((await http.post_json("/v1/jobs", CHARGE, expect=202))["id"]) for _ in range(5)]
        assert http.idle_connections == 1  # five requests one after another: one connection
        batch = await http.post_json("/v1/jobs/batch", {"jobs": [CHARGE] * 3}, expect=202)
        ids += [uuid.UUID(job["id"]) for job in batch["jobs"]]
        answers = await asyncio.gather(*(http.post_json("/v1/jobs", CHARGE, expect=202) for _ in range(6)))
        ids += [uuid.UUID(answer["id"]) for answer in answers]
        assert http.idle_connections == 6  # six at once: six connections, each kept
    finally:
        await http.aclose()
    assert len(set(ids)) == 14 and await count_visible(databases.queue_url, [str(i) for i in ids]) == 14


async def test_an_answer_not_expected_is_raised_with_its_status_and_message(api_url):
    http = LoopbackHttp(api_url)
    try:
        with pytest.raises(HttpRefused, match=r"/v1/jobs answered 422: .*amount_cents"):
            await http.post_json("/v1/jobs", {"currency": "USD"}, expect=202)
        # The refused request's connection serves the next one.
        assert (await http.post_json("/v1/jobs", CHARGE, expect=202))["status"] == "PENDING"
        assert http.idle_connections == 1
    finally:
        await http.aclose()


async def test_a_connection_the_server_closes_is_not_used_again():
    async def closing_app(scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 202,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"11"),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b'{"id": "x"}'})
    server = LoopbackServer(closing_app)
    url = await asyncio.to_thread(server.start)
    http = LoopbackHttp(url)
    try:
        for _ in range(3):
            assert await http.post_json("/", {}, expect=202) == {"id": "x"}
            assert http.idle_connections == 0
    finally:
        await http.aclose()
        await asyncio.to_thread(server.stop)


def test_only_an_http_address_with_a_port_is_taken():
    for url in ("https://127.0.0.1:8000", "http://127.0.0.1", "127.0.0.1:8000"):
        with pytest.raises(ValueError, match="expected http://host:port"):
            LoopbackHttp(url)


async def test_a_warm_up_is_acknowledged_and_stored_but_not_timed(api_url, databases):
    """3 clients warm up with 4 requests each, then 10 timed: all 22 jobs are acknowledged (so the gate
    checks them all), the samples, the window and the rate are the 10 timed ones', and the CPU watched is
    this process's over that window only."""
    submitted = await submit_jobs(types.SimpleNamespace(api_url=api_url), "http", 3, 10, warm_up=4,
                                  cpu_of=os.getpid())
    assert len(submitted.acknowledged) == 22 and len(set(submitted.acknowledged)) == 22
    assert await count_visible(databases.queue_url, [str(i) for i in submitted.acknowledged]) == 22
    assert submitted.timed_jobs == len(submitted.samples) == 10
    assert all(submitted.window.holds(sample) for sample in submitted.samples)
    assert submitted.jobs_per_second == 10 / submitted.window.seconds
    assert submitted.cpu_seconds is not None and 0 <= submitted.cpu_seconds <= 2 * submitted.window.seconds
