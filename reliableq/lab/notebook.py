"""What the notebooks show: tables, charts and banners (their widgets are reliableq/lab/panels.py).

Notebooks hold narrative and calls; everything they compute or draw is here, where it is tested. The
tables are pandas DataFrames of A/H/C/F per job; the charts are matplotlib figures (counts side by side,
and a timeline of workers, leases, crashes and finalizations). Nothing here decides what a job is.
Imported in a notebook's kernel, it also makes JupyterLab's interrupt (■) end a cell with one line
instead of the traceback of every task it stopped.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND") or "agg")  # notebooks switch to inline themselves
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from IPython import get_ipython  # noqa: E402
from IPython.display import Image, display  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402

from reliableq import db
from reliableq.lab import places  # noqa: E402
from reliableq.lab.chaos import ChaosReport, ScheduledFault  # noqa: E402
from reliableq.lab.lanes import Attempt, lay_out, offset  # noqa: E402
from reliableq.lab.retrying_client import LostAnswerRun  # noqa: E402
from reliableq.lab.scenario import ScenarioResult, job_label, job_labels, run_name

COUNT_COLUMNS = ["A", "H", "C", "F"]
COUNT_NAMES = {"A": "attempts", "H": "handler runs", "C": "committed charges", "F": "finalizations"}
_MARKERS = {  # timeline event kind -> (marker, colour, label)
    "claim": (">", "tab:blue", "claim"),
    "lease_expired": ("x", "tab:orange", "lease expired"),
    "finalize_won": ("P", "tab:green", "finalize won"),
    "finalize_lost": ("X", "tab:red", "finalize refused (stale)"),
    "crash": ("*", "black", "crash"),
    "pause": ("|", "tab:gray", "pause"),
    "resume": ("|", "tab:olive", "resume"),
    "lose_answer": ("d", "tab:brown", "COMMIT answer lost"),
    "acknowledged": ("v", "tab:green", "202 acknowledged"),
    "refused": ("s", "tab:red", "503 refused"),
    "link_cut": ("|", "tab:red", "link to the standby cut"),
    "primary_killed": ("*", "black", "primary SIGKILLed"),
    "promoted": ("^", "tab:green", "standby promoted"),
    "submitted": ("v", "tab:cyan", "watched job submitted"),
    "claimed": (">", "tab:red", "watched job claimed"),
}


# A charge request by what the charge service answered: its status code, else its class.
_CHARGE_ANSWERS = {
    "201": ("o", "tab:purple", "charge made (201)"),
    "200": ("h", "tab:purple", "charge replayed (200): no second charge"),
    "5": ("D", "tab:red", "charge refused for now (5xx)"),
    "4": ("D", "black", "charge refused for good (4xx)"),
}


# A finalize that won, by what it made of the job: a retry is not a success, and must not look like one.
_FINALIZES = {
    "succeeded": ("P", "tab:green", "finalize: succeeded"),
    "retried": ("P", "goldenrod", "finalize: retry scheduled"),
    "dead": ("P", "black", "finalize: DEAD"),
}


def _marker(event: dict[str, Any]) -> tuple[str, str, str]:
    """How a timeline draws `event`: (marker, colour, legend label)."""
    if event["kind"] == "finalize_won" and event["detail"] in _FINALIZES:
        return _FINALIZES[event["detail"]]
    if event["kind"] == "charge":
        status = event["detail"].rpartition("(")[2].rstrip(")")  # "overloaded (503)" -> "503"
        return _CHARGE_ANSWERS.get(status) or _CHARGE_ANSWERS.get(status[:1]) or ("o", "gray", "charge request")
    return _MARKERS.get(event["kind"], (".", "gray", event["kind"]))


OPEN_ATTEMPT = "attempt still open when the run ended"
# Where a timeline's marker is drawn: (height, seconds, whether it is a claim). A claim and the end of the attempt
# before it on the same track may share a height and a moment.
Place = tuple[float, float, bool]
LABELLED_ATTEMPTS = 60  # a lane with more attempts than this has its bars drawn without their job numbers
NUMBER_POINTS = 8  # the font size of a bar's job number
DIGIT_WIDTH = 0.65  # of the font size: a digit's width in matplotlib's default font (DejaVu Sans)
NUMBER_CLEARANCE_POINTS = 2  # between a number in its bar and the markers at the bar's ends
QUIET_SHARE = 0.3  # a stretch with no event this share of the run is marked: it is what the run shows


STOPPED = ("■ Stopped: you interrupted the kernel. What the cell was running has ended and cleaned up after "
           "itself (its servers and scratch databases); run the cell again to see its results.")


# An interrupt Python could not raise in the cell: it came while a finalizer or a weak reference's callback
# ran (matplotlib's transforms hold many), and Python reports and drops it there, as "Exception ignored in".
STOP_LOST = ("■ Your Stop came while Python was tidying up, which cannot be interrupted: the cell ran on. "
             "Press ■ again if it is still running.")


def say_interrupts_in_one_line(shell: Any) -> None:
    """An interrupt (KeyboardInterrupt, or the CancelledError of the run it cancelled) ends a cell of `shell`
    with STOPPED, not a traceback through the harness, the queue and psycopg: stopping is what the learner
    asked for, not a failure to read about. The charts the cell had begun are dropped, not shown half drawn
    under that line, which says to run the cell again to see them. One interrupt Python drops (STOP_LOST)
    is said in one line too."""
    def stopped(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        plt.close("all")  # the cells before it have shown theirs: the inline backend closes each once shown
        print(STOPPED, file=sys.stderr)
    shell.set_custom_exc((KeyboardInterrupt, asyncio.CancelledError), stopped)
    if not getattr(sys.unraisablehook, "says_lost_stops", False):
        sys.unraisablehook = _saying_lost_stops(sys.unraisablehook)


def _saying_lost_stops(hook: Any) -> Any:
    """`hook` (how Python reports an exception it cannot raise), saying a dropped interrupt as STOP_LOST."""
    def report(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            print(STOP_LOST, file=sys.stderr)
        else:
            hook(unraisable)
    report.says_lost_stops = True
    return report


if get_ipython() is not None:
    say_interrupts_in_one_line(get_ipython())


def database_banner() -> str:
    """One line saying which PostgreSQL the lab uses (starting the embedded one if needed)."""
    if os.environ.get("DATABASE_URL"):
        return f"Using PostgreSQL at DATABASE_URL (database {db.database_name(os.environ['DATABASE_URL'])!r})."
    db.embedded_server_url()
    # No path: a saved notebook must not carry one machine's folders (`reliableq db` prints it).
    return "Using the embedded PostgreSQL 18 (`reliableq db` says where; set DATABASE_URL to use another)."


def label(result: ScenarioResult) -> str:
    """How a run is named in tables and charts (`run_name`)."""
    return run_name(result.mechanism, result.mechanisms)


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
    """Who did what when: one lane per worker (and the charge service), one marker per event, a bar for
    each attempt from its claim to its finalize or lease expiry (dotted to the run's end if it had
    neither), and a long stretch in which nothing happened marked as such."""
    events = result.event_rows()
    lanes = sorted({e["worker"] for e in events}, key=lambda w: (w == "charge-service", w))
    return _plot_lanes(events, "worker", lanes, f"timeline: {label(result)}", "seconds since the scenario began",
                       result.watched_seconds, ax)


def plot_chaos(report: ChaosReport) -> plt.Figure:
    """A chaos run job by job: one lane per job in submission order, the same markers and attempt bars as a
    stage's timeline; the jobs an invariant names as broken are labelled in red."""
    labels = job_labels(report.job_ids)
    events = [e.as_dict() | {"job": labels[e.job_id]} for e in report.events if e.job_id in labels]
    lanes = list(labels.values())
    fig = _plot_lanes(events, "job", lanes, f"chaos seed {report.config.seed}: {report.config.mechanisms.describe()}",
                      "seconds since the run began", None, None, lane_inches=0.16)
    broken = {labels.get(str(v["job_id"])) for check in report.checks for v in check.violations if "job_id" in v}
    for tick in fig.axes[0].get_yticklabels():
        if tick.get_text() in broken:
            tick.set_color("tab:red")
            tick.set_fontweight("bold")
    return fig


