"""What the notebooks call: tables, charts, the live scenario panel and the self-checks.

Notebooks hold narrative and calls; everything they compute or draw is here, where it is tested. The
tables are pandas DataFrames of A/H/C/F per job; the charts are matplotlib figures (counts side by side,
and a timeline of workers, leases, crashes and finalizations); the widgets are ipywidgets that re-run a
stage's scenario with the switches and knobs a learner picks. Nothing here decides what a job is.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND") or "agg")  # notebooks switch to inline themselves
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from IPython.display import Image, display  # noqa: E402

from reliableq import db
from reliableq.config import Mechanisms  # noqa: E402
from reliableq.lab.chaos import ChaosConfig, ChaosReport, run_chaos  # noqa: E402
from reliableq.lab.experiment import ScenarioParams, ScenarioResult, Stage
from reliableq.lab.faults import CRASH_POINTS  # noqa: E402

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
    return f"Using the embedded PostgreSQL 18 in {db.embedded_data_dir()} (set DATABASE_URL to use another)."


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


class ScenarioPanel:
    """Widgets to re-run a stage's scenario live: every mechanism switch, and the scenario's knobs."""

    def __init__(self, stage: Stage, params: ScenarioParams = ScenarioParams()) -> None:
        self.stage = stage
        initial = stage.mechanisms(True)
        self.switches = {name: widgets.Checkbox(value=getattr(initial, name), description=name, indent=False)
                         for name in Mechanisms.names()}
        self.lease = widgets.FloatSlider(value=params.lease_seconds, min=0.5, max=3.0, step=0.25,
                                         description="lease (s)")
        self.crash_point = widgets.Dropdown(options=[("stage default", None)] + [(p, p) for p in CRASH_POINTS[:3]],
                                            value=params.crash_point, description="crash at")
        self.failure_rate = widgets.FloatSlider(value=params.failure_rate, min=0.0, max=1.0, step=0.05,
                                                description="failure rate")
        self.concurrency = widgets.IntSlider(value=params.concurrency, min=1, max=8, description="concurrency")
        self.jobs = widgets.IntSlider(value=params.jobs, min=1, max=8, description="jobs")
        self.seed = widgets.IntText(value=params.seed, description="seed")
        self.button = widgets.Button(description="Run scenario", button_style="primary", icon="play")
        self.output = widgets.Output()
        self.last_result: ScenarioResult | None = None
        self.button.on_click(lambda _: asyncio.ensure_future(self.run()))
        switches = widgets.HBox([widgets.VBox(list(self.switches.values())[:4]),
                                 widgets.VBox(list(self.switches.values())[4:])])
        knobs = widgets.VBox([self.lease, self.crash_point, self.failure_rate, self.concurrency, self.jobs, self.seed])
        self.widget = widgets.VBox([widgets.HTML(f"<b>Stage {stage.NAME}</b>: {stage.FAILURE}"),
                                    widgets.HBox([switches, knobs]), self.button, self.output])

    def mechanisms(self) -> Mechanisms:
        return Mechanisms(**{name: box.value for name, box in self.switches.items()})

    def params(self) -> ScenarioParams:
        return ScenarioParams(seed=self.seed.value, jobs=self.jobs.value, lease_seconds=self.lease.value,
                              crash_point=self.crash_point.value, failure_rate=self.failure_rate.value,
                              concurrency=self.concurrency.value, mechanisms=self.mechanisms())

    async def run(self) -> ScenarioResult:
        """Run the scenario with the panel's settings and show the result in the panel."""
        self.button.disabled = True
        self.output.clear_output()
        # append_* rather than `with output:`, which captures only inside a kernel's cell execution.
        self.output.append_stdout(f"running {self.stage.NAME} with {self.mechanisms().describe()} ...\n")
        try:
            mechanism_on = True if self.stage.MECHANISM is None else self.switches[self.stage.MECHANISM].value
            result = await self.stage.scenario(mechanism_on, self.params())
        except Exception as error:
            self.output.append_stdout(f"the scenario failed: {error}\n")
            raise
        finally:
            self.button.disabled = False
        self.last_result = result
        self.output.clear_output()
        for view in views(result):
            if isinstance(view, str):
                self.output.append_stdout(view + "\n")
            else:
                self.output.append_display_data(view)
        return result

    def _ipython_display_(self) -> None:
        display(self.widget)


class SelfCheck:
    """A 'predict, then run' question: pick an answer, press Check, read why."""

    def __init__(self, question: str, options: Sequence[str], answer: str, why: str) -> None:
        if answer not in options:
            raise ValueError("the answer must be one of the options")
        self.answer, self.why = answer, why
        self.choice = widgets.RadioButtons(options=list(options), value=None, layout={"width": "max-content"})
        self.button = widgets.Button(description="Check")
        self.feedback = widgets.HTML()
        self.button.on_click(lambda _: self.check())
        self.widget = widgets.VBox([widgets.HTML(f"<b>Predict:</b> {question}"), self.choice, self.button,
                                    self.feedback])

    def check(self) -> bool:
        correct = self.choice.value == self.answer
        if self.choice.value is None:
            self.feedback.value = "Pick an answer first."
        elif correct:
            self.feedback.value = f"✅ Right. {self.why}"
        else:
            self.feedback.value = f"❌ Not quite: the answer is <i>{self.answer}</i>. {self.why}"
        return correct

    def _ipython_display_(self) -> None:
        display(self.widget)


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


def checks_table(report: ChaosReport) -> pd.DataFrame:
    """A chaos report's invariants and whether each held."""
    return pd.DataFrame([{"name": c.name, "held": c.held} for c in report.checks])


class ChaosPanel:
    """Pick a mechanism to switch off and run the chaos suite; the report appears in the panel."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.mechanism = widgets.Dropdown(options=Mechanisms.names(), value="fencing", description="switch off")
        self.button = widgets.Button(description="Run chaos", button_style="primary", icon="play")
        self.output = widgets.Output()
        self.button.on_click(lambda _: asyncio.ensure_future(self.run()))
        self.widget = widgets.VBox([self.mechanism, self.button, self.output])

    async def run(self) -> ChaosReport:
        self.button.disabled = True
        self.output.clear_output()
        self.output.append_stdout(f"running chaos with {self.mechanism.value} off ...\n")
        try:
            report = await run_chaos(replace(self.config, mechanisms=Mechanisms().without(self.mechanism.value)))
        finally:
            self.button.disabled = False
        self.output.clear_output()
        self.output.append_stdout(report.text() + "\n")
        return report

    def _ipython_display_(self) -> None:
        display(self.widget)


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
    """Our throughput as a ratio to pgbench's on the same server, then the harness's own charts (nothing
    without results). Images only, so a saved notebook holds nothing that changes between bench runs."""
    if results is None:
        return
    ratios = pd.DataFrame(results["ratios"]).set_index(["scenario", "point"])["ratio"]
    fig, ax = plt.subplots(figsize=(8, 5))
    ratios.plot.barh(ax=ax, xlabel="ours / pgbench at the same client count", ylabel="",
                     title="throughput against PostgreSQL's own limit")
    fig.tight_layout()
    charts = [Image(filename=png) for png in sorted(Path(results["folder"]).glob("*.png"))]
    display(fig, *charts, include=["image/png"])
    plt.close(fig)
