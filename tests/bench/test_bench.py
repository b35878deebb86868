"""The benchmark harness: it runs a tiny profile against real processes and writes its files, and its
gate catches a broken run and keeps it out of every average. Speed is reported, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import replace

import psycopg
import pytest

from reliableq import sql
from reliableq.bench import peers
from reliableq.bench.gate import gate
from reliableq.bench.profiles import PROFILES
from reliableq.bench.results import RunResult, Sample, Window, keep_in_window, summarize
from reliableq.bench.run import run_bench
from reliableq.bench.scenarios import ALL_ON, COSTED_MECHANISMS, SCENARIOS
from tests.bench.tiny_runs import FIRST_RUN

CHARGE_CHECK = "at most one charge per job and per idempotency key"


def test_samples_outside_the_window_are_rejected():
    """A sample that started before the window, ended after it, or ran backwards is dropped."""
    window = Window(10.0, 20.0)
    inside, early, late, backwards = Sample(11, 12), Sample(9.5, 10.5), Sample(19, 20.5), Sample(15, 14)
    kept, rejected = keep_in_window([inside, early, late, backwards, Sample(10, 20)], window)
    assert kept == [inside, Sample(10, 20)]
    assert rejected == 3


def test_failed_runs_are_counted_but_never_averaged():
    """The summary's mean comes from passing runs only; the failed one is counted apart."""
    runs = [RunResult("execute", "1x8", {}, "jobs_per_second", {"jobs_per_second": 100.0}, passed=True),
            RunResult("execute", "1x8", {}, "jobs_per_second", {"jobs_per_second": 300.0}, passed=True),
            RunResult("execute", "1x8", {}, "jobs_per_second", {"jobs_per_second": 9999.0}, passed=False)]
    (row,) = summarize(runs)
    assert row["mean"] == 200.0
    assert (row["runs_passed"], row["runs_failed"]) == (2, 1)


async def test_gate_fails_a_database_where_one_job_has_two_charges(databases):
    """Two committed charges for one job (under two keys) break the gate."""
    job_id = uuid.uuid4()
    with psycopg.connect(databases.charge_url, autocommit=True) as conn:
        for key in ("first-key", "second-key"):
            conn.execute(sql.queries("charge")["charge_insert_once"], {
                "idempotency_key": key, "job_id": job_id, "amount_cents": 1250, "currency": "USD",
                "payload_sha256": "x"})
    passed, checks = await gate(databases)
    assert not passed
    assert [c["name"] for c in checks if not c["held"]] == [CHARGE_CHECK]


@pytest.mark.slow
@pytest.mark.timeout(480)  # 240 s beside the whole suite on a slow day (92 s alone)
async def test_tiny_profile_runs_its_first_run_of_scenarios_and_writes_its_files(tmp_path):
    """Every scenario runs against real processes, passes its gate, and the files are written (the standby,
    fairness, pickup and client-cost scenarios in test_bench_second_run.py)."""
    result = await run_bench(PROFILES["tiny"], tmp_path, scenarios=FIRST_RUN, progress=False)
    failed = [(r.scenario, r.point, r.error, [c for c in r.checks if not c["held"]]) for r in result.runs
              if not r.passed]
    assert not failed
    assert {r.scenario for r in result.runs} == set(FIRST_RUN)
    for name in ("results.json", "runs.csv", "baselines.csv", "report.md", "execute.png", "execute_charge.png",
                 "ingest.png", "ingest_batch.png", "ingest_http.png", "retention.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "results.json").read_text())
    tools = {b["tool"] for b in written["baselines"]}
    assert tools >= {"pgbench-insert", "pgbench-claim"}
    for peer in peers.PEERS:  # a row with a rate per point when installed, else one row with a note
        assert tools >= ({peers.tool(peer, mode) for mode in peers.MODES} if peers.installed(peer) else {peer})
        assert all(b["per_second"] for b in written["baselines"] if b["tool"].startswith(f"{peer}-")), peer
    text = (tmp_path / "report.md").read_text()
    assert "## Where the time goes" in text and "## Like for like" in text
    # Every costed mechanism off in turn, all on before each and at the end, each run passing its gate.
    assert [(r.point, r.passed) for r in result.runs if r.scenario == "mechanisms"] == [
        *((point, True) for m in COSTED_MECHANISMS for point in (ALL_ON, f"{m} off")), (ALL_ON, True)]
    assert [r["point"] for r in written["mechanism_costs"]["rows"]] == [ALL_ON, *(f"{m} off" for m in
                                                                                COSTED_MECHANISMS)]
    assert "## What each mechanism costs" in text
    # Each no-op point again first in first out, set beside its fair run only (never beside a peer).
    assert [r.point for r in result.runs if r.scenario == "noop"] == ["1x2", "1x2 FIFO"]
    (noop,) = written["fairness"]["noop"]
    assert noop["point"] == "1x2" and noop["fair_over_fifo"] > 0
    assert all(r["point"] == "1x2" for r in written["ratios"] if r["scenario"] == "noop")
    assert "`noop` at one tenant" in text
    # The API's CPU is measured over the timed window only (after the warm-up): at tiny's sizes that window
    # can be shorter than the kernel's CPU tick (10 ms), so a reading of 0 is a measurement, None is not.
    assert all(r.metrics["api_cpu_ms_per_request"] is not None and r.metrics["api_cpu_ms_per_request"] >= 0
               for r in result.runs if r.scenario == "ingest" and r.params["via"].startswith("http"))


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_profile_runs_the_scenarios_it_leaves_to_full_only_when_named(tmp_path):
    """As quick leaves retention to full: by default a profile runs every scenario but those it leaves out;
    named with --scenarios, one of them runs."""
    profile = replace(PROFILES["tiny"], left_to_full=tuple(name for name in SCENARIOS if name != "idempotency"))
    result = await run_bench(profile, tmp_path / "default", progress=False, baselines=False)
    assert {r.scenario for r in result.runs} == {"idempotency"}
    result = await run_bench(profile, tmp_path / "named", ["dead"], progress=False, baselines=False)
    assert {r.scenario for r in result.runs} == {"dead"}


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_gate_fails_a_kill9_run_without_idempotency_and_leaves_it_out(tmp_path):
    """With idempotency off, the job charged before the SIGKILL is charged again on recovery: the run is
    reported failed, names the broken invariant, and the summary has no mean for it."""
    result = await run_bench(PROFILES["tiny"], tmp_path, ["kill9"], progress=False,
                                   off=["idempotency"], baselines=False)
    (run,) = result.runs
    assert not run.passed
    assert [c["name"] for c in run.checks if not c["held"]] == [CHARGE_CHECK]
    (row,) = result.summary()
    assert row["mean"] is None and row["runs_failed"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "## Failed runs" in report and CHARGE_CHECK in report


def test_cli_refuses_an_unknown_scenario(tmp_path):
    done = subprocess.run([sys.executable, "-m", "reliableq", "bench", "--profile", "tiny", "--out", str(tmp_path),
                           "--scenarios", "execute,warp-drive"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "warp-drive" in done.stderr
