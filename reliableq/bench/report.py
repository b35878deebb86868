"""The benchmark's files: results.json, runs.csv, baselines.csv, charts (PNG) and report.md.

Like for like (`KINDS`): each figure of ours is set only beside the same kind of work, measured in the same
run on the same server at the same client count: our no-op jobs beside the peers' no-op jobs (pgqueuer,
procrastinate: `reliableq.bench.peers`), our in-process enqueue beside theirs, one job per call or in
batches of the same size; pgbench's one-row insert and claim+finalize cycle bound our one-per-call
submission and our no-op jobs. Our jobs with an HTTP charge each, and our HTTP submission, have tables and
charts of their own (no peer does either); where a peer is ahead, the report says so. Failed runs are
listed with the invariant they broke and kept out of every mean and chart. This module only formats;
it measures nothing and judges nothing the gate did not already judge."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reliableq.bench import peers
from reliableq.bench.profiles import BATCH_JOBS
from reliableq.bench.results import BenchResult, RunResult
from reliableq.bench.scenarios import ALL_ON, SCENARIOS, UNCOSTED_MECHANISMS


def write(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write every result file into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "runs.csv", out_dir / "baselines.csv", out_dir / "report.md"]
    (out_dir / "results.json").write_text(json.dumps(
        result.as_json() | {"ratios": ratios(result), "mechanism_costs": mechanism_costs(result)}, indent=2,
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


# What notebook 11 reads of a results folder (reliableq/lab/notebook.py): these keys of results.json, and
# the charts. The reference shipped with the notebooks holds only these, so it stays small.
REFERENCE_KEYS = ("profile", "seed", "started_at", "seconds", "environment", "ratios", "mechanism_costs")


def write_reference(out_dir: Path, reference_dir: Path) -> list[Path]:
    """Copy what notebook 11 shows of the results in `out_dir` into `reference_dir`, replacing whatever
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


# -- like for like ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """One kind of work of ours, and what may be set beside it: the peers' run of the same kind (None
    when no peer does it) and pgbench's transaction bounding it (None when pgbench runs nothing like it)."""

    name: str
    scenario: str
    via: str | None  # the ingest scenario's via; None for execution
    peer_mode: str | None  # reliableq.bench.peers mode
    bound: str | None  # pgbench-insert | pgbench-claim


KINDS = (
    Kind("enqueue, one job per call, in-process", "ingest", "direct", "ingest", "pgbench-insert"),
    Kind(f"enqueue, batches of {BATCH_JOBS}, in-process", "ingest", "direct-batch", "ingest-batch", None),
    # No peer has an HTTP API: our HTTP points are set beside our own in-process ones (where the time goes).
    Kind("submit, one job per request over HTTP", "ingest", "http", None, "pgbench-insert"),
    Kind(f"submit, batches of {BATCH_JOBS} per request over HTTP", "ingest", "http-batch", None, None),
    Kind("no-op jobs, one worker process", "noop", None, "execute", "pgbench-claim"),
)
CHARGED = ("execute", "latency")  # jobs with an HTTP charge each: no peer runs an effect, so on their own


def kind_of(scenario: str, params: dict[str, Any]) -> Kind | None:
    """The kind a point of ours is, or None for a point set beside nothing (charged jobs, several processes)."""
    if scenario == "noop" and params.get("workers") != 1:
        return None
    return next((k for k in KINDS if k.scenario == scenario and k.via == params.get("via")), None)


def _clients(params: dict[str, Any]) -> int:
    return params["clients"] if "clients" in params else params["workers"] * params["permits"]


def _baseline(result: BenchResult, tool: str, clients: int) -> float | None:
    for b in result.baselines:
        if b.tool == tool and b.clients == clients and b.per_second:
            return b.per_second
    return None


def _passed_params(result: BenchResult, scenario: str, point: str) -> dict[str, Any]:
    return next(r.params for r in result.runs if (r.scenario, r.point) == (scenario, point) and r.passed)


