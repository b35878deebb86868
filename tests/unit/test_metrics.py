"""A worker's metrics without a database: MeteredStats observes each timing the worker adds and keeps its
histograms out of the status report; the /metrics server on loopback reads the live worker, answers
only the bearer token when it has one, and two workers in one process keep apart."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from reliableq.cli.main import main
from reliableq.handlers import HandlerRegistry
from reliableq.metrics import WorkerMetrics, serve_worker_metrics
from reliableq.queue import Queue
from reliableq.servers import free_port
from reliableq.worker import Worker, WorkerStats

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def idle_worker(metrics: WorkerMetrics) -> Worker:
    """A worker never run: its queue has no pool, and nothing here asks it to claim."""
    worker = Worker(Queue(None), HandlerRegistry(), stats=metrics.stats)
    metrics.watch(worker)
    return worker


def _text(metrics: WorkerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_metered_stats_observe_what_the_worker_adds_and_nothing_at_creation():
    """Each `+=` to a *_seconds_total is one observation of the amount added; the dataclass's initial
    0.0 is none; counters are plain stats; the status report holds only WorkerStats' fields."""
    metrics = WorkerMetrics()
    stats = metrics.stats
    stats.handler_seconds_total += 0.003
    stats.handler_seconds_total += 0.2
    stats.finalize_seconds_total += 0.0015
    stats.claimed += 2
    scraped = samples(_text(metrics))
    assert scraped[("reliableq_worker_handler_seconds_count", ())] == 2
    assert scraped[("reliableq_worker_handler_seconds_sum", ())] == pytest.approx(0.203)
    assert scraped[("reliableq_worker_handler_seconds_bucket", (("le", "0.005"),))] == 1
    assert scraped[("reliableq_worker_finalize_seconds_count", ())] == 1
    assert scraped[("reliableq_worker_claim_seconds_count", ())] == 0
    report = dataclasses.asdict(stats)
    assert set(report) == {field.name for field in dataclasses.fields(WorkerStats)}
    assert report["claimed"] == 2


async def test_the_server_reads_the_live_worker_and_two_workers_keep_apart():
    """Two workers in one process, each its own registry: a scrape reads each one's stats as they are now."""
    first, second = WorkerMetrics(), WorkerMetrics()
    busy, idle = idle_worker(first), idle_worker(second)
    port = free_port()
    server = await serve_worker_metrics(first.registry, "127.0.0.1", port, token=None)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            busy.stats.claimed += 3
            busy.stats.lost_renewals += 1
            response = await http.get("/metrics")
            busy.stats.succeeded += 2
            later = samples((await http.get("/metrics")).text)
            missing = await http.get("/nothing")
    finally:
        await server.cleanup()
    assert response.headers["content-type"].startswith("text/plain")
    scraped = samples(response.text)
    assert scraped[("reliableq_worker_jobs_claimed_total", ())] == 3
    assert scraped[("reliableq_worker_lease_renewals_lost_total", ())] == 1
    assert scraped[("reliableq_worker_jobs_succeeded_total", ())] == 0
    assert scraped[("reliableq_worker_jobs_in_flight", ())] == 0
    assert later[("reliableq_worker_jobs_succeeded_total", ())] == 2
    assert samples(_text(second))[("reliableq_worker_jobs_claimed_total", ())] == 0 == idle.stats.claimed
    assert missing.status_code == 404


async def test_with_a_token_only_its_bearer_is_answered():
    """--metrics-token: no header or a wrong one is a 401 with a one-line JSON error; the right one, 200."""
    metrics = WorkerMetrics()
    idle_worker(metrics)
    port = free_port()
    server = await serve_worker_metrics(metrics.registry, "127.0.0.1", port, token="s3cret")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            answers = [await http.get("/metrics", headers=headers) for headers in
                       ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret"})]
    finally:
        await server.cleanup()
    assert [a.status_code for a in answers] == [401, 401, 200]
    assert answers[0].json() == {"error": "missing or wrong bearer token"}


async def test_a_taken_port_is_an_oserror_and_leaves_nothing_bound():
    """The CLI turns it into a one-line error; nothing is left listening or half set up."""
    metrics = WorkerMetrics()
    port = free_port()
    server = await serve_worker_metrics(metrics.registry, "127.0.0.1", port, token=None)
    try:
        with pytest.raises(OSError):
            await serve_worker_metrics(metrics.registry, "127.0.0.1", port, token=None)
    finally:
        await server.cleanup()


@pytest.mark.parametrize(("args", "error"), [
    pytest.param(["--metrics-port", "9100", "--metrics-host", "0.0.0.0"],
                 "binding 0.0.0.0 exposes the worker's metrics beyond this machine: set --metrics-token or "
                 "RELIABLEQ_API_TOKEN", id="beyond-loopback-without-token"),
    pytest.param(["--metrics-host", "127.0.0.1"], "--metrics-host needs --metrics-port", id="host-without-port"),
])
def test_worker_metrics_options_are_refused_in_one_line_before_the_database(args, error, capsys, monkeypatch):
    """As the API: beyond loopback only behind a token. Refused before any connection is tried."""
    monkeypatch.delenv("RELIABLEQ_API_TOKEN", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nothing")
    assert main(["worker", *args]) == 2
    assert capsys.readouterr().err == f"reliableq: error: {error}\n"
