"""Prometheus metrics of the API and of a worker, each in its own registry, and a worker's /metrics server.

Each app or worker gets its own CollectorRegistry, never prometheus_client's global one: several
workers or API apps in one process (tests, the lab's harness) would otherwise collide on the same
metric names. Names follow Prometheus conventions: `reliableq_` prefix, `_total` counters, `_seconds`
histograms. A worker's counters are read from its WorkerStats when scraped, so the worker counts each
thing once, where it always did; only its timings are observed as they happen, into histograms, by
MeteredStats. What this module does not guarantee: counters survive a restart (Prometheus' rate()
handles the reset), or agree across processes (each process counts what it did itself).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from reliableq.servers import bind_listener
from reliableq.tokens import bearer_matches
from reliableq.worker import Worker, WorkerStats

log = logging.getLogger("reliableq.metrics")
# From a millisecond claim to a charge near its timeout: the worker's latencies span four decades.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The server cancels the jobs-by-status count after this long: a scrape must answer well inside
# Prometheus' default 10 s scrape timeout, however large the table grows.
JOB_COUNT_SECONDS = 1.0


class ApiMetrics:
    """The API's: jobs it acknowledged, and the jobs in the database by status (counted per scrape)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.submissions = Counter("reliableq_api_submissions_accepted", "Jobs the API acknowledged with a 202 "
                                   "(a replayed Idempotency-Key counts again)", registry=self.registry)
        self.jobs = Gauge("reliableq_jobs", "Jobs in the queue's database by status, counted at scrape time",
                          ["status"], registry=self.registry)

    def exposition(self, counts: dict[str, int] | None) -> bytes:
        """The text format; `counts`: this scrape's jobs by status, or None when they could not be counted
        (the reliableq_jobs series are then left out, rather than repeating a stale count)."""
        self.jobs.clear()
        for status, jobs in (counts or {}).items():
            self.jobs.labels(status).set(jobs)
        return generate_latest(self.registry)


class MeteredStats(WorkerStats):
    """WorkerStats that also observes each claim, handler run and finalize into a histogram, at the
    moment the worker adds its duration to the matching `*_seconds_total`: the worker's timing code
    stays the one place durations are measured, and a worker without metrics pays nothing."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, what: str) -> Histogram:
            return Histogram(name, what, buckets=LATENCY_BUCKETS, registry=registry)
        # Past our own __setattr__, which reads it. Not a dataclass field: dataclasses.asdict leaves it out.
        object.__setattr__(self, "_histograms", {
            "claim_seconds_total": histogram("reliableq_worker_claim_seconds",
                                             "Seconds per claim transaction, empty claims included"),
            "handler_seconds_total": histogram("reliableq_worker_handler_seconds", "Seconds per handler run"),
            "finalize_seconds_total": histogram("reliableq_worker_finalize_seconds",
                                                "Seconds per finalize (succeed, retry or dead), lost ones included"),
        })
        super().__init__()

    def __setattr__(self, name: str, value: object) -> None:
        histogram = self._histograms.get(name)
        if histogram is not None and name in self.__dict__:  # not the dataclass's first assignment of 0.0
            histogram.observe(value - self.__dict__[name])
        super().__setattr__(name, value)


# WorkerStats field → (counter name, help). The counters are the stats themselves, read at scrape time.
_WORKER_COUNTERS = {
    "claimed": ("reliableq_worker_jobs_claimed", "Jobs this worker claimed"),
    "claimed_with_a_success": ("reliableq_worker_jobs_claimed_with_a_success",
                               "Jobs claimed in the commit of a success whose permit they took"),
    "succeeded": ("reliableq_worker_jobs_succeeded", "Jobs this worker finalized as SUCCEEDED"),
    "retried": ("reliableq_worker_jobs_retried", "Jobs this worker sent back to PENDING for another attempt"),
    "dead": ("reliableq_worker_jobs_dead", "Jobs this worker finalized as DEAD"),
    "lost_finalizes": ("reliableq_worker_finalizes_lost", "Finalizes a fenced update refused: the lease was lost"),
    "lost_renewals": ("reliableq_worker_lease_renewals_lost", "Lease renewals that found the lease lost"),
    "abandoned": ("reliableq_worker_jobs_abandoned", "Handlers cut off at shutdown, left to lease expiry"),
}


class _WorkerCollector(Collector):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        for field, (name, what) in _WORKER_COUNTERS.items():
            yield CounterMetricFamily(name, what, value=getattr(self.worker.stats, field))
        yield GaugeMetricFamily("reliableq_worker_jobs_in_flight", "Jobs this worker is handling now",
                                value=self.worker.in_flight)


class WorkerMetrics:
    """One worker's metrics: give the worker `stats`, then `watch` it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.stats = MeteredStats(self.registry)

    def watch(self, worker: Worker) -> None:
        self.registry.register(_WorkerCollector(worker))


async def serve_worker_metrics(registry: CollectorRegistry, host: str, port: int,
                               token: str | None) -> web.AppRunner:
    """Serve `GET /metrics` on the worker's own event loop (its state is read between its steps, never
    half-updated); with `token`, only to `Authorization: Bearer <token>`. OSError when the port is taken.
    Stop it with `await runner.cleanup()`."""
    async def metrics(request: web.Request) -> web.Response:
        if token and not bearer_matches(request.headers.get("Authorization"), token):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    listener = bind_listener(host, port)
    try:
        await web.SockSite(runner, listener).start()
    except BaseException:
        listener.close()
        await runner.cleanup()
        raise
    return runner