def ratios(result: BenchResult) -> list[dict[str, Any]]:
    """Each passing mean of ours over each like figure measured in the same run at the same client count:
    the peers doing the same kind of work, and pgbench's bound; `ahead` names the faster."""
    measured = {b.tool for b in result.baselines}
    rows = []
    for row in result.summary():
        if row["mean"] is None:
            continue
        params = _passed_params(result, row["scenario"], row["point"])
        kind = kind_of(row["scenario"], params)
        if kind is None:
            continue
        tools = ([kind.bound] if kind.bound else []) + (
            [peers.tool(p, kind.peer_mode) for p in peers.PEERS] if kind.peer_mode else [])
        clients = _clients(params)
        for tool in tools:
            if tool not in measured and not tool.startswith("pgbench"):
                continue  # a peer that is not installed: the baselines table says so
            theirs = _baseline(result, tool, clients)
            ratio = row["mean"] / theirs if theirs else None
            rows.append({"scenario": row["scenario"], "point": row["point"], "kind": kind.name, "clients": clients,
                         "ours_per_second": row["mean"], "against": "pgbench" if tool.startswith("pgbench") else "peer",
                         "baseline": f"{tool} c={clients}", "baseline_per_second": theirs, "ratio": ratio,
                         "ahead": None if ratio is None else "ours" if ratio >= 1 else tool.split("-")[0]})
    return rows


def _point_mean(result: BenchResult, scenario: str, point: str, key: str) -> float | None:
    values = [r.metrics[key] for r in result.runs
              if (r.scenario, r.point) == (scenario, point) and r.passed and r.metrics.get(key) is not None]
    return sum(values) / len(values) if values else None


def pickup_rows(result: BenchResult) -> list[dict[str, Any]]:
    """Per queue of the pickup scenario: mean p50 and p99 (ms) over its passing runs, and why a failed run
    has no figures (its check's note, or its error)."""
    rows = []
    for queue in peers.PICKUP_QUEUES:
        runs = [r for r in result.runs if (r.scenario, r.point) == ("pickup", queue)]
        if not runs:
            continue
        failed = [r.error or "; ".join(c["note"] for c in r.checks if not c["held"]) for r in runs if not r.passed]
        rows.append({"queue": queue, "p50_ms": _point_mean(result, "pickup", queue, "pickup_p50_ms"),
                     "p99_ms": _point_mean(result, "pickup", queue, "pickup_p99_ms"),
                     "jobs": runs[0].params["jobs"], "failed": "; ".join(failed)})
    return rows


def peers_ahead(result: BenchResult) -> list[str]:
    """One plain line per like point where a peer did better than ours: higher rate, or lower pickup latency."""
    lines = [f"- {r['kind']}, c={r['clients']}: {r['baseline'].rsplit(' ', 1)[0]} {r['baseline_per_second']:,.0f} "
             f"jobs/s, ours {r['ours_per_second']:,.0f} ({r['ahead']} {1 / r['ratio']:.2f}x ahead)."
             for r in ratios(result) if r["against"] == "peer" and r["ahead"] not in (None, "ours")]
    pickup = {row["queue"]: row for row in pickup_rows(result)}
    ours = pickup.get("reliableq")
    for peer in peers.PEERS:
        theirs = pickup.get(peer)
        if not ours or not theirs:
            continue
        for centile in ("p50_ms", "p99_ms"):
            if ours[centile] is not None and theirs[centile] is not None and theirs[centile] < ours[centile]:
                lines.append(f"- pickup {centile[:3]}: {peer} {theirs[centile]:.1f} ms, ours {ours[centile]:.1f} ms "
                             f"({peer} lower).")
    return lines


def charged_rows(result: BenchResult) -> list[dict[str, Any]]:
    """Our jobs with an HTTP charge each, beside our own no-op jobs at the same concurrency (what the effect
    costs): no peer runs an effect, so these are set beside no one else."""
    noop = {_clients(r.params): r.point for r in result.runs if r.scenario == "noop" and r.params["workers"] == 1}
    rows = []
    for row in result.summary():
        if row["scenario"] not in CHARGED or row["mean"] is None:
            continue
        params = _passed_params(result, row["scenario"], row["point"])
        clients = _clients(params)
        noop_point = noop.get(clients) if params["workers"] == 1 else None
        noop_mean = _point_mean(result, "noop", noop_point, "jobs_per_second") if noop_point else None
        rows.append({"scenario": row["scenario"], "point": row["point"], "clients": clients,
                     "charge_args": " ".join(params.get("charge_args") or []) or "–", "per_second": row["mean"],
                     "noop_per_second": noop_mean, "share_of_noop": row["mean"] / noop_mean if noop_mean else None})
    return rows


