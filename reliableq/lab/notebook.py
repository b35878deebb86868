"""What the notebooks show: tables, charts and banners (their widgets are reliableq/lab/panels.py).

Notebooks hold narrative and calls; everything they compute or draw is here, where it is tested. The
tables are pandas DataFrames of A/H/C/F per job; the charts are matplotlib figures (counts side by side,
and a timeline of workers, leases, crashes and finalizations). Nothing here decides what a job is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND") or "agg")  # notebooks switch to inline themselves
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from IPython.display import Image, display  # noqa: E402

from reliableq import db
from reliableq.lab.chaos import ChaosReport, ScheduledFault  # noqa: E402
from reliableq.lab.retrying_client import LostAnswerRun  # noqa: E402
from reliableq.lab.scenario import ScenarioResult, job_label

COUNT_COLUMNS = ["A", "H", "C", "F"]
COUNT_NAMES = {"A": "attempts", "H": "handler runs", "C": "committed charges", "F": "finalizations"}
_MARKERS = {  # timeline event kind -> (marker, colour, label)
    "claim": (">", "tab:blue", "claim"),
    "charge": ("o", "tab:purple", "charge request"),
    "lease_expired": ("x", "tab:orange", "lease expired"),
    "finalize_won": ("P", "tab:green", "finalize won"),
    "finalize_lost": ("X", "tab:red", "finalize refused (stale)"),
    "crash": ("*", "black", "crash"),
    "pause": ("|", "tab:gray", "pause"),
    "resume": ("|", "tab:olive", "resume"),
}


def database_banner() -> str:
    """One line saying which PostgreSQL the lab uses (starting the embedded one if needed)."""
    if os.environ.get("DATABASE_URL"):
        return f"Using PostgreSQL at DATABASE_URL (database {db.database_name(os.environ['DATABASE_URL'])!r})."
    db.embedded_server_url()
    # No path: a saved notebook must not carry one machine's folders (`reliableq db` prints it).
    return "Using the embedded PostgreSQL 18 (`reliableq db` says where; set DATABASE_URL to use another)."


def label(result: ScenarioResult) -> str:
    """How a run is named in tables and charts: by the switches a learner picked, if they did."""
    if result.params.mechanisms is not None:
        return result.mechanisms.describe()
    if result.mechanism is None:
        return "naive"
    return f"{result.mechanism} {'on' if result.mechanism_on else 'off'}"


def counts_table(*results: ScenarioResult) -> pd.DataFrame:
    """A/H/C/F per job, one block of rows per run, labelled by what was switched."""
    frames = [pd.DataFrame(r.rows()).assign(run=label(r)) for r in results]
    table = pd.concat(frames, ignore_index=True)
    return table[["run", "job", "status", *COUNT_COLUMNS]]


def events_table(result: ScenarioResult) -> pd.DataFrame:
    rows = result.event_rows()
    columns = ["seconds", "job", "worker", "attempt", "kind", "detail"]
    return pd.DataFrame(rows, columns=columns + [c for c in (rows[0] if rows else {}) if c not in columns])[columns]


def plot_counts(*results: ScenarioResult) -> plt.Figure:
    """Grouped bars of A, H, C, F per job, one panel per run; the dashed line is the guarantee C = F = 1."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.4), sharey=True, squeeze=False)
    top = max((max(row[c] for c in COUNT_COLUMNS) for r in results for row in r.rows()), default=1)
    for ax, result in zip(axes[0], results, strict=True):
        frame = pd.DataFrame(result.rows()).set_index("job")[COUNT_COLUMNS]
        frame.rename(columns=lambda c: f"{c} ({COUNT_NAMES[c]})").plot.bar(ax=ax, rot=0, width=0.8, legend=False)
        ax.axhline(1, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(label(result))
        ax.set_ylim(0, top + 1)
        ax.set_xlabel("")
    axes[0][0].set_ylabel("count")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def plot_timeline(result: ScenarioResult, ax: plt.Axes | None = None) -> plt.Figure:
    """Who did what when: one lane per worker (and the charge service), one marker per event,
    and a bar for each attempt from its claim to its finalize or lease expiry."""
    events = result.event_rows()
    lanes = sorted({e["worker"] for e in events}, key=lambda w: (w == "charge-service", w))
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(10, 0.7 * len(lanes) + 1.6))
    y = {lane: i for i, lane in enumerate(lanes)}
    open_attempts: dict[tuple[str, str], float] = {}
    for e in events:
        key = (e["worker"], e["job"])
        if e["kind"] == "claim":
            open_attempts[key] = e["seconds"]
        elif e["kind"] in ("finalize_won", "finalize_lost", "lease_expired") and key in open_attempts:
            start = open_attempts.pop(key)
            ax.plot([start, e["seconds"]], [y[e["worker"]]] * 2, color="lightsteelblue", linewidth=6,
                    solid_capstyle="butt", zorder=1)
    seen: set[str] = set()
    for e in events:
        marker, colour, name = _MARKERS.get(e["kind"], (".", "gray", e["kind"]))
        ax.scatter(e["seconds"], y[e["worker"]], marker=marker, color=colour, s=70, zorder=2,
                   label=None if name in seen else name)
        seen.add(name)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.set_xlabel("seconds since the scenario began")
    ax.set_title(f"timeline: {label(result)}")
    if seen:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def views(*results: ScenarioResult) -> list[Any]:
    """The standard view of runs, in order: each summary, the table, the counts chart, each timeline."""
    shown: list[Any] = [result.summary() for result in results]
    shown += [counts_table(*results), plot_counts(*results)]
    shown += [plot_timeline(result) for result in results]
    plt.close("all")  # displayed explicitly; pyplot must not draw them a second time
    return shown


