"""The one checker of every exercise, for the CLI and the notebooks alike.

A check runs, in order: the learner's code loaded (a clear error at their line if it cannot be); the
stage's failure scenario with the learner's piece in the real system, its seed fixed; the exercise's
direct checks of that code (many seeded answers of a policy); then seeded chaos runs with the piece in
every worker, every invariant checked. It stops at the first part that fails and says which invariant
broke, with the shortest history that broke it and the one command that replays that run. A check that
could not run (no database, a server that would not start) is neither a pass nor a failure. What this
does not do: remember progress (workspace.py does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import psycopg

from reliableq import db
from reliableq.lab.chaos import ChaosConfig, ChaosReport, run_chaos
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioResult

# A chaos run small enough that several fit in a minute on 2 cores, with every kind of fault in it.
CHAOS = ChaosConfig(jobs=40, lease_seconds=0.5, settle_seconds=30.0)
DEFAULT_SEEDS = 3
SCENARIO_DEADLINE_SECONDS = 120.0  # a whole run, so a learner's endless loop or lock wait still ends
CHAOS_DEADLINE_SECONDS = 120.0


class Outcome(Enum):
    PASSED = "passed"
    FAILED = "failed"
    COULD_NOT_RUN = "could not run"

    @property
    def exit_code(self) -> int:
        return {Outcome.PASSED: 0, Outcome.FAILED: 1, Outcome.COULD_NOT_RUN: 2}[self]


@dataclass
class CheckResult:
    exercise: str
    outcome: Outcome
    lines: list[str] = field(default_factory=list)  # what to show, in order
    checked: list[str] = field(default_factory=list)  # the parts that ran and held
    run: ScenarioResult | None = None  # the stage's scenario with the learner's code, once it ran
    seconds: float = 0.0

    def text(self) -> str:
        return "\n".join(self.lines)


async def check(exercise: Exercise, text: str, seed: int = 1, seeds: int = DEFAULT_SEEDS,
                earlier: Sequence[tuple[Exercise, str]] = ()) -> CheckResult:
    """Grade `text`, the learner's file for `exercise`. `earlier`: the exercises of earlier stages with the
    code to run for each (the learner's passed solution, or the reference); their pieces run beside this
    one everywhere, and each one's own scenario and direct checks run again, so a regression is named."""
    began = time.monotonic()
    result = CheckResult(exercise.name, Outcome.FAILED)
    replay = _replay(exercise, seed)
    try:
        pieces = exercise.load(text)
        # Latest stage first: where two exercises replace the same query (03 and 04 both write the claim),
        # the later stage's version is the one that runs.
        for before, code in reversed(earlier):
            pieces = pieces.beside(before.load(code))
        if not await _stage_held(result, exercise, pieces, seed, replay):
            return _done(result, began)
        for before, _ in earlier:
            if not await _stage_held(result, before, pieces, seed, replay, regressed=True):
                return _done(result, began)
        for chaos_seed in range(seed, seed + seeds):
            config = replace(CHAOS, seed=chaos_seed, pieces=pieces)
            try:
                report = await asyncio.wait_for(run_chaos(config), CHAOS_DEADLINE_SECONDS)
            except RuntimeError as error:  # the run could not go on: the API refused a submission (500)
                # A learner's accept that raised inside the API recorded where: say that line instead.
                for learner_error in getattr(pieces.submission_order, "errors", ()):
                    raise learner_error from None
                result.lines += [f"✗ Broken under chaos (seed {chaos_seed}): {str(error).splitlines()[0]}",
                                 f"  Replay it: {_replay(exercise, chaos_seed)}"]
                return _done(result, began)
            if not report.ok:
                result.lines += _chaos_failure(exercise, report)
                return _done(result, began)
            result.checked.append(f"chaos seed {chaos_seed}")
    except LearnerError as error:
        result.lines.append(f"✗ Your code could not be used: {error}")
        return _done(result, began)
    except TimeoutError as error:
        result.lines += [f"✗ The run did not finish: {error or 'it passed the deadline'}. "
                         "A loop that never ends, or a statement that waits for a lock, looks like this.",
                         f"  Replay it: {replay}"]
        return _done(result, began)
    except (db.DatabaseUnavailable, psycopg.OperationalError, OSError) as error:
        result.outcome = Outcome.COULD_NOT_RUN
        result.lines.append(f"? The check could not run (nothing was graded): {str(error).splitlines()[0]}")
        return _done(result, began)
    result.outcome = Outcome.PASSED
    result.lines.append(f"✓ {exercise.name} passed: {', '.join(result.checked)}.")
    return _done(result, began)


async def _stage_held(result: CheckResult, exercise: Exercise, pieces: Pieces, seed: int, replay: str,
                      regressed: bool = False) -> bool:
    """`exercise`'s scenario, then its direct checks, with `pieces`; whether all held. `regressed`: this is
    an earlier stage's exercise, run again to see that the new piece broke nothing of it."""
    failures_before = len(result.lines)
    # The forced schedules first: each names the learner's mistake in the one interleaving that shows it,
    # where the stage's scenario would show a symptom of it later.
    held = True
    if exercise.direct is not None:
        held = all(_held(result, one, replay) for one in await exercise.direct(pieces, seed))
        if held and not regressed:
            result.checked.append("forced schedules")
    if held:
        scenario, run = await asyncio.wait_for(exercise.scenario(pieces, seed), SCENARIO_DEADLINE_SECONDS)
        if not regressed:
            result.run = run
        held = _held(result, scenario, replay)
        if held and not regressed:
            result.checked.append(f"stage {exercise.stage_number:02d}'s scenario (seed {seed})")
    if regressed:
        if held:
            result.checked.append(f"exercise {exercise.name} again (stage {exercise.stage_number:02d})")
        else:
            result.lines.insert(failures_before, f"✗ Regressed: exercise {exercise.name} (stage "
                                                 f"{exercise.stage_number:02d}) no longer holds with your new code.")
    return held


def _held(result: CheckResult, check: Check, replay: str) -> bool:
    """Whether `check` held; if not, its failure said in the result."""
    if check.held:
        return True
    result.lines.append(f"✗ Broken: {check.name}" + (f" [{check.note}]" if check.note else ""))
    result.lines += [f"  {_said(row)}" for row in check.violations[:5]]
    if len(check.violations) > 5:
        result.lines.append(f"  … and {len(check.violations) - 5} more")
    result.lines.append(f"  Replay it: {replay}")
    return False


def _said(row: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in row.items())


def _replay(exercise: Exercise, seed: int) -> str:
    """The one command that runs exactly this run again."""
    return f"reliableq exercise check {exercise.name} --seed {seed} --seeds 1"


def _chaos_failure(exercise: Exercise, report: ChaosReport) -> list[str]:
    seed = report.config.seed
    broken = [check for check in report.checks if not check.held]
    lines = [f"✗ Broken under chaos (seed {seed}): {'; '.join(check.name for check in broken)}"]
    history = report.shortest_broken_history()
    if history:
        lines.append(f"  Shortest history that broke it ({report.label(history[0].job_id)}):")
        lines += [f"    {e.seconds:7.3f}s  {e.worker:<14} {e.kind:<14} {e.detail}" for e in history]
    lines.append(f"  Replay it: {_replay(exercise, seed)}")
    return lines


def _done(result: CheckResult, began: float) -> CheckResult:
    result.seconds = time.monotonic() - began
    return result