def mechanism_costs(result: BenchResult) -> dict[str, Any] | None:
    """The mechanisms scenario as notebook 11 charts it (None when it did not run): per point, the mean
    jobs/s of its passing runs and its ratio to the mean of the all-on runs, how often each job was
    claimed, which checks its gate waives (and why), how many jobs broke each waived check, and which
    checks it failed; the all-on runs' own rates (their spread is how far this machine drifted and stalled
    during the scenario); and why the other mechanisms have no point."""
    runs = [r for r in result.runs if r.scenario == "mechanisms"]
    if not runs:
        return None
    all_on = [r.value for r in runs if r.point == ALL_ON and r.passed and r.value]
    reference = statistics.fmean(all_on) if all_on else None
    rows = []
    for row in result.summary():
        if row["scenario"] != "mechanisms":
            continue
        group = [r for r in runs if r.point == row["point"]]
        waived_broken: Counter[str] = Counter()  # jobs that broke each waived check, over the point's runs
        for r in group:
            waived_broken.update({c["name"]: c["violations"] for c in r.checks if c["waived"] and not c["held"]})
        rows.append({
            "point": row["point"], "off": group[0].params["off"], "jobs_per_second": row["mean"],
            "ratio_to_all_on": row["mean"] / reference if row["mean"] and reference else None,
            "claims_per_job": _point_mean(result, "mechanisms", row["point"], "claims_per_job"),
            "runs_passed": row["runs_passed"], "runs_failed": row["runs_failed"],
            "waived": group[0].params["waived"],
            "waived_broken": dict(waived_broken),
            "broken": sorted({c["name"] for r in group for c in r.checks if not c["held"] and not c["waived"]}
                             | {r.error for r in group if r.error}),
        })
    params = runs[0].params
    return {"jobs": params["jobs"], "workers": params["workers"], "permits": params["permits"],
            "all_on_jobs_per_second": all_on, "rows": rows, "not_measured": UNCOSTED_MECHANISMS}


# -- charts -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    style: str
    ours: bool = False


@dataclass(frozen=True)
class Chart:
    """One line chart: like series only (see KINDS), so a reader can set each beside each."""

    name: str  # the PNG's file name
    title: str
    xlabel: str
    series: list[Series]


def line_charts(result: BenchResult) -> list[Chart]:
    """The throughput charts, each of one kind of work: ours beside the peers doing the same and pgbench's
    bound; our HTTP and our charged jobs on charts of their own. A chart with no series of ours is left out."""
    summary = {(r["scenario"], r["point"]): r["mean"] for r in result.summary()}
    passed = [r for r in result.runs if r.passed]

    def ours(scenario: str, label: str, style: str, keep=lambda params: True) -> Series:
        points = sorted({(_clients(r.params), r.point) for r in passed if r.scenario == scenario and keep(r.params)
                         and summary.get((scenario, r.point)) is not None})
        return Series(label, [c for c, _ in points], [summary[(scenario, p)] for _, p in points], style, True)

    def baseline(tool: str, label: str, style: str) -> Series:
        points = sorted((b.clients, b.per_second) for b in result.baselines if b.tool == tool and b.per_second)
        return Series(label, [c for c, _ in points], [v for _, v in points], style)

    def like(kind: Kind, label: str) -> list[Series]:
        found = [ours(kind.scenario, label, "o-", lambda params: kind_of(kind.scenario, params) == kind)]
        if kind.peer_mode:
            found += [baseline(peers.tool(peer, kind.peer_mode), peer, style)
                      for peer, style in zip(peers.PEERS, ("v:", "x:"), strict=True)]
        if kind.bound:
            found.append(baseline(kind.bound, "pgbench " + ("one-row insert" if kind.bound == "pgbench-insert"
                                                          else "claim+finalize"), "k--"))
        return found

    kinds = {(k.scenario, k.via): k for k in KINDS}
    via = lambda v: lambda params: params.get("via") == v  # noqa: E731
    charts = [
        Chart("ingest.png", "Enqueue in-process, one job per call", "clients",
              like(kinds[("ingest", "direct")], "ours (Queue.submit)")),
        Chart("ingest_batch.png", f"Enqueue in-process, batches of {BATCH_JOBS}", "clients",
              like(kinds[("ingest", "direct-batch")], "ours (Queue.submit_many)")),
        Chart("ingest_http.png", "Ours over HTTP (no peer has an HTTP API)", "clients",
              [ours("ingest", "one job per request", "o-", via("http")),
               ours("ingest", f"batches of {BATCH_JOBS} per request", "^-", via("http-batch"))]),
        Chart("execute.png", "No-op jobs, one worker process", "concurrency",
              like(kinds[("noop", None)], "ours")),
        Chart("execute_charge.png", "Ours with an HTTP charge per job (no peer runs an effect)",
              "concurrency (permits in total)",
              [ours("execute", "one process, instant charges", "o-", lambda params: params["workers"] == 1),
               ours("execute", "several processes", "D", lambda params: params["workers"] > 1),
               ours("latency", "one process, charges with latency", "^-")]),
    ]
    return [replace(c, series=[s for s in c.series if s.xs]) for c in charts if any(s.xs for s in c.series if s.ours)]


