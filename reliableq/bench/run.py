"""`reliableq bench` as one call: run the named scenarios (all by default) and write every result file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reliableq.bench import report
from reliableq.bench.profiles import Profile
from reliableq.bench.results import BenchResult
from reliableq.bench.runner import Bench
from reliableq.bench.scenarios import SCENARIOS


async def run_bench(profile: Profile, out_dir: Path, scenarios: Sequence[str] | None = None, seed: int = 0,
                    progress: bool = True, off: Sequence[str] = (), baselines: bool = True,
                    note: str = "") -> BenchResult:
    """Run the scenarios (default: every one the profile does not leave to full) and write every result file
    into `out_dir`. `note`: kept with the machine's description, e.g. what else ran on it."""
    unknown = set(scenarios or ()) - set(SCENARIOS)
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(sorted(unknown))}; expected {', '.join(SCENARIOS)}")
    names = scenarios or [name for name in SCENARIOS if name not in profile.left_to_full]
    chosen = [SCENARIOS[name] for name in names]
    bench = Bench(profile, out_dir, chosen, seed, progress, off, baselines, note)
    result = await bench.run()
    report.write(result, out_dir)
    return result
