"""The benchmark report's tables, as rows: each figure of ours set only beside like figures, our charged
jobs beside our own no-op jobs, pickup latency per queue, what each mechanism costs, what a standby
costs, and what the fair claim costs and buys (each fair figure beside its FIFO twin only).

Like for like (`KINDS`): each figure of ours is set only beside the same kind of work, measured in the same
run on the same server at the same client count: our no-op jobs beside the peers' no-op jobs (pgqueuer,
procrastinate: `reliableq.bench.peers`), our in-process enqueue beside theirs, one job per call or in
batches of the same size; pgbench's one-row insert and claim+finalize cycle bound our one-per-call
submission and our no-op jobs. Our jobs with an HTTP charge each, and our HTTP submission, have tables and
charts of their own (no peer does either); where a peer is ahead, the report says so. Only passing runs
count: a failed run is kept out of every mean (the gate judged it; nothing here judges again)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from reliableq.bench import peers
from reliableq.bench.fairness import QUIET_TENANT
from reliableq.bench.profiles import BATCH_JOBS
from reliableq.bench.results import BenchResult
from reliableq.bench.scenarios import ALL_ON, UNCOSTED_MECHANISMS
from reliableq.bench.standby import FAILOVER, REPLICATIONS


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
    """The kind a point of ours is, or None for a point set beside nothing (charged jobs, several processes)
    or beside its own point only (a no-op point's twin with the fairness mechanism the other way)."""
    if scenario == "noop" and (params.get("workers") != 1 or "fairness_twin_of" in params):
        return None
    return next((k for k in KINDS if k.scenario == scenario and k.via == params.get("via")), None)


def clients_of(params: dict[str, Any]) -> int:
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
        clients = clients_of(params)
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
    costs): no peer runs an effect, so these are set beside no one else. With where the time goes: the CPU
    per job of the worker (its HTTP client included), of the charge service and of PostgreSQL (when it is
    the embedded server, on the same cores), and the rate that CPU alone allows on this machine's cores."""
    cpus = result.environment.get("cpus") or 1
    noop = {clients_of(r.params): r.point for r in result.runs if kind_of(r.scenario, r.params) is not None
            and r.scenario == "noop"}
    rows = []
    for row in result.summary():
        if row["scenario"] not in CHARGED or row["mean"] is None:
            continue
        params = _passed_params(result, row["scenario"], row["point"])
        clients = clients_of(params)
        noop_point = noop.get(clients) if params["workers"] == 1 else None
        noop_mean = _point_mean(result, "noop", noop_point, "jobs_per_second") if noop_point else None
        worker_cpu = _point_mean(result, row["scenario"], row["point"], "worker_cpu_ms_per_job")
        charge_cpu = _point_mean(result, row["scenario"], row["point"], "charge_cpu_ms_per_job")
        server_cpu = _point_mean(result, row["scenario"], row["point"], "server_cpu_ms_per_job")
        cpu = worker_cpu + charge_cpu + (server_cpu or 0) if worker_cpu and charge_cpu else None
        rows.append({"scenario": row["scenario"], "point": row["point"], "clients": clients,
                     "charge_args": " ".join(params.get("charge_args") or []) or "–", "per_second": row["mean"],
                     "noop_per_second": noop_mean, "share_of_noop": row["mean"] / noop_mean if noop_mean else None,
                     "worker_cpu_ms_per_job": worker_cpu, "charge_cpu_ms_per_job": charge_cpu,
                     "server_cpu_ms_per_job": server_cpu,
                     "cpu_bound_per_second": 1000 * cpus / cpu if cpu else None})
    return rows


def mechanism_costs(result: BenchResult) -> dict[str, Any] | None:
    """The mechanisms scenario as notebook 13 charts it (None when it did not run): per point, the mean
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


def standby_rows(result: BenchResult) -> dict[str, Any] | None:
    """The standby scenario (None when it did not run): submissions and charged jobs per second at each
    replication, each as a ratio to the same server alone; and the failover's gaps, means of passing runs."""
    if not any(r.scenario == "standby" for r in result.runs):
        return None
    keys = ("ingest_jobs_per_second", "execute_jobs_per_second")
    means = {point: {key: _point_mean(result, "standby", point, key) for key in keys} for point in REPLICATIONS}
    alone = means["none"]
    rows = [{"replication": point, **{key: m[key] for key in keys},
             **{f"{key}_ratio": m[key] / alone[key] if m[key] and alone[key] else None for key in keys}}
            for point, m in means.items()]
    failover = {key: _point_mean(result, "standby", FAILOVER, key)
                for key in ("first_202_after_death_seconds", "first_claim_after_death_seconds", "lost")}
    return {"rows": rows, "failover": failover}


