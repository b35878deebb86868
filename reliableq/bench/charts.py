"""The benchmark report's charts (PNG): throughput against clients, each chart of one kind of work (ours
beside the peers doing the same and pgbench's bound: `reliableq.bench.tables.KINDS`), where a job's time
goes, pickup latency, retention, retry amplification and kill -9 recovery. Passing runs only. Without
matplotlib there are no charts, and a note says why."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from reliableq.bench import peers
from reliableq.bench.profiles import BATCH_JOBS
from reliableq.bench.results import BenchResult
from reliableq.bench.tables import KINDS, Kind, clients_of, kind_of, pickup_rows


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
        points = sorted({(clients_of(r.params), r.point) for r in passed if r.scenario == scenario and keep(r.params)
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
        # A claim's time shared by the jobs it took: most are claimed in their predecessor's finalize, whose
        # time holds that claim.
        stacks = [("claim (per job)", [(r.metrics["claim_mean_ms"] or 0.0) / (r.metrics.get("jobs_per_claim") or 1)
                                       for r in breakdown])]
        stacks += [(label, [r.metrics.get(key) or 0.0 for r in breakdown])
                   for key, label in (("charge_mean_ms", "charge HTTP"), ("finalize_mean_ms", "finalize"),
                                      ("pool_wait_mean_ms", "pool wait (per request)"))]
        for label, values in stacks:
            ax.bar(labels, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set(xlabel="processes x permits", ylabel="ms", title="Where a job's time goes (means)")
        ax.margins(y=0.3)  # room above the tallest bar for the legend
        ax.legend(fontsize=8, loc="upper left")
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
