"""What notebook 13 shows of the benchmark, with no database: the learner's own newest run, else the
reference shipped with the notebooks (labelled with its machine and date); the mechanism-cost chart; and
the shipped reference itself, read from the repository so it cannot drift from what the notebook needs."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from reliableq.bench import report, tables
from reliableq.bench.markdown import markdown
from reliableq.bench.results import BenchResult, RunResult
from reliableq.bench.scenarios import ALL_ON, COSTED_MECHANISMS, UNCOSTED_MECHANISMS
from reliableq.lab import notebook as nb
from reliableq.lab import places

CLONE = Path(__file__).resolve().parents[2]
RECLAIMED = "no job was reclaimed while its lease was still running"
FINALIZED = "no stale owner finalized a job; each job was finalized once"
CHARGE_CHECK = "at most one charge per job and per idempotency key"
ENVIRONMENT = {"cpus": 2, "cpu_model": "Test CPU @ 2.0GHz", "postgresql": "18.1", "load_average_before": 0.5,
               "load_average_after": 1.5, "note": "shared with a test run"}


@pytest.fixture(autouse=True)
def _no_chosen_results(monkeypatch):
    # notebooks/conftest.py points the whole test session at the shipped reference; these tests choose.
    monkeypatch.delenv(places.BENCH_RESULTS_VARIABLE, raising=False)


def _mechanism_run(point: str, off: str | None, rate: float | None, checks: list[dict] = (),
                   claims: float = 1.0, waived: dict[str, str] | None = None) -> RunResult:
    return RunResult("mechanisms", point, {"off": off, "jobs": 1000, "workers": 2, "permits": 4,
                                           "waived": waived or {}}, "jobs_per_second",
                     {"jobs_per_second": rate, "claims_per_job": claims}, list(checks), passed=rate is not None)


def _check(name: str, held: bool, waived: str = "") -> dict:
    return {"name": name, "held": held, "violations": 0 if held else 3, "note": "", "waived": waived,
            "examples": []}


def _costed_result() -> BenchResult:
    """All on at 100 and 120 jobs/s (first and last), skip_locked off at 55 with one of its two waivers used
    (by 3 jobs), leases off at 110, idempotency off failed on a double charge."""
    runs = [_mechanism_run(ALL_ON, None, 100.0),
            _mechanism_run("skip_locked off", "skip_locked", 55.0, [_check(RECLAIMED, False, "by design"),
                                                                   _check(FINALIZED, True, "by design too")],
                           1.4, waived={RECLAIMED: "by design", FINALIZED: "by design too"}),
            _mechanism_run("leases off", "leases", 110.0, [_check(RECLAIMED, True)]),
            _mechanism_run("idempotency off", "idempotency", None, [_check(CHARGE_CHECK, False)]),
            _mechanism_run(ALL_ON, None, 120.0)]
    return BenchResult("quick", 0, "2026-01-02T03:04:05+0000", runs, [], ENVIRONMENT)


def test_each_mechanism_is_set_beside_the_mean_of_the_all_on_runs():
    costs = tables.mechanism_costs(_costed_result())
    assert costs["all_on_jobs_per_second"] == [100.0, 120.0]
    rows = {r["point"]: r for r in costs["rows"]}
    assert list(rows) == [ALL_ON, "skip_locked off", "leases off", "idempotency off"]
    assert (rows[ALL_ON]["jobs_per_second"], rows[ALL_ON]["ratio_to_all_on"]) == (110.0, 1.0)
    assert (rows["skip_locked off"]["ratio_to_all_on"], rows["skip_locked off"]["claims_per_job"]) == (0.5, 1.4)
    assert rows["skip_locked off"]["waived"] == {RECLAIMED: "by design", FINALIZED: "by design too"}
    assert rows["skip_locked off"]["waived_broken"] == {RECLAIMED: 3}
    assert rows["idempotency off"]["jobs_per_second"] is None and rows["idempotency off"]["broken"] == [CHARGE_CHECK]
    assert set(costs["not_measured"]) == {"commit_before_ack", "backoff", "dead"}
    assert tables.mechanism_costs(BenchResult("quick", 0, "", [], [], {})) is None


def test_the_report_tables_the_costs_and_says_which_mechanisms_are_not_switched_off():
    text = markdown(_costed_result(), [])
    assert "## What each mechanism costs" in text
    assert (f"| skip_locked off | 55 | 0.50 | 1.4 | passed, waived: {RECLAIMED} (jobs that broke it: 3); "
            f"{FINALIZED} (jobs that broke it: 0) |") in text
    assert "| idempotency off | – | – | – | failed: " + CHARGE_CHECK + " |" in text  # nothing of a failed run
    assert "Not switched off here: commit_before_ack: acts on the API's submissions" in text


def test_the_chart_has_a_bar_per_point_names_what_broke_and_says_what_was_waived():
    results = {"mechanism_costs": tables.mechanism_costs(_costed_result()), "environment": ENVIRONMENT}
    fig = nb.plot_mechanism_costs(json.loads(json.dumps(results)))  # as read back from results.json
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [ALL_ON, "skip_locked off", "leases off",
                                                           "idempotency off"]
    assert [round(bar.get_width()) for bar in ax.patches if bar.get_height() < 1] == [110, 55, 110, 0]
    labels = [t.get_text() for t in ax.texts]
    assert " 55 jobs/s, 0.50x all on, 1.40 claims per job" in labels
    assert " failed: " + CHARGE_CHECK in labels
    caption = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert f"with skip_locked off, '{RECLAIMED}' (by design; jobs that broke it: 3)" in caption
    assert "Test CPU @ 2.0GHz" in caption
    assert all(name in caption for name in UNCOSTED_MECHANISMS)
    plt.close(fig)
    assert nb.plot_mechanism_costs({"ratios": []}) is None  # a run from before the scenario existed


def _results_folder(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"profile": "quick", "seed": 0, "seconds": 287.4,
                                                     "started_at": "2026-01-02T03:04:05+0000",
                                                     "environment": ENVIRONMENT} | fields))
    return folder


def test_the_notebook_shows_the_learners_own_run_else_the_shipped_reference(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")  # a clone: its own runs are in its results/bench
    reference = _results_folder(tmp_path / "notebooks" / "bench_reference", reference=True)
    assert places.bench_results(tmp_path) == reference
    own = _results_folder(tmp_path / "results" / "bench" / "20260102-030405")
    (tmp_path / "results" / "bench" / "latest").symlink_to(own.name)
    assert places.bench_results(tmp_path) == tmp_path / "results" / "bench" / "latest"
    monkeypatch.setenv(places.BENCH_RESULTS_VARIABLE, str(reference))
    assert places.bench_results(tmp_path) == reference
    assert nb.latest_bench(tmp_path / "nowhere") is None


def test_the_banner_says_whose_results_when_and_on_what_and_how_to_make_your_own(tmp_path):
    reference = nb.latest_bench(_results_folder(tmp_path / "reference", reference=True))
    assert nb.bench_banner(reference) == (
        "Benchmark results: the reference shipped with the notebooks (notebooks/bench_reference), profile quick, "
        "measured 2026-01-02 03:04 on 2 CPUs (Test CPU @ 2.0GHz), PostgreSQL 18.1, load average 0.5 as it began "
        "and 1.5 as it ended; shared with a test run. Yours will differ: `reliableq bench --profile quick` in the "
        "repository (it took 4 min 47 s there) makes your own, and this notebook then shows them.")
    own = nb.bench_banner(nb.latest_bench(_results_folder(tmp_path / "own")))
    assert own.startswith("Benchmark results: your own run (") and "measured 2026-01-02 03:04 on 2 CPUs" in own
    assert nb.bench_banner(None).startswith("Benchmark results: none found. Run `reliableq bench --profile quick`")


def test_a_reference_holds_only_what_the_notebook_reads_and_no_older_chart(tmp_path):
    out = _results_folder(tmp_path / "run", runs=[{"scenario": "execute"}], summary=[], baselines=[], ratios=[],
                          mechanism_costs=None)
    for name in ("execute.png", "mechanisms.csv", "report.md"):
        (out / name).write_text(name)
    reference = _results_folder(tmp_path / "reference")
    (reference / "older.png").write_text("from an older run")
    written = report.write_reference(out, reference)
    assert sorted(p.name for p in reference.iterdir()) == sorted(p.name for p in written) == ["execute.png",
                                                                                             "results.json"]
    assert set(json.loads((reference / "results.json").read_text())) == {*report.REFERENCE_KEYS, "reference"}


def test_the_shipped_reference_is_labelled_and_prices_every_costed_mechanism():
    """notebooks/bench_reference, as a fresh clone has it: what notebook 13 shows before a learner runs
    anything. It names its machine and date, and its mechanism costs cover every costed switch."""
    results = nb.latest_bench(places.reference_bench_results(CLONE))
    assert results["reference"] and results["profile"] == "quick"
    env = results["environment"]
    assert env["cpus"] and env["cpu_model"] and env["postgresql"] and results["started_at"]
    rows = results["mechanism_costs"]["rows"]
    assert [r["point"] for r in rows] == [ALL_ON, *(f"{name} off" for name in COSTED_MECHANISMS)]
    assert sorted(p.name for p in Path(results["folder"]).glob("*.png"))  # the harness's charts, shown beside