def fairness_rows(result: BenchResult) -> list[dict[str, Any]]:
    """The fairness scenario: per number of tenants, the mean time of one claim first in first out and fair
    over the same backlog (passing runs), and fair's over FIFO's."""
    rows = []
    for row in result.summary():
        if row["scenario"] != "fairness" or row["mean"] is None:
            continue
        fifo = _point_mean(result, "fairness", row["point"], "fifo_claim_ms")
        params = _passed_params(result, "fairness", row["point"])
        rows.append({"tenants": params["tenants"], "pending": params["pending"], "fifo_claim_ms": fifo,
                     "fair_claim_ms": row["mean"], "fair_over_fifo": row["mean"] / fifo if fifo else None})
    return rows


def _ratio(fair: float | None, fifo: float | None) -> float | None:
    return fair / fifo if fair is not None and fifo else None


def fair_noop_rows(result: BenchResult) -> list[dict[str, Any]]:
    """The noop scenario's points beside their twins (the fairness mechanism the other way): per point, the
    mean no-op jobs/s of the passing runs with the fair claim and first in first out, all of one tenant,
    and fair's over FIFO's."""
    twins = {r.params["fairness_twin_of"]: r for r in result.runs
             if r.scenario == "noop" and "fairness_twin_of" in r.params}
    rows = []
    for point, twin in twins.items():
        rates = {fair: _point_mean(result, "noop", name, "jobs_per_second")
                 for fair, name in ((twin.params["fairness"], twin.point), (not twin.params["fairness"], point))}
        rows.append({"point": point, "clients": clients_of(twin.params), "fifo_jobs_per_second": rates[False],
                     "fair_jobs_per_second": rates[True], "fair_over_fifo": _ratio(rates[True], rates[False])})
    return rows


QUIET_FIGURES = (("pickup_p50_ms", "quiet job's pickup p50, ms"), ("pickup_p99_ms", "quiet job's pickup p99, ms"),
                 ("claims_ahead_max", "most claims ahead of a quiet job"),
                 ("jobs_per_second", "jobs/s, both tenants"))


def quiet_tenant_rows(result: BenchResult) -> dict[str, Any] | None:
    """The quiet-tenant scenario (None when it did not run): each figure first in first out and fair, means
    of the passing runs, and fair's over FIFO's; the flood, the schedule and the fair bound it was held to."""
    runs = [r for r in result.runs if r.scenario == QUIET_TENANT]
    if not runs:
        return None
    rows = []
    for key, figure in QUIET_FIGURES:
        fifo, fair = (_point_mean(result, QUIET_TENANT, point, key) for point in ("FIFO", "fair"))
        rows.append({"figure": figure, "metric": key, "fifo": fifo, "fair": fair,
                     "fair_over_fifo": _ratio(fair, fifo)})
    params = runs[0].params
    return {"flood_jobs": params["flood_jobs"], "quiet_jobs": params["quiet_jobs"], "workers": params["workers"],
            "permits": params["permits"], "fair_bound_claims": _point_mean(result, QUIET_TENANT, "fair",
                                                                            "fair_bound_claims"),
            "rows": rows}


def fairness_summary(result: BenchResult) -> dict[str, Any] | None:
    """What the fair claim costs and what it buys, as results.json keeps it (None when no such point ran):
    one claim's time (`claim`), no-op throughput at one tenant (`noop`), a quiet tenant's pickup beside a
    flood (`quiet_tenant`); every ratio fair over FIFO."""
    claim, noop, quiet = fairness_rows(result), fair_noop_rows(result), quiet_tenant_rows(result)
    if not (claim or noop or quiet):
        return None
    return {"claim": claim, "noop": noop, "quiet_tenant": quiet}