def write_charts(result: BenchResult, out_dir: Path) -> tuple[list[Path], str]:
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed (pip install 'reliableq[lab]'): no charts"
    passed = [r for r in result.runs if r.passed]
    written = []

    def save(fig, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for chart in line_charts(result):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for series in chart.series:
            ax.plot(series.xs, series.ys, series.style, label=series.label)
        ticks = sorted({x for series in chart.series for x in series.xs})
        ax.set(xscale="log", yscale="log", xlabel=chart.xlabel, ylabel="jobs/s", title=chart.title)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.tick_params(axis="x", which="minor", labelbottom=False)  # the clients measured, nothing between
        ax.legend(fontsize=8)
        save(fig, chart.name)

    breakdown = [r for r in passed if r.scenario == "execute" and r.metrics.get("claim_mean_ms") is not None]
    if breakdown:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        labels = [r.point for r in breakdown]
        bottom = [0.0] * len(breakdown)
        for key, label in (("claim_mean_ms", "claim (per claim)"), ("charge_mean_ms", "charge HTTP"),
                           ("finalize_mean_ms", "finalize"), ("pool_wait_mean_ms", "pool wait (per request)")):
            values = [r.metrics.get(key) or 0.0 for r in breakdown]
            ax.bar(labels, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set(xlabel="processes x permits", ylabel="ms", title="Where a job's time goes (means)")
        ax.legend(fontsize=8)
        save(fig, "time.png")

    pickup = [row for row in pickup_rows(result) if row["p50_ms"] is not None]
    if pickup:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        xs = range(len(pickup))
        for offset, centile in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
            ax.bar([x + offset for x in xs], [row[centile] for row in pickup], width=0.4, label=centile[:3])
        ax.set_xticks(list(xs), [row["queue"] for row in pickup])
        ax.set(yscale="log", ylabel="ms from enqueue call to handler start",
               title="Pickup latency on an idle system (lower is better)")
        ax.legend()
        save(fig, "pickup.png")

    retention = sorted((r for r in passed if r.scenario == "retention"), key=lambda r: r.params["pruned"])
    if retention:
        fig, (rate, cost) = plt.subplots(1, 2, figsize=(9, 3.6))
        labels = [r.point for r in retention]
        rate.bar(labels, [r.value for r in retention], color=["tab:gray" if not r.params["pruned"] else "tab:green"
                                                             for r in retention])
        rate.set(ylabel="no-op jobs/s, one worker", title="Draining beside a finished history")
        xs = range(len(retention))
        for offset, key in ((-0.2, "claim_mean_ms"), (0.2, "finalize_mean_ms")):
            cost.bar([x + offset for x in xs], [r.metrics.get(key) or 0 for r in retention], width=0.4,
                     label=key.removesuffix("_mean_ms"))
        cost.set_xticks(list(xs), labels)
        cost.set(ylabel="ms (mean)", title="Claim and finalize")
        cost.legend()
        save(fig, "retention.png")

    for scenario, key, xlabel, title, name in (
            ("retry", "transient_rate", "transient failure rate", "Retry amplification (charge requests per job)",
             "retry.png"),
            ("kill9", "lease_seconds", "lease (s)", "kill -9 recovery time (s)", "kill9.png")):
        runs = sorted((r for r in passed if r.scenario == scenario), key=lambda r: r.params[key])
        if runs:
            fig, ax = plt.subplots(figsize=(6.5, 4))
            ax.plot([r.params[key] for r in runs], [r.value for r in runs], "o-", label="ours")
            if scenario == "kill9":
                ax.plot([r.params[key] for r in runs], [r.params[key] for r in runs], "k--", label="lease")
            ax.set(xlabel=xlabel, title=title)
            ax.legend()
            save(fig, name)
    return written, ""


# -- markdown ---------------------------------------------------------------------------------------

def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"


def markdown(result: BenchResult, charts: list[str], chart_note: str = "") -> str:
    failed = [r for r in result.runs if not r.passed]
    env = result.environment
    lines = [f"# ReliableQ benchmark — profile `{result.profile}`", "",
             f"Started {result.started_at}, {result.seconds:.0f} s, seed {result.seed}; {env.get('database')} "
             f"{env.get('postgresql') or ''}, {env.get('cpus')} CPUs ({env.get('cpu_model') or 'model unknown'}), "
             f"Python {env.get('python')}; load average {env.get('load_average_before')} before, "
             f"{env.get('load_average_after')} after." + (f" Note: {env['note']}." if env.get("note") else ""), "",
             f"**Gate:** {len(result.runs) - len(failed)} of {len(result.runs)} runs passed every invariant; "
             + ("no run failed." if not failed else f"{len(failed)} failed and are left out of every mean below."),
             ""]
    rows = ratios(result)
    beside_peers = [r for r in rows if r["against"] == "peer"]
    bounded = [r for r in rows if r["against"] == "pgbench"]
    lines += ["## Like for like: ours beside the peers", "",
              "Each row sets a mean of ours beside a peer doing the same kind of work in this run, on the same "
              "server, at the same client count: no-op jobs beside no-op jobs, batches beside batches of the same "
              "size, in-process enqueue beside in-process enqueue (pgqueuer and procrastinate through their own "
              "APIs, each run in its own process on a fresh database: `reliableq/bench/peers.py`). Ratio = ours / "
              "theirs; `ahead` names the faster.", ""]
    lines += _table(["kind", "clients", "ours /s", "peer", "peer /s", "ratio", "ahead"],
                    [[r["kind"], r["clients"], r["ours_per_second"], r["baseline"].rsplit(" ", 1)[0],
                      r["baseline_per_second"], _ratio(r["ratio"]), r["ahead"]]
                     for r in beside_peers]) if beside_peers else ["No throughput was measured beside a peer's."]
    ahead = peers_ahead(result)
    lines += ["", "**Where a peer is ahead:**" if ahead else
              "**Where a peer is ahead:** nowhere in this run (of the like points measured).", *ahead, ""]
    pickup = pickup_rows(result)
    if pickup:
        lines += ["## Pickup latency", "", f"`pickup`: {SCENARIOS['pickup'].what}. Milliseconds, lower is "
                  "better; a queue whose handler did not run every job exactly once has no figures.", ""]
        lines += _table(["queue", "p50 ms", "p99 ms", "jobs", "failed runs"],
                        [[r["queue"], r["p50_ms"], r["p99_ms"], r["jobs"], r["failed"]] for r in pickup])
        lines.append("")
    lines += [] if not bounded else ["## Ours against PostgreSQL's own limit", "",
              "pgbench with the queue's own table and indexes (`sql/bench_pgbench_*.sql`), at the same client "
              "count: its one-row insert beside our one-job-per-call submission, its claim + finalize cycle beside "
              "our no-op jobs.", ""]
    lines += [] if not bounded else _table(
        ["kind", "point", "ours /s", "bound", "bound /s", "ratio"],
        [[r["kind"], r["point"], r["ours_per_second"], r["baseline"], r["baseline_per_second"], _ratio(r["ratio"])]
         for r in bounded])
    lines += mechanism_lines(mechanism_costs(result))
    charged = charged_rows(result)
    if charged:
        lines += ["", "## Jobs with an HTTP charge each (ours only)", "",
                  "Every job makes a real HTTP request to the charge service, keyed for idempotency. No peer runs "
                  "an effect, so these are set beside our own no-op jobs at the same concurrency: the share of the "
                  "no-op rate left once each job has its charge.", ""]
        lines += _table(["scenario", "point", "charge service", "jobs /s", "our no-op /s", "share of no-op"],
                        [[r["scenario"], r["point"], r["charge_args"], r["per_second"], r["noop_per_second"],
                          _ratio(r["share_of_noop"])] for r in charged])
    lines += ["", "## Scenarios", ""]
    for name, scenario in SCENARIOS.items():
        summary_rows = [r for r in result.summary() if r["scenario"] == name]
        if not summary_rows:
            continue
        lines += [f"### {name}", "", scenario.what, ""]
        table_rows = []
        for row in summary_rows:
            runs = [r for r in result.runs if (r.scenario, r.point) == (name, row["point"]) and r.passed]
            extra = _highlights(runs[0]) if runs else ""
            table_rows.append([row["point"], row["headline"], row["mean"], row["runs_passed"], row["runs_failed"],
                               extra])
        lines += _table(["point", "headline", "mean (passed runs)", "passed", "failed", "details"], table_rows)
        lines.append("")
    lines += ["## Where the time goes", ""] + where_time_goes(result) + [""]
    lines += ["## Baselines", ""]
    lines += _table(["tool", "clients", "per second", "note"],
                    [[b.tool, b.clients or "–", b.per_second, b.note] for b in result.baselines])
    lines.append("")
    if failed:
        lines += ["## Failed runs", ""]
        for r in failed:
            broken = [f"{c['name']} ({c['violations']})" for c in r.checks if not c["held"] and not c["waived"]]
            lines.append(f"- {r.scenario} {r.point} (repeat {r.repeat}): "
                         + (r.error or "broke: " + "; ".join(broken)))
        lines.append("")
    waived = {(c["name"], c["waived"]) for r in result.runs for c in r.checks if c["waived"]}
    if waived:
        lines += ["Waived checks: " + "; ".join(f"{n} — {why}" for n, why in sorted(waived)), ""]
    rejected = sum(r.rejected_samples for r in result.runs)
    lines += [f"Latency samples rejected as outside their run's monotonic window: {rejected}.", ""]
    if charts:
        lines += ["## Charts", ""] + [f"![{c}]({c})" for c in charts] + [""]
    elif chart_note:
        lines += [chart_note, ""]
    return "\n".join(lines)


def mechanism_lines(costs: dict[str, Any] | None) -> list[str]:
    """The report's section on what each mechanism costs (nothing when the scenario did not run)."""
    if costs is None:
        return []
    lines = ["", "## What each mechanism costs", "",
             f"`mechanisms`: {costs['jobs']:,} charged jobs, {costs['workers']} worker processes of "
             f"{costs['permits']} permits, with each mechanism off in turn and all on before each and at the "
             "end. Ratio = jobs/s over the mean of the all-on runs ("
             + ", ".join(f"{v:,.0f}" for v in costs["all_on_jobs_per_second"]) + " jobs/s: their spread is how "
             "far this machine drifted, so a rate inside it is no measurable cost). Claims per job above 1: jobs "
             "claimed twice.", ""]
    lines += _table(["point", "jobs /s", "ratio to all on", "claims per job", "gate"],
                    [[r["point"], r["jobs_per_second"], _ratio(r["ratio_to_all_on"]), r["claims_per_job"],
                      ("failed: " + "; ".join(r["broken"])) if r["broken"] else
                      ("passed, waived: " + "; ".join(f"{name} (jobs that broke it: {r['waived_broken'].get(name, 0)})"
                                                      for name in r["waived"])) if r["waived"] else "passed"]
                     for r in costs["rows"]])
    lines += ["", "Not switched off here: " + "; ".join(f"{name}: {why}" for name, why in
                                                        costs["not_measured"].items()) + "."]
    return lines


_HIGHLIGHT_KEYS = ("pickup_p99_ms", "latency_p50_ms", "latency_p99_ms", "claim_mean_ms", "charge_mean_ms",
                   "finalize_mean_ms", "pool_wait_mean_ms", "jobs_per_claim", "jobs_per_success_commit",
                   "worker_cpu_ms_per_job", "charge_cpu_ms_per_job", "claims_per_job", "attempts_per_job",
                   "requests_per_job", "dead",
                   "reclaim_lag_seconds", "attempts", "charges", "created", "replayed", "in_flight_peak",
                   "service_in_flight_peak", "bound_jobs_per_second", "pruned_jobs", "prune_seconds",
                   "pruned_per_second", "list_first_page_ms", "list_middle_page_ms")


def _highlights(run: RunResult) -> str:
    return ", ".join(f"{k}={_cell(run.metrics[k])}" for k in _HIGHLIGHT_KEYS if run.metrics.get(k) is not None)


def _cpu_note(m: dict[str, Any], cpus: int) -> str:
    """CPU per job in our Python processes: on a small machine, what bounds throughput once waits are gone."""
    worker, charge = m.get("worker_cpu_ms_per_job"), m.get("charge_cpu_ms_per_job")
    if worker is None or charge is None:
        return ""
    return (f" CPU per job: worker {worker:.2f} ms, charge service {charge:.2f} ms; those alone cap {cpus} "
            f"cores at {1000 * cpus / (worker + charge):,.0f} jobs/s, before PostgreSQL's share.")


def where_time_goes(result: BenchResult) -> list[str]:
    """From the workers' own counters and the ingestion pairs: what a job spends its time on."""
    lines = []
    summary = {(r["scenario"], r["point"]): r["mean"] for r in result.summary()}
    for r in result.runs:
        if r.scenario not in ("execute", "noop") or not r.passed or r.metrics.get("claim_mean_ms") is None:
            continue
        m = r.metrics
        per_claim = m["jobs_per_claim"] or 1
        busy_ms = m["claim_mean_ms"] / per_claim + (m["charge_mean_ms"] or 0) + (m["finalize_mean_ms"] or 0)
        lines.append(f"- {r.scenario} {r.point}: per job {busy_ms:.2f} ms of awaited work = claim "
                     f"{m['claim_mean_ms']:.2f} ms / {per_claim:.1f} jobs per claim + effect "
                     f"{m['charge_mean_ms'] or 0:.2f} ms + finalize {m['finalize_mean_ms'] or 0:.2f} ms "
                     f"({m.get('jobs_per_success_commit') or 1:.1f} jobs per commit); pool wait "
                     f"{m['pool_wait_mean_ms'] or 0:.2f} ms per connection request "
                     f"({m['pool_queued']} of {m['pool_requests']} requests queued). "
                     f"{m['clients']} permits at that pace would give {1000 * m['clients'] / busy_ms:,.0f} jobs/s; "
                     f"measured {m['jobs_per_second']:,.0f}." + _cpu_note(m, result.environment.get("cpus") or 1))
    for key, mean in summary.items():
        if key[0] != "ingest" or not key[1].startswith("direct") or not mean:
            continue  # each in-process point, beside the same over HTTP
        http_point = key[1].replace("direct", "http")
        over_http = summary.get(("ingest", http_point))
        if over_http:
            lines.append(f"- ingest {http_point}: {over_http:,.0f} jobs/s over HTTP, {mean:,.0f} straight into "
                         f"PostgreSQL from Python: HTTP and the API process cost {1 - over_http / mean:.0%} "
                         "of the in-process rate.")
        one_by_one = summary.get(("ingest", key[1].replace("direct-batch", "direct")))
        if key[1].startswith("direct-batch") and one_by_one:
            lines.append(f"- ingest {key[1]}: {mean:,.0f} jobs/s in batches of {BATCH_JOBS} per statement and "
                         f"commit, {mean / one_by_one:.1f}x one job per call: the per-call and per-commit costs "
                         "are shared by the batch.")
    return lines or ["- no passing execution or ingestion runs to explain."]
