"""report.md, the benchmark's results in prose and tables: the gate's verdict, ours beside the peers and
pgbench's bound (`reliableq.bench.tables`), pickup latency, what each mechanism costs, what a standby
costs, what the fair claim costs and buys, our charged jobs, each scenario's points, where a job's time
goes, the baselines, the failed runs and the charts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reliableq.bench.profiles import BATCH_JOBS
from reliableq.bench.results import BenchResult, RunResult
from reliableq.bench.scenarios import SCENARIOS
from reliableq.bench.tables import (
    charged_rows,
    fairness_summary,
    mechanism_costs,
    peers_ahead,
    pickup_rows,
    ratios,
    standby_rows,
)


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
    lines += standby_lines(standby_rows(result))
    lines += fairness_lines(fairness_summary(result))
    charged = charged_rows(result)
    if charged:
        lines += ["", "## Jobs with an HTTP charge each (ours only)", "",
                  "Every job makes a real HTTP request to the charge service, keyed for idempotency. No peer runs "
                  "an effect, so these are set beside our own no-op jobs at the same concurrency: the share of the "
                  "no-op rate left once each job has its charge. Where its time goes: the CPU each job costs the "
                  "worker (its HTTP call included), the charge service and PostgreSQL (the embedded server, "
                  "both databases, on the same cores; none with DATABASE_URL), and the rate that CPU alone "
                  "would allow on this machine's cores: where jobs/s comes near it, the ceiling is CPU, "
                  "not waiting.", ""]
        lines += _table(["scenario", "point", "charge service", "jobs /s", "our no-op /s", "share of no-op",
                         "worker CPU ms/job", "charge service CPU ms/job", "PostgreSQL CPU ms/job", "CPU bound /s"],
                        [[r["scenario"], r["point"], r["charge_args"], r["per_second"], r["noop_per_second"],
                          _ratio(r["share_of_noop"]), r["worker_cpu_ms_per_job"], r["charge_cpu_ms_per_job"],
                          r["server_cpu_ms_per_job"], r["cpu_bound_per_second"]] for r in charged])
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


def fairness_lines(fairness: dict[str, Any] | None) -> list[str]:
    """The report's section on the fair claim: one claim's time, no-op jobs of one tenant, and a quiet
    tenant's pickup beside a flood, each fair beside first in first out (nothing when none of them ran)."""
    if fairness is None:
        return []
    lines = ["", "## What a fair claim costs, and what it buys", "",
             "Each figure with the fair claim (the `fairness` mechanism on) beside the same with it off (first in "
             "first out), measured in this run; ratio = fair / FIFO."]
    if fairness["claim"]:
        lines += ["", f"`fairness`: {SCENARIOS['fairness'].what}. Milliseconds per claim, each in a transaction "
                  "rolled back so that every claim meets the same backlog.", ""]
        lines += _table(["tenants", "pending", "FIFO ms", "fair ms", "fair / FIFO"],
                        [[r["tenants"], r["pending"], r["fifo_claim_ms"], r["fair_claim_ms"],
                          _ratio(r["fair_over_fifo"])] for r in fairness["claim"]])
    if fairness["noop"]:
        lines += ["", "`noop` at one tenant: each point's no-op jobs, all the default tenant's, drained fair and "
                  "first in first out, one run after the other: what the fair claim costs where there is no one "
                  "to be fair between. Jobs/s, higher is better; single runs on a shared machine vary by more "
                  "than the difference they are read for.", ""]
        lines += _table(["point", "FIFO jobs /s", "fair jobs /s", "fair / FIFO"],
                        [[r["point"], r["fifo_jobs_per_second"], r["fair_jobs_per_second"],
                          _ratio(r["fair_over_fifo"])] for r in fairness["noop"]])
    quiet = fairness["quiet_tenant"]
    if quiet:
        lines += ["", f"`quiet-tenant`: a backlog of {quiet['flood_jobs']:,} jobs of one tenant, drained by "
                  f"{quiet['workers']} worker processes of {quiet['permits']} permits, while another submits "
                  f"{quiet['quiet_jobs']} jobs one at a time (the bench's seed, the same schedule both ways). "
                  "Pickup: milliseconds from a quiet job's insert to its claim, on PostgreSQL's clock; claims "
                  "ahead: claims that took jobs between its becoming claimable and its own claim (the fair runs' "
                  f"gate holds each to {_cell(quiet['fair_bound_claims'])}).", ""]
        lines += _table(["figure", "FIFO", "fair", "fair / FIFO"],
                        [[r["figure"], r["fifo"], r["fair"], _ratio(r["fair_over_fifo"])] for r in quiet["rows"]])
    return lines


def standby_lines(standby: dict[str, Any] | None) -> list[str]:
    """The report's section on what a standby costs and how long a failover leaves the queue without one."""
    if standby is None:
        return []
    lines = ["", "## What a standby costs, and a failover's gap", "",
             f"`standby`: {SCENARIOS['standby'].what}. Each point on a server of the same making; ratio = over the "
             "same server alone.", ""]
    lines += _table(["replication", "submit /s (HTTP)", "ratio to alone", "charged jobs /s", "ratio to alone"],
                    [[r["replication"], r["ingest_jobs_per_second"], _ratio(r["ingest_jobs_per_second_ratio"]),
                      r["execute_jobs_per_second"], _ratio(r["execute_jobs_per_second_ratio"])]
                     for r in standby["rows"]])
    gap = standby["failover"]
    lines += ["", "A failover with a synchronous standby (`reliableq chaos --failover`): the first 202 came "
              f"{_cell(gap['first_202_after_death_seconds'])} s and the first claim on the promoted server "
              f"{_cell(gap['first_claim_after_death_seconds'])} s after the primary's death; acknowledged jobs "
              f"lost: {_cell(gap['lost'])}."]
    return lines