def _plot_lanes(events: list[dict[str, Any]], lane_of: str, lanes: list[str], title: str, xlabel: str,
                watched: float | None, ax: plt.Axes | None, lane_inches: float = 0.7) -> plt.Figure:
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(10, lane_inches * len(lanes) + 1.6))
    layout = lay_out(events, lane_of, lanes)
    scale = min(1.0, lane_inches / 0.7)
    # Bars and markers no thicker than the space between the tracks of the lane with the most.
    tracks = max(layout.tracks.values(), default=1)
    room = 1.0 if tracks == 1 else (offset(1, tracks) - offset(0, tracks)) / 0.2  # 1 up to four tracks
    bar, size = 6 * scale * min(1.0, room), 70 * scale * min(1.0, room) ** 2
    seen: set[str] = set()
    last = max((e["seconds"] for e in events), default=0.0)
    held_to_end = watched is not None and watched > last
    attempts_in = Counter(attempt.lane for attempt in layout.attempts)
    bars: list[tuple[Attempt, float]] = []  # each attempt drawn, with where its bar ends
    for attempt in layout.attempts:
        if attempt.end is not None:
            ax.plot([attempt.start, attempt.end], [attempt.height] * 2, color="lightsteelblue", linewidth=bar,
                    solid_capstyle="butt", zorder=1)
            bars.append((attempt, attempt.end))
        elif held_to_end:  # neither finished nor expired while the run was watched: a claim held to the end
            ax.plot([attempt.start, watched], [attempt.height] * 2, color="lightsteelblue", linewidth=bar,
                    linestyle=(0, (1, 1)), zorder=1, label=None if OPEN_ATTEMPT in seen else OPEN_ATTEMPT)
            seen.add(OPEN_ATTEMPT)
            bars.append((attempt, watched))
    if held_to_end and watched - last >= QUIET_SHARE * watched:
        ax.axvspan(last, watched, color="whitesmoke", zorder=0)
        ax.text((last + watched) / 2, len(lanes) - 0.45, f"nothing happened for {watched - last:.1f} s",
                ha="center", va="top", fontsize="small", color="dimgray")
    drawn: dict[Place, list[PathCollection]] = {}
    for e, height in zip(events, layout.heights, strict=True):
        marker, colour, name = _marker(e)
        drawn.setdefault((height, e["seconds"], e["kind"] == "claim"), []).append(
            ax.scatter(e["seconds"], height, marker=marker, color=colour, s=size, zorder=2,
                       label=None if name in seen else name))
        seen.add(name)
    if watched is not None:
        ax.set_xlim(right=max(watched, last) * 1.02 or None)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=None if lane_inches >= 0.3 else "x-small")
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    if lane_of == "job":
        ax.invert_yaxis()  # job-1 at the top, as the tables list them
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if seen:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    # After the layout, as the numbers below: how far a marker's width reaches depends on how wide the axes came out.
    nudged = _part_handovers(layout.attempts, drawn, math.sqrt(size) / _points_a_second(ax))
    # Which job each bar is (a job's lane says so already), where bars are few enough to read: stage 7's
    # hundreds of attempts without backoff turned the numbers into a smear.
    if lane_of == "worker":
        _number_bars([(attempt, end) for attempt, end in bars if attempts_in[attempt.lane] <= LABELLED_ATTEMPTS], ax,
                     marker_points=math.sqrt(size), nudged=nudged)
    return fig


