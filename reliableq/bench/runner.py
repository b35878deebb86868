"""The benchmark's runner: the chosen scenarios at every point of the profile, each point measured and
gated, failed runs kept apart, then the baselines; returns the whole result.

Template databases are made once per bench, so each run's fresh databases are a cheap copy. What the
scenarios are is `reliableq.bench.scenarios`; the files are written by `reliableq.bench.report`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reliableq import db
from reliableq.bench.baselines import baseline_steps, measure_baselines
from reliableq.bench.profiles import Profile
from reliableq.bench.progress import Progress
from reliableq.bench.results import BenchResult, Measured, RunResult, Window, keep_in_window, latency_metrics
from reliableq.config import Mechanisms


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str  # one line for the report
    steps: Callable[[Profile], int]  # runs per repeat, for the progress bar
    body: Callable[[Bench, int], Awaitable[None]]


class Bench:
    """One bench: `scenarios` in order, `profile.repeats` times, then (with `baselines`) what bounds them."""

    def __init__(self, profile: Profile, out_dir: Path, scenarios: Sequence[Scenario], seed: int = 0,
                 progress: bool = True, off: Sequence[str] = (), baselines: bool = True, note: str = "") -> None:
        self.profile, self.out_dir, self.seed, self.note = profile, out_dir, seed, note
        self.chosen = list(scenarios)
        self.scenarios = [scenario.name for scenario in self.chosen]
        # Switched off in every process of every run (the gate's own tests break runs so).
        self.mechanisms = Mechanisms().with_flags(**{name: False for name in off})
        self.with_baselines = baselines
        self.progress = Progress(sum(s.steps(profile) for s in self.chosen) * profile.repeats
                                 + (baseline_steps(profile, self.scenarios) if baselines else 0), enabled=progress)
        self.runs: list[RunResult] = []

    async def run(self) -> BenchResult:
        started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        load_before = os.getloadavg()[0]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.progress.show("starting")
            for repeat in range(self.profile.repeats):
                for scenario in self.chosen:
                    await scenario.body(self, repeat)
            baselines = (await measure_baselines(self.profile, self.scenarios, self.progress)
                         if self.with_baselines else [])
        finally:
            self.progress.close()
        return BenchResult(self.profile.name, self.seed, started_at, self.runs, baselines,
                           environment(load_before, self.note), time.monotonic() - started)

    async def measure(self, scenario: str, point: str, params: dict[str, Any], headline: str, repeat: int,
                      body: Callable[[], Awaitable[Measured]], timeout: float | None = None) -> RunResult:
        """Run one point; any error or broken invariant makes it a failed run, kept apart from averages.
        `timeout`: seconds the point may take (default: the profile's settle time and a minute)."""
        result = RunResult(scenario, point, params, headline, repeat=repeat)
        started = time.monotonic()
        try:
            measured = await asyncio.wait_for(body(), timeout or self.profile.settle_seconds + 60)
            window = measured.window or Window(started, time.monotonic())
            kept, result.rejected_samples = keep_in_window(measured.samples, window)
            result.metrics = measured.metrics | latency_metrics(kept)
            result.checks, result.passed = measured.checks, measured.passed
            result.window_seconds = window.seconds
        except Exception as error:  # a run that cannot finish is a failed run, reported with its reason
            result.error = f"{type(error).__name__}: {error}"[:500]
            result.passed = False
        self.runs.append(result)
        self.progress.step(f"{scenario} {point}" + ("" if result.passed else "  FAILED"))
        return result


def environment(load_before: float, note: str = "") -> dict[str, Any]:
    """The machine the figures belong to: its CPUs, PostgreSQL, and how busy it was (the 1-minute load
    average as the bench began and as it ended: above the bench's own share, something else ran too)."""
    import platform
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "cpu_model": cpu_model(), "postgresql": server_version(),
            "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded PostgreSQL",
            "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2),
            "note": note}


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (/proc/cpuinfo); None elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)


def server_version() -> str | None:
    """The version the PostgreSQL server reports (`SHOW server_version`); None if it cannot be reached."""
    try:
        with db.connect(db.server_url()) as conn:
            return conn.info.parameter_status("server_version")
    except db.DatabaseUnavailable:
        return None
