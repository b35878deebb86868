"""The report sets like beside like, on constructed results (no database): each point of ours beside the
peers doing the same kind of work and pgbench's bound at the same client count, never beside another kind;
our charged jobs and our HTTP submission on their own; and where a peer is ahead, it says so."""

from __future__ import annotations

from reliableq.bench import tables
from reliableq.bench.charts import line_charts
from reliableq.bench.markdown import markdown
from reliableq.bench.results import Baseline, BenchResult, RunResult

PEER_TOOLS = ("enqueue", "enqueue-batch", "execute")


def _run(scenario: str, point: str, params: dict, value: float, headline: str = "jobs_per_second") -> RunResult:
    return RunResult(scenario, point, params, headline, {headline: value}, passed=True)


def _result(peer_rate: float = 100.0) -> BenchResult:
    """Ours at every kind at 4 clients (no-op jobs fair, and first in first out as their twin), pgbench and
    both peers at every tool at 4 clients (and one at 16)."""
    runs = [_run("ingest", f"{via} c=4", {"clients": 4, "via": via}, rate)
            for via, rate in (("http", 50.0), ("http-batch", 500.0), ("direct", 200.0), ("direct-batch", 1000.0))]
    runs += [_run("noop", "1x4", {"workers": 1, "permits": 4, "charge_args": [], "fairness": True}, 300.0),
             _run("noop", "1x4 FIFO", {"workers": 1, "permits": 4, "charge_args": [], "fairness": False,
                                       "fairness_twin_of": "1x4"}, 330.0),
             _run("execute", "1x4", {"workers": 1, "permits": 4, "charge_args": []}, 150.0),
             _run("execute", "2x2", {"workers": 2, "permits": 2, "charge_args": []}, 160.0),
             _run("latency", "1x4", {"workers": 1, "permits": 4, "charge_args": ["--latency", "0.01"]}, 90.0)]
    runs += [RunResult("pickup", queue, {"queue": queue, "jobs": 10}, "pickup_p50_ms",
                       {"pickup_p50_ms": p50, "pickup_p99_ms": p99}, passed=True)
             for queue, p50, p99 in (("reliableq", 5.0, 20.0), ("pgqueuer", 900.0, 1000.0),
                                     ("procrastinate", 7.0, 15.0))]
    baselines = [Baseline("pgbench-insert", 4, 400.0), Baseline("pgbench-claim", 4, 600.0)]
    baselines += [Baseline(f"{peer}-{tool}", 4, peer_rate) for peer in ("pgqueuer", "procrastinate")
                  for tool in PEER_TOOLS]
    baselines.append(Baseline("pgqueuer-enqueue-batch", 16, 99999.0))  # another client count: never paired
    return BenchResult("tiny", 0, "", runs, baselines, {"cpus": 2})


def test_each_kind_of_ours_is_set_beside_the_same_kind_only():
    pairs = {(r["point"], r["baseline"]) for r in tables.ratios(_result())}
    assert pairs == {
        ("direct c=4", "pgbench-insert c=4"), ("direct c=4", "pgqueuer-enqueue c=4"),
        ("direct c=4", "procrastinate-enqueue c=4"),
        ("direct-batch c=4", "pgqueuer-enqueue-batch c=4"), ("direct-batch c=4", "procrastinate-enqueue-batch c=4"),
        ("http c=4", "pgbench-insert c=4"),
        ("1x4", "pgbench-claim c=4"), ("1x4", "pgqueuer-execute c=4"), ("1x4", "procrastinate-execute c=4"),
    }  # http-batch beside nothing; charged jobs (execute, latency) beside no peer and no pgbench


def test_a_row_says_which_is_ahead():
    rows = {(r["point"], r["baseline"]): r for r in tables.ratios(_result(peer_rate=400.0))}
    assert (rows[("direct c=4", "pgqueuer-enqueue c=4")]["ratio"], rows[("direct c=4", "pgqueuer-enqueue c=4")]
            ["ahead"]) == (0.5, "pgqueuer")
    assert rows[("direct-batch c=4", "procrastinate-enqueue-batch c=4")]["ahead"] == "ours"
    assert rows[("1x4", "pgbench-claim c=4")]["ahead"] == "pgbench"


def test_the_report_says_plainly_where_a_peer_is_ahead():
    """Peers at 400/s: ahead of our one-per-call enqueue (200) and no-op jobs (300), behind our batch
    (1000); procrastinate's pickup p99 is below ours. With slow peers, nowhere."""
    ahead = tables.peers_ahead(_result(peer_rate=400.0))
    assert ahead == [
        "- enqueue, one job per call, in-process, c=4: pgqueuer-enqueue 400 jobs/s, ours 200 (pgqueuer 2.00x ahead).",
        "- enqueue, one job per call, in-process, c=4: procrastinate-enqueue 400 jobs/s, ours 200 "
        "(procrastinate 2.00x ahead).",
        "- no-op jobs, one worker process, c=4: pgqueuer-execute 400 jobs/s, ours 300 (pgqueuer 1.33x ahead).",
        "- no-op jobs, one worker process, c=4: procrastinate-execute 400 jobs/s, ours 300 "
        "(procrastinate 1.33x ahead).",
        "- pickup p99: procrastinate 15.0 ms, ours 20.0 ms (procrastinate lower).",
    ]
    assert "**Where a peer is ahead:**\n- enqueue" in markdown(_result(peer_rate=400.0), [])
    calm = _result(peer_rate=10.0)
    calm.runs = [r for r in calm.runs if r.scenario != "pickup"]
    assert tables.peers_ahead(calm) == []
    assert "**Where a peer is ahead:** nowhere in this run" in markdown(calm, [])