def _points_a_second(ax: plt.Axes) -> float:
    """How many points of the drawn axes a second of its time axis spans (once the layout is done)."""
    left, right = ax.get_xlim()
    return ax.get_window_extent().width * 72 / ax.figure.dpi / (right - left)


def _part_handovers(attempts: list[Attempt], drawn: dict[Place, list[PathCollection]],
                    marker_seconds: float) -> dict[Place, float]:
    """Where an attempt begins on a track less than a marker's width after the one before it ended (with the
    semaphore, a success and the claim its permit passed to are one commit, a millisecond apart), the end's
    marker moved back and the claim's forward, half the overlap each, so that they touch rather than one
    hiding the other. Only between bars at least two markers long: a shorter bar has no room to give.
    Returns how far (in seconds) each moved marker went, by the place it was drawn at."""
    nudged: dict[Place, float] = {}
    track_ends: dict[float, Attempt] = {}  # height -> the attempt that last ended there
    for attempt in sorted(attempts, key=lambda a: a.start):
        before = track_ends.get(attempt.height)
        if attempt.end is not None:
            track_ends[attempt.height] = attempt
        if before is None or attempt.end is None:
            continue
        overlap = marker_seconds - (attempt.start - before.end)
        if overlap <= 0 or min(attempt.end - attempt.start, before.end - before.start) < 2 * marker_seconds:
            continue
        for place, shift in (((attempt.height, before.end, False), -overlap / 2),
                             ((attempt.height, attempt.start, True), overlap / 2)):
            for marker in drawn.get(place, []):
                marker.set_offsets([(place[1] + shift, place[0])])
            nudged[place] = shift
    return nudged


