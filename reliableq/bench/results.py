"""The benchmark's result model: timed samples and the window they must lie in, one run's result, the
baselines, the whole bench's result and its summary, and the workers' time metrics.

Values only: nothing here measures, runs or judges (the gate is `reliableq.bench.gate`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One timed operation, both ends read from time.monotonic() (one clock for every process)."""

    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class Window:
    """The monotonic interval a run measured; a sample counts only if it lies wholly inside."""

    start: float
    end: float

    def holds(self, sample: Sample) -> bool:
        return self.start <= sample.started <= sample.ended <= self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


def keep_in_window(samples: Iterable[Sample], window: Window) -> tuple[list[Sample], int]:
    """The samples inside `window`, and how many were rejected (started early, ended late, or ran
    backwards): a stray from a warm-up or a previous run must not shift a percentile."""
    kept, rejected = [], 0
    for sample in samples:
        if window.holds(sample):
            kept.append(sample)
        else:
            rejected += 1
    return kept, rejected


def latency_metrics(samples: Sequence[Sample], prefix: str = "latency") -> dict[str, float]:
    return centile_metrics([s.seconds * 1000 for s in samples], prefix)


def centile_metrics(milliseconds: Iterable[float], prefix: str) -> dict[str, float]:
    """`<prefix>_p50_ms`, `_p99_ms` and `_mean_ms` of `milliseconds` (none when there are none)."""
    ms = sorted(milliseconds)
    if not ms:
        return {}
    return {f"{prefix}_p50_ms": ms[len(ms) // 2], f"{prefix}_p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            f"{prefix}_mean_ms": statistics.fmean(ms)}


# -- results ----------------------------------------------------------------------------------------

@dataclass
class RunResult:
    """One measured point of one scenario, and whether its gate held."""

    scenario: str
    point: str  # e.g. "1x8" (processes x permits) or "c=4"
    params: dict[str, Any]
    headline: str  # the metric the summary averages
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = False
    error: str | None = None
    rejected_samples: int = 0
    window_seconds: float = 0.0
    repeat: int = 0

    @property
    def value(self) -> float | None:
        return self.metrics.get(self.headline)


@dataclass(frozen=True)
class Baseline:
    """What bounds us, measured in the same run on the same server."""

    tool: str  # pgbench-insert | pgbench-claim | <peer>-enqueue | <peer>-execute | <peer> (a note: not installed)
    clients: int
    per_second: float | None
    note: str = ""


@dataclass
class BenchResult:
    profile: str
    seed: int
    started_at: str
    runs: list[RunResult]
    baselines: list[Baseline]
    environment: dict[str, Any]
    seconds: float = 0.0

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.runs)

    def as_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "seed": self.seed, "started_at": self.started_at,
                "seconds": self.seconds, "environment": self.environment,
                "runs": [asdict(r) for r in self.runs], "baselines": [asdict(b) for b in self.baselines],
                "summary": self.summary()}


def summarize(runs: Iterable[RunResult]) -> list[dict[str, Any]]:
    """Per scenario point: the mean headline over the runs that passed their gate. Failed runs are
    counted and named, never averaged in."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.scenario, run.point), []).append(run)
    rows = []
    for (scenario, point), group in groups.items():
        passed = [r for r in group if r.passed and r.value is not None]
        rows.append({"scenario": scenario, "point": point, "headline": group[0].headline,
                     "mean": statistics.fmean(r.value for r in passed) if passed else None,
                     "runs_passed": len(passed), "runs_failed": sum(not r.passed for r in group)})
    return rows


@dataclass
class Measured:
    """What a scenario body hands back: its metrics, timed samples, gate rows and measured window."""

    metrics: dict[str, Any]
    passed: bool
    checks: list[dict[str, Any]]
    samples: list[Sample] = field(default_factory=list)
    window: Window | None = None


def worker_time_metrics(stats: list[dict[str, Any]], jobs: int | None = None) -> dict[str, Any]:
    """Where the workers' time went: mean claim, charge and finalize latency, pool waits, jobs per claim,
    and (given the run's `jobs`) the workers' CPU per job while they ran and how many times each job was
    claimed (above 1: jobs claimed twice, as without skip_locked)."""
    def total(key: str) -> float:
        return sum(s.get(key, 0) for s in stats)

    def pool_total(key: str) -> float:
        return sum(s.get("pool", {}).get(key, 0) for s in stats)

    claims, finalizes, handled = total("claim_calls"), total("finalize_calls"), total("handler_calls")
    pool_requests = pool_total("requests_num")
    return {
        "claim_mean_ms": 1000 * total("claim_seconds_total") / claims if claims else None,
        # The mean handler run (a charge's HTTP call in the charge scenarios); the key keeps its name because
        # results.json files already saved, and report.py reading them, use it.
        "charge_mean_ms": 1000 * total("handler_seconds_total") / handled if handled else None,
        "finalize_mean_ms": 1000 * total("finalize_seconds_total") / finalizes if finalizes else None,
        "jobs_per_claim": total("claimed") / claims if claims else None,
        "claimed_with_a_success": total("claimed_with_a_success"),
        "jobs_per_success_commit": total("succeeded") / total("success_commits") if total("success_commits") else None,
        "claim_calls": claims,
        "pool_requests": pool_requests,
        "pool_queued": pool_total("requests_queued"),
        "pool_wait_mean_ms": pool_total("requests_wait_ms") / pool_requests if pool_requests else None,
        "lost_finalizes": total("lost_finalizes"),
        "in_flight_peak": max((s.get("in_flight_peak", 0) for s in stats), default=0),
        "worker_cpu_ms_per_job": 1000 * total("cpu_seconds") / jobs if jobs else None,
        "claims_per_job": total("claimed") / jobs if jobs else None,
    }
