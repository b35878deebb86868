"""The benchmark's files: results.json, runs.csv, baselines.csv, charts (PNG) and report.md.

Every figure of ours is set beside what bounds it, measured in the same run: pgbench's one-row insert
for ingestion, pgbench's claim+finalize cycle for execution, at the same client count, and beside the
peers (pgqueuer, procrastinate: `reliableq.bench.peers`) enqueueing and running no-op jobs. Failed runs are
listed with the invariant they broke and kept out of every mean and chart. This module only formats;
it measures nothing and judges nothing the gate did not already judge.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reliableq.bench import peers
from reliableq.bench.ingest import BENCH_BATCH_JOBS
from reliableq.bench.results import BenchResult, RunResult
from reliableq.bench.scenarios import SCENARIOS


def write(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write every result file into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "runs.csv", out_dir / "baselines.csv", out_dir / "report.md"]
    (out_dir / "results.json").write_text(json.dumps(result.as_json() | {"ratios": ratios(result)}, indent=2,
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
        import shutil
        shutil.rmtree(latest)
    try:
        os.symlink(out_dir.name, latest, target_is_directory=True)
    except OSError:
        import shutil
        shutil.copytree(out_dir, latest)


# -- ratios -----------------------------------------------------------------------------------------

def _baseline(result: BenchResult, tool: str, clients: int) -> float | None:
    for b in result.baselines:
        if b.tool == tool and b.clients == clients and b.per_second:
            return b.per_second
    return None


def _bounds(scenario: str, params: dict[str, Any]) -> tuple[list[str], int]:
    """What a point of ours is set beside, and the client count the baselines must match: pgbench's bound
    first, then each peer doing the same kind of work (none for latency: the peers' jobs do nothing)."""
    if scenario == "ingest":
        # Batch points too: pgbench commits one row per transaction; the ratio shows what grouping buys.
        return ["pgbench-insert", *(peers.tool(p, "ingest") for p in peers.PEERS)], params["clients"]
    if scenario in ("execute", "noop", "latency"):
        tools = ["pgbench-claim"] + ([peers.tool(p, "execute") for p in peers.PEERS] if scenario != "latency" else [])
        return tools, params["workers"] * params["permits"]
    return [], 0


def ratios(result: BenchResult) -> list[dict[str, Any]]:
    """Each passing mean of ours over each bound measured at the same client count in the same run."""
    measured = {b.tool for b in result.baselines}
    rows = []
    for row in result.summary():
        if row["mean"] is None:
            continue
        runs = [r for r in result.runs if (r.scenario, r.point) == (row["scenario"], row["point"]) and r.passed]
        tools, clients = _bounds(row["scenario"], runs[0].params)
        for tool in tools:
            if tool not in measured and not tool.startswith("pgbench"):
                continue  # a peer that is not installed: the baselines table says so
            bound = _baseline(result, tool, clients)
            rows.append({"scenario": row["scenario"], "point": row["point"], "ours_per_second": row["mean"],
                         "baseline": f"{tool} c={clients}", "baseline_per_second": bound,
                         "ratio": row["mean"] / bound if bound else None})
    return rows


# -- charts -----------------------------------------------------------------------------------------

def write_charts(result: BenchResult, out_dir: Path) -> tuple[list[Path], str]:
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed (pip install 'reliableq[lab]'): no charts"
    summary = {(r["scenario"], r["point"]): r for r in result.summary()}
    passed = [r for r in result.runs if r.passed]
    written = []

    def save(fig, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def mean_of(scenario: str, point: str) -> float | None:
        row = summary.get((scenario, point))
        return row["mean"] if row else None

    def baseline_series(tool: str) -> tuple[list[int], list[float]]:
        points = sorted((b.clients, b.per_second) for b in result.baselines if b.tool == tool and b.per_second)
        return [c for c, _ in points], [v for _, v in points]

    def plot_peers(ax, mode: str, doing: str) -> None:
        for peer, style in zip(peers.PEERS, ("v:", "x:"), strict=True):
            xs, ys = baseline_series(peers.tool(peer, mode))
            if xs:  # a peer not installed gets no legend entry
                ax.plot(xs, ys, style, label=f"{peer}, {doing}")

    ingest_clients = sorted({r.params["clients"] for r in passed if r.scenario == "ingest"})
    if ingest_clients:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for via, style in (("http", "o-"), ("http-batch", "^-"), ("direct", "s-")):
            xs = [c for c in ingest_clients if mean_of("ingest", f"{via} c={c}") is not None]
            ax.plot(xs, [mean_of("ingest", f"{via} c={c}") for c in xs], style, label=f"ours, {via}")
        ax.plot(*baseline_series("pgbench-insert"), "k--", label="pgbench one-row insert")
        plot_peers(ax, "ingest", "one job per call")
        ax.set(xscale="log", yscale="log", xlabel="clients", ylabel="jobs/s", title="Durable ingestion")
        ax.set_xticks(ingest_clients, [str(c) for c in ingest_clients])
        ax.legend()
        save(fig, "ingest.png")

    execute_runs = [r for r in passed if r.scenario in ("execute", "latency")]
    if execute_runs:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for scenario, style in (("execute", "o-"), ("latency", "^-")):
            points = sorted({(r.params["permits"], r.point) for r in execute_runs
                             if r.scenario == scenario and r.params["workers"] == 1})
            if points:
                ax.plot([c for c, _ in points], [mean_of(scenario, p) for _, p in points], style,
                        label="ours, one process" + (", 10 ms charges" if scenario == "latency" else ""))
        multi = sorted({(r.params["workers"] * r.params["permits"], r.point) for r in execute_runs
                        if r.scenario == "execute" and r.params["workers"] > 1})
        for clients, point in multi:
            ax.plot([clients], [mean_of("execute", point)], "D", label=f"ours, {point} processes")
        ax.plot(*baseline_series("pgbench-claim"), "k--", label="pgbench claim+finalize")
        plot_peers(ax, "execute", "no-op jobs")
        ax.set(xscale="log", yscale="log", xlabel="concurrency (permits in total)", ylabel="jobs/s",
               title="Execution throughput")
        ax.legend(fontsize=8)
        save(fig, "execute.png")

        breakdown = [r for r in execute_runs if r.scenario == "execute" and r.metrics.get("claim_mean_ms") is not None]
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


def markdown(result: BenchResult, charts: list[str], chart_note: str = "") -> str:
    failed = [r for r in result.runs if not r.passed]
    env = result.environment
    lines = [f"# ReliableQ benchmark — profile `{result.profile}`", "",
             f"Started {result.started_at}, {result.seconds:.0f} s, seed {result.seed}; {env.get('database')}, "
             f"{env.get('cpus')} CPUs, Python {env.get('python')}.", "",
             f"**Gate:** {len(result.runs) - len(failed)} of {len(result.runs)} runs passed every invariant; "
             + ("no run failed." if not failed else f"{len(failed)} failed and are left out of every mean below."),
             ""]
    lines += ["## Ours against what bounds us", "",
              "Ratio = our mean over the bound measured in this run, on the same server, at the same client count "
              "(pgbench with the queue's own table and indexes: `sql/bench_pgbench_*.sql`; pgqueuer and "
              "procrastinate through their own APIs, each run in its own process on a fresh database, enqueueing "
              "one job per call or running no-op jobs with one worker: `reliableq/bench/peers.py`).", ""]
    lines += _table(["scenario", "point", "ours /s", "bound", "bound /s", "ratio"],
                    [[r["scenario"], r["point"], r["ours_per_second"], r["baseline"], r["baseline_per_second"],
                      None if r["ratio"] is None else f"{r['ratio']:.2f}"] for r in ratios(result)])
    lines += ["", "## Scenarios", ""]
    for name, scenario in SCENARIOS.items():
        rows = [r for r in result.summary() if r["scenario"] == name]
        if not rows:
            continue
        lines += [f"### {name}", "", scenario.what, ""]
        table_rows = []
        for row in rows:
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


_HIGHLIGHT_KEYS = ("latency_p50_ms", "latency_p99_ms", "claim_mean_ms", "charge_mean_ms", "finalize_mean_ms",
                   "pool_wait_mean_ms", "jobs_per_claim", "jobs_per_success_commit", "worker_cpu_ms_per_job",
                   "charge_cpu_ms_per_job", "attempts_per_job", "requests_per_job", "dead",
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
        if key[0] == "ingest" and key[1].startswith("http c=") and mean:
            direct = summary.get(("ingest", key[1].replace("http", "direct")))
            if direct:
                lines.append(f"- ingest {key[1]}: {mean:,.0f} jobs/s over HTTP, {direct:,.0f} straight into "
                             f"PostgreSQL from Python: HTTP and the API process cost {1 - mean / direct:.0%} "
                             "of the direct rate.")
            batch_point = key[1].replace("http", "http-batch")
            batched = summary.get(("ingest", batch_point))
            if batched:
                lines.append(f"- ingest {batch_point}: {batched:,.0f} jobs/s in batches of {BENCH_BATCH_JOBS} per "
                             f"request and commit, {batched / mean:.1f}x one job per request: the per-request "
                             "and per-commit costs are shared by the batch.")
    return lines or ["- no passing execution or ingestion runs to explain."]
