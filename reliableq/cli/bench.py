"""`reliableq bench`: the benchmark, from the command line."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from reliableq.cli.arguments import UsageError, run_coroutine


def cmd_bench(args: argparse.Namespace) -> int:
    from reliableq.bench.profiles import PROFILES
    from reliableq.bench.report import link_latest, write_reference
    from reliableq.bench.run import run_bench
    from reliableq.bench.scenarios import SCENARIOS
    from reliableq.lab.places import bench_runs, reference_bench_results, shown
    scenarios = [n.strip() for n in (args.scenarios or "").split(",") if n.strip()] or None
    unknown = set(scenarios or ()) - set(SCENARIOS)
    if unknown:
        raise UsageError(f"--scenarios: unknown {', '.join(sorted(unknown))}; expected {', '.join(SCENARIOS)}")
    out = Path(args.out) if args.out else bench_runs() / time.strftime("%Y%m%d-%H%M%S")
    result = run_coroutine(run_bench(PROFILES[args.profile], out, scenarios, seed=args.seed,
                                     progress=not args.no_progress, note=args.note))
    if not args.out:
        link_latest(out)
    failed = [r for r in result.runs if not r.passed]
    print(f"{len(result.runs) - len(failed)}/{len(result.runs)} runs passed their gate; report: "
          f"{shown(out / 'report.md')}")
    if args.reference:
        written = write_reference(out, reference_bench_results())
        print(f"reference for notebook 13: {len(written)} files in {shown(written[0].parent)}")
    return 1 if failed else 0