def _number_bars(bars: list[tuple[Attempt, float]], ax: plt.Axes, marker_points: float,
                 nudged: dict[Place, float]) -> None:
    """Each bar's job number in the bar's middle: before the claim, a number sits on the finalize marker of
    the job before it on the same track (with the semaphore, a success and the next claim are one commit).
    Only a bar too short to hold it clear of its end markers (half a marker wide each, `marker_points`
    being a whole one, and as far in again as `_part_handovers` moved them) has it before its claim."""
    points_a_second = _points_a_second(ax)
    for attempt, end in bars:
        number = attempt.job.removeprefix("job-")
        moved_in = (nudged.get((attempt.height, attempt.start, True), 0.0)  # forward: into the bar
                    - nudged.get((attempt.height, end, False), 0.0))  # back: into it too
        room = (end - attempt.start - moved_in) * points_a_second - marker_points
        if room >= DIGIT_WIDTH * NUMBER_POINTS * len(number) + 2 * NUMBER_CLEARANCE_POINTS:
            where = {"xy": ((attempt.start + end) / 2, attempt.height), "ha": "center"}
        else:
            where = {"xy": (attempt.start, attempt.height), "xytext": (-7, 0), "textcoords": "offset points",
                     "ha": "right", "bbox": {"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none"}}
        ax.annotate(number, va="center", fontsize=NUMBER_POINTS, color="black", zorder=3, **where)


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
    """Backoff: the delay each job's retries chose, as the attempt history records them, against each cap."""
    # One column per job; jobs may have retried a different number of times.
    delays = pd.DataFrame.from_dict(result.measurements["retry_delays"], orient="index").T
    fig, ax = plt.subplots(figsize=(8, 3.5))
    delays.plot(ax=ax, marker="o", xlabel="retry (0 = first)", ylabel="delay before the next attempt (s)")
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


def latest_bench(folder: Path | None = None) -> dict[str, Any] | None:
    """The benchmark results notebook 13 shows: results.json of `folder`, by default the learner's newest
    run, else the reference shipped with the notebooks (reliableq.lab.places.bench_results), with the
    folder it came from; None when that folder holds no results."""
    folder = folder or places.bench_results()
    results = folder / "results.json"
    return json.loads(results.read_text()) | {"folder": str(folder)} if results.is_file() else None


def machine(results: dict[str, Any]) -> str:
    """What the figures were measured on, from the run's environment (older runs record less)."""
    env = results.get("environment", {})
    where = f"{env.get('cpus')} CPUs" + (f" ({env['cpu_model']})" if env.get("cpu_model") else "")
    if env.get("postgresql"):
        where += f", PostgreSQL {env['postgresql']}"
    if env.get("load_average_before") is not None:
        where += f", load average {env['load_average_before']} as it began and {env['load_average_after']} as it ended"
    return where + (f"; {env['note']}" if env.get("note") else "")


