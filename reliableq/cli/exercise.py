"""`reliableq exercise`: list, start, check, hint, solution, reset, and mutants (the checker graded by
mutants of each reference). Every learner's verb takes --workspace DIR.

Exit codes of `check`: 0 passed, 1 failed, 2 could not run (or a usage error); the same checker as the
notebooks' Check button (reliableq/lab/exercises/checker.py). Of `mutants`: 0 every mutant rejected,
refused or shown equivalent, 1 otherwise (reliableq/lab/exercises/mutants.py)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from reliableq.cli.arguments import UsageError
from reliableq.lab import exercises
from reliableq.lab.exercises import mutants
from reliableq.lab.exercises.checker import check
from reliableq.lab.exercises.workspace import Workspace


def cmd_exercise(args: argparse.Namespace) -> int:
    if args.action == "mutants":
        return _mutants(args)
    workspace = Workspace(Path(args.workspace))
    if args.action == "list":
        width = max(len(exercise.name) for exercise in exercises.EXERCISES.values())
        for exercise in exercises.EXERCISES.values():
            print(f"{exercise.stage_number:02d} {exercise.name:<{width}} {workspace.state(exercise):<8} "
                  f"{exercise.summary}")
        return 0
    exercise = _exercise(args.name)
    if args.action == "start":
        path, written = workspace.start(exercise)
        print(f"{'Wrote the starter to' if written else 'Your file is already there:'} {path}. Edit it, then: "
              f"reliableq exercise check {exercise.name}")
        return 0
    if args.action == "reset":
        path, backup = workspace.reset(exercise)
        print(f"The starter is back in {path}" + (f"; your version is in {backup}." if backup else "."))
        return 0
    if args.action == "hint":
        number, hint = workspace.next_hint(exercise)
        print(f"Hint {number} of {len(exercise.hints)}: {hint}")
        return 0
    if args.action == "solution":
        if workspace.state(exercise) != "passed" and not args.give_up:
            raise UsageError(f"the solution shows after a pass; to see it now: "
                             f"reliableq exercise solution {exercise.name} --give-up")
        print(exercise.reference.rstrip() + "\n\nWhy it works: " + exercise.why)
        return 0
    text = workspace.read(exercise)
    if text is None:
        raise UsageError(f"no {workspace.path(exercise)} yet: reliableq exercise start {exercise.name}")
    earlier = exercises.earlier_code(exercise, workspace)
    result = asyncio.run(check(exercise, text, seed=args.seed, seeds=args.seeds, earlier=earlier,
                               progress=lambda step: print(f"… {step}", flush=True)))
    print(result.text())
    print(f"({result.seconds:.0f} s)")
    if result.outcome.exit_code < 2:
        workspace.record(exercise, state="passed" if result.outcome.exit_code == 0 else "failing")
    return result.outcome.exit_code


def _mutants(args: argparse.Namespace) -> int:
    names = [_exercise(args.name).name] if args.name else list(exercises.EXERCISES)
    lines, wrong = mutants.main(names, args.sample, args.seed,
                                progress=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(lines))
    return 1 if wrong else 0


def _exercise(name: str | None) -> exercises.Exercise:
    if name is None:
        raise UsageError(f"name an exercise: {', '.join(exercises.EXERCISES)}")
    try:
        return exercises.get(name)
    except ValueError as error:
        raise UsageError(str(error)) from None