def test_a_no_op_point_and_its_fifo_twin_are_set_beside_each_other_only():
    """The twin (fairness off) is in no peer's or pgbench's row, chart or charged share (the tests above);
    the fairness section sets it beside its own point."""
    (row,) = tables.fair_noop_rows(_result())
    assert (row["point"], row["fifo_jobs_per_second"], row["fair_jobs_per_second"]) == ("1x4", 330.0, 300.0)
    assert row["fair_over_fifo"] == 300.0 / 330.0
    text = markdown(_result(), [])
    assert "## What a fair claim costs, and what it buys" in text and "| 1x4 | 330 | 300 | 0.91 |" in text


def test_the_quiet_tenant_figures_are_set_fair_beside_fifo():
    result = _result()
    result.runs += [RunResult("quiet-tenant", point, {"fairness": fair, "flood_jobs": 5000, "quiet_jobs": 20,
                                                      "workers": 2, "permits": 4}, "pickup_p50_ms",
                              {"pickup_p50_ms": p50, "pickup_p99_ms": p99, "claims_ahead_max": ahead,
                               "jobs_per_second": 800.0, "fair_bound_claims": 8}, passed=True)
                    for point, fair, p50, p99, ahead in (("FIFO", False, 4000.0, 6000.0, 1200), ("fair", True, 4.0,
                                                                                                  12.0, 1))]
    quiet = tables.fairness_summary(result)["quiet_tenant"]
    assert (quiet["flood_jobs"], quiet["fair_bound_claims"]) == (5000, 8)
    rows = {r["metric"]: r for r in quiet["rows"]}
    assert (rows["pickup_p50_ms"]["fair_over_fifo"], rows["pickup_p99_ms"]["fair_over_fifo"]) == (0.001, 0.002)
    text = markdown(result, [])
    assert "| quiet job's pickup p50, ms | 4,000 | 4 | 0.00 |" in text
    assert "| most claims ahead of a quiet job | 1,200 | 1 | 0.00 |" in text


def test_charged_jobs_stand_on_their_own_beside_our_no_op_jobs():
    rows = tables.charged_rows(_result())
    assert [(r["scenario"], r["point"], r["noop_per_second"], r["share_of_noop"]) for r in rows] == [
        ("execute", "1x4", 300.0, 0.5), ("execute", "2x2", None, None), ("latency", "1x4", 300.0, 0.3)]


def test_a_charged_point_says_what_its_cpu_alone_allows_on_the_machines_cores():
    result = _result()
    charged = next(r for r in result.runs if (r.scenario, r.point) == ("execute", "1x4"))
    charged.metrics |= {"worker_cpu_ms_per_job": 1.5, "charge_cpu_ms_per_job": 0.5}
    row = next(r for r in tables.charged_rows(result) if r["point"] == "1x4" and r["scenario"] == "execute")
    assert row["cpu_bound_per_second"] == 1000.0  # 2 cores / 2 ms of CPU per job
    assert "| execute | 1x4 | – | 150 | 300 | 0.50 | 1.5 | 0.5 | – | 1,000 |" in markdown(result, [])
    charged.metrics["server_cpu_ms_per_job"] = 2.0  # the embedded server's, when it is on the same cores
    row = next(r for r in tables.charged_rows(result) if r["point"] == "1x4" and r["scenario"] == "execute")
    assert row["cpu_bound_per_second"] == 500.0
    assert all(r["cpu_bound_per_second"] is None for r in tables.charged_rows(_result()))  # no CPU measured


def test_each_chart_holds_one_kind_of_work():
    charts = {c.name: [s.label for s in c.series] for c in line_charts(_result())}
    assert charts == {
        "ingest.png": ["ours (Queue.submit)", "pgqueuer", "procrastinate", "pgbench one-row insert"],
        "ingest_batch.png": ["ours (Queue.submit_many)", "pgqueuer", "procrastinate"],
        "ingest_http.png": ["one job per request", "batches of 100 per request"],
        "execute.png": ["ours", "pgqueuer", "procrastinate", "pgbench claim+finalize"],
        "execute_charge.png": ["one process, instant charges", "several processes",
                               "one process, charges with latency"],
    }
    batch = next(c for c in line_charts(_result()) if c.name == "ingest_batch.png")
    assert [(s.xs, s.ys) for s in batch.series] == [([4], [1000.0]), ([4, 16], [100.0, 99999.0]), ([4], [100.0])]


def test_the_pickup_table_has_p50_and_p99_per_queue():
    rows = tables.pickup_rows(_result())
    assert [(r["queue"], r["p50_ms"], r["p99_ms"]) for r in rows] == [
        ("reliableq", 5.0, 20.0), ("pgqueuer", 900.0, 1000.0), ("procrastinate", 7.0, 15.0)]
    text = markdown(_result(), [])
    assert "## Pickup latency" in text and "| procrastinate | 7 | 15 | 10 |  |" in text


def test_a_failed_pickup_run_says_why_it_has_no_figures():
    result = _result()
    (run,) = [r for r in result.runs if r.point == "pgqueuer"]
    run.passed, run.metrics = False, {"pickup_p50_ms": None, "pickup_p99_ms": None}
    run.checks = [{"name": "every job's handler ran once", "held": False, "violations": 1, "waived": "",
                   "note": "did not finish within 520 s"}]
    assert "| pgqueuer | – | – | 10 | did not finish within 520 s |" in markdown(result, [])
