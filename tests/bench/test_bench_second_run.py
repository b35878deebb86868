"""The benchmark's tiny profile, its second run (tests/bench/tiny_runs.py): a standby's cost and a failover, the
fair claim's cost and a quiet tenant beside a flood, pickup latency, and where a job's and a submission's time
goes at one client; each scenario against real processes, passing its gate."""

from __future__ import annotations

import json

import pytest

from reliableq.bench.fairness import QUIET_TENANT
from reliableq.bench.profiles import PROFILES
from reliableq.bench.run import run_bench
from reliableq.bench.scenarios import SCENARIOS
from reliableq.bench.standby import POINTS as STANDBY_POINTS
from tests.bench.tiny_runs import FIRST_RUN, SECOND_RUN


def test_the_two_runs_hold_every_scenario_once():
    assert sorted(FIRST_RUN + SECOND_RUN) == sorted(SCENARIOS)


@pytest.mark.slow
@pytest.mark.timeout(480)  # 87 s beside the whole suite on a slow day (60 s alone)
async def test_tiny_profile_runs_the_standby_fairness_pickup_and_client_cost_scenarios(tmp_path):
    result = await run_bench(PROFILES["tiny"], tmp_path, scenarios=SECOND_RUN, progress=False)
    failed = [(r.scenario, r.point, r.error, [c for c in r.checks if not c["held"]]) for r in result.runs
              if not r.passed]
    assert not failed
    assert {r.scenario for r in result.runs} == set(SECOND_RUN)
    assert (tmp_path / "pickup.png").stat().st_size > 0
    written = json.loads((tmp_path / "results.json").read_text())
    text = (tmp_path / "report.md").read_text()
    assert "## Pickup latency" in text
    # A synchronous, an asynchronous and no standby, then a failover with nothing acknowledged lost.
    assert [r.point for r in result.runs if r.scenario == "standby"] == list(STANDBY_POINTS)
    standby = written["standby"]
    assert [r["replication"] for r in standby["rows"]] == ["synchronous", "asynchronous", "none"]
    assert all(r["execute_jobs_per_second"] and r["ingest_jobs_per_second"] for r in standby["rows"])
    assert standby["failover"]["lost"] == 0 and standby["failover"]["first_claim_after_death_seconds"] > 0
    assert "## What a standby costs, and a failover's gap" in text
    # The fair claim's cost beside the FIFO claim's, over the same backlog, at each number of tenants; every
    # fair claim took every tenant's first job before anyone's second (the scenario's gate).
    assert [r.point for r in result.runs if r.scenario == "fairness"] == ["1 tenants", "10 tenants", "1000 tenants"]
    assert "## What a fair claim costs, and what it buys" in text
    fairness = written["fairness"]
    assert [r["tenants"] for r in fairness["claim"]] == [1, 10, 1000]
    # A quiet tenant beside a flood, FIFO then fair, on the same seeded schedule: every quiet job claimed, each
    # stored while the flood still waited, and (fair) each within the fair bound of claims: the gate held.
    quiet_runs = {r.point: r for r in result.runs if r.scenario == QUIET_TENANT}
    assert list(quiet_runs) == ["FIFO", "fair"]
    for point, run in quiet_runs.items():
        gated = {c["name"]: c["held"] for c in run.checks}
        assert gated["every quiet job was claimed"] and gated["every job is SUCCEEDED or DEAD"], point
        assert gated["every quiet job was stored while the flooding tenant still had jobs waiting"], point
        assert run.metrics["quiet_claimed"] == PROFILES["tiny"].quiet_jobs, point
    assert [held for name, held in ((c["name"], c["held"]) for c in quiet_runs["fair"].checks)
            if name.startswith("each quiet job was claimed within")] == [True]
    assert not any(c["name"].startswith("each quiet job was claimed within") for c in quiet_runs["FIFO"].checks)
    quiet = {r["metric"]: r for r in fairness["quiet_tenant"]["rows"]}
    assert quiet["pickup_p50_ms"]["fifo"] > 0 and quiet["pickup_p99_ms"]["fair"] > 0
    assert quiet["pickup_p50_ms"]["fair_over_fifo"] is not None
    assert "`quiet-tenant`: a backlog of" in text
    # Where a job's and a submission's time goes at one client: each process profiled, its round trips counted.
    costs = {r.point: r.metrics for r in result.runs if r.scenario == "client-cost"}
    assert list(costs) == ["worker c=1", "api c=1"]
    assert 1 <= costs["worker c=1"]["round_trips_per_job"] < 10 and costs["worker c=1"]["worker_cpu_ms_per_job"] > 0
    assert 1 <= costs["api c=1"]["round_trips_per_request"] < 5 and costs["api c=1"]["api_cpu_ms_per_request"] > 0
    for process in ("worker", "api"):
        assert "round trips" in (tmp_path / "profiles" / f"{process}-c1-0.txt").read_text()
        assert (tmp_path / "profiles" / f"{process}-c1-0.pstats").stat().st_size > 0
    assert "client-cost worker c=1: per no-op job" in text and "client-cost api c=1: per submission" in text
