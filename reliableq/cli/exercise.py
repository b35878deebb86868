"""`reliableq exercise`: list, start, check, hint, solution, reset, progress and room (a learner's and a
room's progress), and mutants (the checker graded by mutants of each reference). Every learner's verb
works in one workspace, the notebooks' (reliableq/lab/places.py), unless --workspace names another.

Exit codes of `check`: 0 passed, 1 failed, 2 could not run (or a usage error); the same checker as the
notebooks' Check button (reliableq/lab/exercises/checker.py). Of `mutants`: 0 every mutant rejected,
refused or shown equivalent, 1 otherwise (reliableq/lab/exercises/mutants.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from pathlib import Path

from reliableq.cli.arguments import UsageError
from reliableq.lab import exercises
from reliableq.lab.exercises import mutants, progress
from reliableq.lab.exercises.checker import DEFAULT_SEEDS, check
from reliableq.lab.exercises.workspace import Workspace


def cmd_exercise(args: argparse.Namespace) -> int:
    if args.action == "mutants":
        return _mutants(args)
    if args.action == "room":
        if args.name is None:
            raise UsageError("name the folder of the room's records: reliableq exercise room DIR")
        print("\n".join(progress.room(Path(args.name))))
        return 0
    workspace = Workspace(Path(args.workspace) if args.workspace else None)
    if args.action in ("list", "progress"):
        taken = progress.snapshot(workspace, exercises.EXERCISES.values(), args.learner or progress.learner_name())
        if args.json:
            print(json.dumps(taken, indent=2))
        elif args.action == "list":
            _list(workspace)
        else:
            print(progress.line(taken))
        if args.action == "progress" and args.to:
            print(f"written to {progress.write(taken, Path(args.to))}", file=sys.stderr)
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
        print(workspace.next_hint(exercise))
        return 0
    if args.action == "solution":
        if workspace.state(exercise) != "passed" and not args.give_up:
            raise UsageError(f"the solution shows after a pass; to see it now: "
                             f"reliableq exercise solution {exercise.name} --give-up")
        # As comments of the file's language: the whole output pasted into the file still checks.
        comment = "--" if exercise.filename.endswith(".sql") else "#"
        why = textwrap.wrap("Why it works: " + exercise.why, 100)
        print(exercise.reference.rstrip() + "\n\n" + "\n".join(f"{comment} {line}" for line in why))
        return 0
    text = workspace.read(exercise)
    if text is None:
        raise UsageError(f"no {workspace.path(exercise)} yet: reliableq exercise start {exercise.name}")
    earlier = exercises.earlier_code(exercise, workspace)
    seeds = DEFAULT_SEEDS if args.seeds is None else args.seeds
    result = asyncio.run(check(exercise, text, seed=args.seed, seeds=seeds, earlier=earlier,
                               progress=lambda step: print(f"… {step}", flush=True)))
    print(result.text())
    print(f"({result.seconds:.0f} s)")
    if result.outcome.exit_code < 2:
        workspace.record_check(exercise, text, result.outcome.exit_code == 0, result.lines)
    return result.outcome.exit_code


def _list(workspace: Workspace) -> None:
    width = max(len(exercise.name) for exercise in exercises.EXERCISES.values())
    print(f"workspace: {workspace.folder}")
    for exercise in exercises.EXERCISES.values():
        print(f"{exercise.stage_number:02d} {exercise.name:<{width}} {workspace.state(exercise):<8} "
              f"{exercise.summary}")


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
