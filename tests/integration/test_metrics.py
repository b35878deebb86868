"""Prometheus metrics scraped from real processes: `reliableq api`, `reliableq charge-service` and
`reliableq worker --metrics-port` over the test's databases, a few charges run through them (some
retried, some DEAD, from charge failures), each /metrics fetched over loopback HTTP and parsed
with prometheus_client's own parser. What each counts must equal what PostgreSQL recorded."""

from __future__ import annotations

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.charge.service import ChargeFaults
from reliableq.lab import processes
from reliableq.lab.harness import local_system
from reliableq.servers import free_port

pytestmark = pytest.mark.slow

JOBS, DECLINED = 16, 3
WORKER = "metered-worker"
# Half the charges answered 503, then retried (a job's second 503 makes it DEAD: two attempts each). The
# draws are seeded per job id, which the API picks at random: with 16 jobs, none retried is a 1 in 65,536
# chance. DECLINED jobs ask for more than the service ever charges: DEAD whatever the draws.
CHARGE_FAILURES = ("--transient-rate", "0.5", "--seed", "5")
DECLINED_CENTS = ChargeFaults().decline_over_cents + 1


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape, through prometheus_client's parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(http: httpx.AsyncClient, url: str) -> dict:
    response = await http.get(f"{url}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def outcomes_of(databases, worker_id: str) -> dict[str, int]:
    """How the worker's claims ended, from job_attempts (one row per claim)."""
    async with await psycopg.AsyncConnection.connect(databases.queue_url, row_factory=dict_row) as conn:
        rows = await (await conn.execute(sql.queries("lab_queue")["job_attempt_outcomes_by_worker"])).fetchall()
    return {row["outcome"]: row["claims"] for row in rows if row["worker_id"] == worker_id}


async def test_scraped_counters_equal_what_the_database_recorded(databases, tmp_path):
    """API: jobs acknowledged = jobs stored, and reliableq_jobs by status = the database's count. Worker:
    claimed = its attempts, succeeded / retried / dead = their outcomes, no lost finalizes or renewals,
    nothing in flight once settled, and a histogram observation per claim, handler run and finalize."""
    async with local_system(databases=databases, servers="processes", charge_args=CHARGE_FAILURES,
                            worker_pool_size=0, logs=tmp_path) as system:
        port = free_port()
        worker = system.spawn_worker(WORKER, 10.0, "--concurrency", "4", "--seed", "5",
                                     "--metrics-port", str(port))
        await processes.wait_running(worker, 30)
        worker_url = f"http://127.0.0.1:{port}"
        before = await scrape(system.http, worker_url)
        assert before[("reliableq_worker_jobs_claimed_total", ())] == 0

        job_ids = [await system.submit_http(DECLINED_CENTS if n < DECLINED else 100 + n, max_attempts=2)
                   for n in range(JOBS)]
        await system.wait_settled(job_ids, timeout=60)
        api, metered = await scrape(system.http, system.api_url), await scrape(system.http, worker_url)
        # A second worker on the same metrics port: one line saying so, exit 2, and it claims nothing.
        clash = processes.spawn_cli(databases, "clash", "worker", "--charge-url", system.charge_url,
                                    "--metrics-port", str(port))
        assert await processes.wait_exit(clash, 30) == 2
        statuses = await system.queue.counts()
        outcomes = await outcomes_of(databases, WORKER)
        stopped = await system.stop_worker_processes()

    assert clash.output().strip() == (f"reliableq: error: cannot listen on 127.0.0.1:{port}: Address already in "
                                      "use; choose another --metrics-port")
    assert api[("reliableq_api_submissions_accepted_total", ())] == JOBS == sum(statuses.values())
    for status, jobs in statuses.items():
        assert api[("reliableq_jobs", (("status", status),))] == jobs
    # The failures did what they are there for: retries and DEAD jobs were counted, and some succeeded.
    assert outcomes.get("retried", 0) > 0 and outcomes.get("succeeded", 0) > 0, outcomes
    assert outcomes.get("dead", 0) >= DECLINED, outcomes
    expected = {"jobs_claimed": sum(outcomes.values()), "jobs_succeeded": outcomes.get("succeeded", 0),
                "jobs_retried": outcomes.get("retried", 0), "jobs_dead": outcomes.get("dead", 0),
                "finalizes_lost": 0, "lease_renewals_lost": 0}
    assert {name: metered[(f"reliableq_worker_{name}_total", ())] for name in expected} == expected
    assert statuses["SUCCEEDED"] == expected["jobs_succeeded"] and statuses["DEAD"] == expected["jobs_dead"]
    assert metered[("reliableq_worker_jobs_in_flight", ())] == 0
    assert metered[("reliableq_worker_handler_seconds_count", ())] == expected["jobs_claimed"]
    assert metered[("reliableq_worker_finalize_seconds_count", ())] == expected["jobs_claimed"]
    assert metered[("reliableq_worker_claim_seconds_count", ())] >= 1
    assert metered[("reliableq_worker_handler_seconds_bucket", (("le", "+Inf"),))] == expected["jobs_claimed"]
    # The status file the worker wrote as it stopped agrees, and holds no histogram.
    (report,) = stopped
    assert report["claimed"] == expected["jobs_claimed"] and "_histograms" not in report