def bench_banner(results: dict[str, Any] | None) -> str:
    """Whose results these are, when and on what they were measured, and how to make one's own."""
    make_own = "`reliableq bench --profile quick` in the repository"
    if results is None:
        return f"Benchmark results: none found. Run {make_own}, then re-run this notebook."
    when = results["started_at"][:16].replace("T", " ")
    measured = f"profile {results['profile']}, measured {when} on {machine(results)}"
    if results.get("reference"):
        took = divmod(round(results["seconds"]), 60)
        return (f"Benchmark results: the reference shipped with the notebooks ({places.REFERENCE_BENCH_FOLDER}), "
                f"{measured}. Yours will differ: {make_own} (it took {took[0]} min {took[1]:02d} s there) "
                "makes your own, and this notebook then shows them.")
    folder = places.from_clone(Path(results["folder"]))
    return (f"Benchmark results: your own run ({folder}), {measured}. The reference shipped with the notebooks is "
            f"in {places.REFERENCE_BENCH_FOLDER}.")


def plot_mechanism_costs(results: dict[str, Any]) -> plt.Figure | None:
    """What each mechanism costs: jobs/s of the same charged jobs with every mechanism on and with each one
    off in turn, from one bench run (its `mechanism_costs`); the grey band spans the all-on runs' rates.
    A point whose gate failed has no bar and names what broke; the caption says what the gate waived and
    which mechanisms are not switched off, and why. None when the run has no mechanisms scenario."""
    costs = results.get("mechanism_costs")
    if not costs:
        return None
    rows = costs["rows"]
    waived = [f"with {r['off']} off, " + ", ".join(
        f"'{name}' ({why}; jobs that broke it: {r['waived_broken'].get(name, 0)})" for name, why in r["waived"].items())
        for r in rows if r["waived"]]
    caption = [f"Measured on {machine(results)}. All on ran before each switch and at the end; its bar is their "
               "mean, the ratios are to it, and a bar ending inside the band is no measurable cost.",
               "Gate: every run is held to every invariant" + (" except, " + "; ".join(waived) if waived else "")
               + "; a run that broke any other failed and has no bar.",
               "Not switched off: " + "; ".join(f"{name}: {why}" for name, why in costs["not_measured"].items())
               + "."]
    caption_text = "\n".join(textwrap.fill(line, 150) for line in caption)
    caption_inches = 0.12 * (caption_text.count("\n") + 1) + 0.15  # 7-point lines, and a margin
    height = 0.45 * len(rows) + 1.8 + caption_inches
    fig, ax = plt.subplots(figsize=(9, height))
    y = range(len(rows))
    ax.barh(y, [r["jobs_per_second"] or 0 for r in rows],
            color=["tab:gray" if r["off"] is None else "tab:blue" for r in rows], zorder=2)
    ax.set_yticks(y, [r["point"] for r in rows])
    ax.invert_yaxis()  # all on first, as measured
    all_on = costs["all_on_jobs_per_second"]
    if all_on:
        ax.axvspan(min(all_on), max(all_on), color="tab:gray", alpha=0.25, zorder=1,
                   label=f"all on: its {len(all_on)} runs' range")
        ax.legend(loc="lower right", fontsize=8)
    for row_y, r in zip(y, rows, strict=True):
        if r["jobs_per_second"]:
            text = f" {r['jobs_per_second']:,.0f} jobs/s, {r['ratio_to_all_on']:.2f}x all on"
            if (r["claims_per_job"] or 1) > 1.005:
                text += f", {r['claims_per_job']:.2f} claims per job"
        else:
            text = " failed: " + "; ".join(r["broken"])
        ax.text(r["jobs_per_second"] or 0, row_y, text, va="center", fontsize=8)
    ax.set_xlim(0, 1.45 * max([r["jobs_per_second"] or 0 for r in rows] + [1]))
    ax.set(xlabel="jobs finished per second (higher is cheaper)",
           title=f"What each mechanism costs: {costs['jobs']:,} charged jobs, {costs['workers']} processes x "
                 f"{costs['permits']} permits")
    fig.tight_layout(rect=(0, caption_inches / height, 1, 1))
    fig.text(0.01, 0.01, caption_text, fontsize=7, va="bottom")
    return fig


def show_mechanism_costs(results: dict[str, Any] | None) -> None:
    """The mechanism-cost chart, or a line saying how to measure it."""
    fig = plot_mechanism_costs(results) if results else None
    if fig is None:
        print("No mechanism costs in these results: `reliableq bench --scenarios mechanisms` measures them.")
        return
    display(fig, include=["image/png"])
    plt.close(fig)


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