def show(*results: ScenarioResult) -> None:
    for view in views(*results):
        if isinstance(view, str):
            print(view)
        else:
            display(view)


def plot_retry_schedule(result: ScenarioResult) -> plt.Figure:
    """Backoff: the delay each job actually waited before each retry, against that retry's cap."""
    # One column per job; jobs may have retried a different number of times.
    schedule = pd.DataFrame.from_dict(result.measurements["retry_schedule"], orient="index").T
    fig, ax = plt.subplots(figsize=(8, 3.5))
    schedule.plot(ax=ax, marker="o", xlabel="retry (0 = first)", ylabel="seconds until the next claim")
    ax.plot(result.measurements["retry_ceilings"], "k--", label="cap for that retry")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_measurement(key: str, *results: ScenarioResult, ylabel: str, title: str = "") -> plt.Figure:
    """One measurement of several runs side by side (e.g. backoff's attempts_per_second off and on)."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    pd.Series({label(r): r.measurements[key] for r in results}).plot.bar(ax=ax, rot=0, ylabel=ylabel, title=title)
    fig.tight_layout()
    return fig


def lost_answer_table(run: LostAnswerRun) -> pd.DataFrame:
    """The retrying client's requests, one row each (notebook 02's last section)."""
    return pd.DataFrame(run.per_request())


def schedule_table(schedule: Sequence[ScheduledFault]) -> pd.DataFrame:
    """A chaos seed's faults, each on its job named as the report names it (job-1 is the first submitted)."""
    return pd.DataFrame([{"job": job_label(f.job_index + 1), "action": f.action, "point": f.point}
                         for f in schedule])


def checks_table(report: ChaosReport) -> pd.DataFrame:
    """A chaos report's invariants and whether each held."""
    return pd.DataFrame([{"name": c.name, "held": c.held} for c in report.checks])


def latest_bench(root: Path | None = None) -> dict[str, Any] | None:
    """The newest `reliableq bench` results (results/bench/latest/results.json), or None."""
    # The checkout that holds the package (this file is reliableq/lab/notebook.py).
    results = (root or Path(__file__).resolve().parents[2]) / "results" / "bench" / "latest" / "results.json"
    return json.loads(results.read_text()) | {"folder": str(results.parent)} if results.exists() else None


def bench_banner(results: dict[str, Any] | None) -> str:
    if results is None:
        return ("Benchmark results: none yet. Run `reliableq bench --profile quick` in the repository, "
                "then re-run this notebook.")
    return f"Benchmark results: profile {results['profile']}, seed {results['seed']}, started {results['started_at']}."


def show_bench(results: dict[str, Any] | None) -> None:
    """Each ratio of ours to the same kind of work at the same client count (the peers' and pgbench's: the
    report's `ratios`), then the harness's own charts, pickup latency among them (nothing without results).
    Images only, so a saved notebook holds nothing that changes between bench runs."""
    if results is None:
        return
    rows = pd.DataFrame([r for r in results["ratios"] if r["ratio"] is not None])
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.5))
    if not rows.empty:
        labels = rows["scenario"] + " " + rows["point"] + " vs " + rows["baseline"].str.split(" ").str[0]
        rows.set_index(labels)["ratio"].plot.barh(
            ax=ax, ylabel="", xlabel="ours / theirs (right of 1: ours ahead)",
            title="like for like: ours against the peers and pgbench")
        ax.axvline(1, color="black", linewidth=0.8)
    fig.tight_layout()
    charts = [Image(filename=png) for png in sorted(Path(results["folder"]).glob("*.png"))]
    display(fig, *charts, include=["image/png"])
    plt.close(fig)
