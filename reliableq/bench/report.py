"""The benchmark's files: results.json, runs.csv, baselines.csv, charts (PNG) and report.md; the reference
notebook 13 ships; results/bench/latest.

What goes into them: the tables (`reliableq.bench.tables`: like beside like only), the charts
(`reliableq.bench.charts`) and report.md's text (`reliableq.bench.markdown`). Failed runs are listed with
the invariant they broke and kept out of every mean and chart. This module and those only format; they
measure nothing and judge nothing the gate did not already judge."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path
from typing import Any

from reliableq.bench.charts import write_charts
from reliableq.bench.markdown import markdown
from reliableq.bench.results import BenchResult, RunResult
from reliableq.bench.tables import fairness_summary, mechanism_costs, ratios, standby_rows


def write(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write every result file into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "runs.csv", out_dir / "baselines.csv", out_dir / "report.md"]
    (out_dir / "results.json").write_text(json.dumps(
        result.as_json() | {"ratios": ratios(result), "mechanism_costs": mechanism_costs(result),
                            "standby": standby_rows(result), "fairness": fairness_summary(result)}, indent=2,
        default=str))
    _write_runs_csv(result.runs, out_dir / "runs.csv")
    with open(out_dir / "baselines.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tool", "clients", "per_second", "note"])
        for b in result.baselines:
            writer.writerow([b.tool, b.clients, "" if b.per_second is None else f"{b.per_second:.1f}", b.note])
    charts, chart_note = write_charts(result, out_dir)
    written += charts
    (out_dir / "report.md").write_text(markdown(result, [c.name for c in charts], chart_note))
    return written


# What notebook 13 reads of a results folder (reliableq/lab/notebook.py): these keys of results.json, and
# the charts. The reference shipped with the notebooks holds only these, so it stays small.
REFERENCE_KEYS = ("profile", "seed", "started_at", "seconds", "environment", "ratios", "mechanism_costs")


def write_reference(out_dir: Path, reference_dir: Path) -> list[Path]:
    """Copy what notebook 13 shows of the results in `out_dir` into `reference_dir`, replacing whatever
    was there (so no chart of an older run stays beside a newer one); returns the files written."""
    results = json.loads((out_dir / "results.json").read_text())
    if reference_dir.exists():
        shutil.rmtree(reference_dir)
    reference_dir.mkdir(parents=True)
    shipped = {k: results[k] for k in REFERENCE_KEYS} | {"reference": True}  # the notebook's banner says so
    (reference_dir / "results.json").write_text(json.dumps(shipped, indent=1) + "\n")
    charts = sorted(out_dir.glob("*.png"))
    for chart in charts:
        shutil.copyfile(chart, reference_dir / chart.name)
    return [reference_dir / "results.json", *(reference_dir / c.name for c in charts)]


def _write_runs_csv(runs: list[RunResult], path: Path) -> None:
    metric_keys = sorted({k for r in runs for k in r.metrics})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scenario", "point", "repeat", "passed", "headline", "value", "error",
                         "rejected_samples", "window_seconds", "broken_checks", *metric_keys])
        for r in runs:
            broken = "; ".join(c["name"] for c in r.checks if not c["held"] and not c["waived"])
            writer.writerow([r.scenario, r.point, r.repeat, r.passed, r.headline, _num(r.value), r.error or "",
                             r.rejected_samples, f"{r.window_seconds:.3f}", broken,
                             *(_num(r.metrics.get(k)) for k in metric_keys)])


def _num(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def link_latest(out_dir: Path) -> None:
    """results/bench/latest -> the newest run's folder (a symlink; a copy where symlinks are refused)."""
    latest = out_dir.parent / "latest"
    if latest.is_symlink() or latest.is_file():
        latest.unlink()
    elif latest.is_dir():
        shutil.rmtree(latest)
    try:
        os.symlink(out_dir.name, latest, target_is_directory=True)
    except OSError:
        shutil.copytree(out_dir, latest)