_HIGHLIGHT_KEYS = ("pickup_p99_ms", "latency_p50_ms", "latency_p99_ms", "claim_mean_ms", "charge_mean_ms",
                   "finalize_mean_ms", "pool_wait_mean_ms", "jobs_per_claim", "jobs_per_success_commit",
                   "worker_cpu_ms_per_job", "charge_cpu_ms_per_job", "claims_per_job", "attempts_per_job",
                   "requests_per_job", "dead",
                   "reclaim_lag_seconds", "attempts", "charges", "created", "replayed", "in_flight_peak",
                   "service_in_flight_peak", "bound_jobs_per_second", "pruned_jobs", "prune_seconds",
                   "pruned_per_second", "list_first_page_ms", "list_middle_page_ms", "jobs_per_second",
                   "requests_per_second", "api_cpu_ms_per_request", "server_cpu_ms_per_job")


def _highlights(run: RunResult) -> str:
    return ", ".join(f"{k}={_cell(run.metrics[k])}" for k in _HIGHLIGHT_KEYS if run.metrics.get(k) is not None)


def _cpu_note(m: dict[str, Any], cpus: int) -> str:
    """CPU per job in our Python processes: on a small machine, what bounds throughput once waits are gone."""
    worker, charge = m.get("worker_cpu_ms_per_job"), m.get("charge_cpu_ms_per_job")
    if worker is None or charge is None:
        return ""
    said = f" CPU per job: worker {worker:.2f} ms, charge service {charge:.2f} ms"
    server = m.get("server_cpu_ms_per_job")
    if server is None:
        return said + (f"; those alone cap {cpus} cores at {1000 * cpus / (worker + charge):,.0f} jobs/s, "
                       "before PostgreSQL's share.")
    return said + (f", PostgreSQL {server:.2f} ms; together they cap {cpus} cores at "
                   f"{1000 * cpus / (worker + charge + server):,.0f} jobs/s.")


def _client_cost_line(run: RunResult) -> str:
    m, profile = run.metrics, run.params["profile"]
    if run.point.startswith("worker"):
        return (f"- client-cost {run.point}: per no-op job {m['round_trips_per_job']:.1f} round trips to PostgreSQL; "
                f"under cProfile {1000 / m['jobs_per_second']:.2f} ms, {m['worker_cpu_ms_per_job']:.2f} ms of it the "
                f"worker's CPU (where it goes: {profile}).")
    cpu = m.get("api_cpu_ms_per_request")
    return (f"- client-cost {run.point}: per submission {m['round_trips_per_request']:.1f} round trips; under "
            f"cProfile {1000 / m['requests_per_second']:.2f} ms from one client"
            + (f", {cpu:.2f} ms of it the API's CPU" if cpu is not None else "") + f" (where it goes: {profile}).")


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
        handed_over = m.get("claimed_with_a_success")
        lines.append(f"- {r.scenario} {r.point}: per job {busy_ms:.2f} ms of awaited work = claim "
                     f"{m['claim_mean_ms']:.2f} ms / {per_claim:.1f} jobs per claim"
                     + (f" ({handed_over:,} jobs claimed in the finalize's commit of the job before)"
                        if handed_over else "") + " + effect "
                     f"{m['charge_mean_ms'] or 0:.2f} ms + finalize {m['finalize_mean_ms'] or 0:.2f} ms "
                     f"({m.get('jobs_per_success_commit') or 1:.1f} jobs per commit); pool wait "
                     f"{m['pool_wait_mean_ms'] or 0:.2f} ms per connection request "
                     f"({m['pool_queued']} of {m['pool_requests']} requests queued). "
                     f"{m['clients']} permits at that pace would give {1000 * m['clients'] / busy_ms:,.0f} jobs/s; "
                     f"measured {m['jobs_per_second']:,.0f}." + _cpu_note(m, result.environment.get("cpus") or 1))
    lines += [_client_cost_line(r) for r in result.runs if r.scenario == "client-cost" and r.passed]
    for key, mean in summary.items():
        if key[0] != "ingest" or not key[1].startswith("direct") or not mean:
            continue  # each in-process point, beside the same over HTTP
        http_point = key[1].replace("direct", "http")
        over_http = summary.get(("ingest", http_point))
        if over_http:
            api_cpu = next((r.metrics.get("api_cpu_ms_per_request") for r in result.runs
                            if (r.scenario, r.point) == ("ingest", http_point) and r.passed), None)
            lines.append(f"- ingest {http_point}: {over_http:,.0f} jobs/s over HTTP, {mean:,.0f} straight into "
                         f"PostgreSQL from Python: HTTP and the API process cost {1 - over_http / mean:.0%} "
                         "of the in-process rate." + (
                             f" The API's CPU per request: {api_cpu:.2f} ms, which caps one API process at "
                             f"{1000 / api_cpu:,.0f} requests/s on a core of its own." if api_cpu else ""))
        one_by_one = summary.get(("ingest", key[1].replace("direct-batch", "direct")))
        if key[1].startswith("direct-batch") and one_by_one:
            lines.append(f"- ingest {key[1]}: {mean:,.0f} jobs/s in batches of {BATCH_JOBS} per statement and "
                         f"commit, {mean / one_by_one:.1f}x one job per call: the per-call and per-commit costs "
                         "are shared by the batch.")
    return lines or ["- no passing execution or ingestion runs to explain."]
