"""The one checker of every exercise, for the CLI and the notebooks alike.

A check loads the learner's code (a clear error at their line if it cannot be), then runs numbered steps,
each said as it begins: the exercise's forced schedules (deterministic: the interleavings, clocks and
whole input ranges that break each class of mistake, each naming the mistake it shows); the stage's
failure scenario with the learner's piece in the real system, its seed fixed; the earlier exercises
again where their stage runs a piece that may have changed since they passed; then seeded chaos runs
with every piece in every worker, every invariant checked. It stops at the first step that fails and
says which invariant broke, with the rows (or the shortest history) that broke it and the one command
that replays that run. A check that could not run (no database, a server that would not start) is
neither a pass nor a failure. What this does not do: remember progress (workspace.py does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial

import psycopg

from reliableq import db
from reliableq.config import Mechanisms
from reliableq.lab.chaos import ChaosConfig, ChaosReport, run_chaos
from reliableq.lab.exercises.exercise import Exercise, in_play
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioResult
from reliableq.lab.waiting import report_step

# A chaos run small enough that several fit in a minute on 2 cores, with every kind of fault in it. Every
# check it makes can fire at these settings (tests/exercises/test_checker_chaos.py shows each one): a
# budget of 20 attempts leaves the jobs the outage meets enough retries to break its bound of 5 requests
# per job, which a budget of 5 never could. A lease of 1 s leaves a live worker 0.67 s between renewals
# to spare: with 0.5 s, a worker starved of CPU for 0.8 s beside two CPU-burning processes lost a lease
# (1 reference check in 10 failed "a lease was lost only by a crashed or stalled worker").
# Fairness off, except for the exercise that writes the fair claim: the first-in-first-out claim is the one
# the skip-locked and leases exercises write, and with fairness on it never runs. Then every job is one
# tenant's (no quiet tenants): with chaos's flood of one tenant ahead of a few quiet ones, first in first
# out breaks the fairness invariant whoever wrote the claim. The fair claim's own check has the mix.
CHAOS = ChaosConfig(jobs=40, lease_seconds=1.0, settle_seconds=30.0, max_attempts=20, quiet_tenants=0,
                    mechanisms=Mechanisms().without("fairness"))
# Chaos is the second net, after the forced schedules: two seeds (4 s each on 2 cores).
DEFAULT_SEEDS = 2
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
                earlier: Sequence[tuple[Exercise, str]] = (),
                progress: Callable[[str], None] | None = None) -> CheckResult:
    """Grade `text`, the learner's file for `exercise`. `earlier`: the exercises of earlier stages with the
    code to run for each (the learner's passed solution, or the reference); their pieces run beside this
    one everywhere, and each one whose stage runs a piece that may have changed since it passed has its
    forced schedules and scenario run again, so a regression is named. `progress` is told each step as it
    begins ("step 4/9: chaos seed 1"), and so is the status line of a watched run (a panel's)."""
    began = time.monotonic()
    result = CheckResult(exercise.name, Outcome.FAILED)
    replay = _replay(exercise, seed)
    step = "loading your code"
    try:
        pieces = exercise.load(text)
        # Latest stage first: where two exercises replace the same query (03 and 04 both write the claim),
        # the later stage's version is the one that runs.
        for before, code in reversed(earlier):
            pieces = pieces.beside(before.load(code))
        again = [before for before, _ in earlier if _may_have_changed(before, exercise, earlier)]
        plan: list[tuple[str, Callable[[], Awaitable[bool]]]] = []
        if exercise.direct is not None:
            plan.append(("forced schedules", partial(_direct_held, result, exercise, pieces, seed, replay)))
        plan.append((f"stage {exercise.stage_number:02d}'s scenario (seed {seed})",
                     partial(_scenario_held, result, exercise, pieces, seed, replay)))
        plan += [(f"exercise {before.name} again (stage {before.stage_number:02d})",
                  partial(_held_again, result, before, pieces, seed, replay)) for before in again]
        plan += [(f"chaos seed {chaos_seed}", partial(_chaos_held, result, exercise, pieces, chaos_seed, earlier))
                 for chaos_seed in range(seed, seed + seeds)]
        for number, (step, run) in enumerate(plan, 1):
            said = f"step {number}/{len(plan)}: {step}"
            report_step(said)
            if progress is not None:
                progress(said)
            if not await run():
                return _done(result, began)
            result.checked.append(step)
    except LearnerError as error:
        during = f" (while {step} ran)" if step.startswith("exercise ") else ""
        result.lines.append(f"✗ Your code could not be used{during}: {error}")
        return _done(result, began)
    except TimeoutError as error:
        result.lines += [f"✗ The run did not finish ({step}): {error or 'it passed the deadline'}. "
                         "A loop that never ends, or a statement that waits for a lock, looks like this.",
                         f"  Replay it: {replay}"]
        return _done(result, began)
    except psycopg.Error as error:
        if _unreachable(error):
            return _could_not_run(result, step, error, began)
        # Most likely the learner's SQL, with parameters its one try did not meet (a type, a NULL where a value
        # must be): a verdict at the step, not a traceback.
        result.lines += [f"✗ PostgreSQL refused a statement during {step} (your SQL runs there): "
                         f"{error.diag.message_primary or error} [{error.sqlstate}]", f"  Replay it: {replay}"]
        return _done(result, began)
    except (db.DatabaseUnavailable, OSError) as error:
        return _could_not_run(result, step, error, began)
    result.outcome = Outcome.PASSED
    result.lines.append(f"✓ {exercise.name} passed: {', '.join(result.checked)}.")
    skipped = [before.name for before, _ in earlier if before not in again]
    if skipped:
        result.lines.append(f"  Not run again, as nothing that may have changed since they passed runs in their "
                            f"stages: {', '.join(skipped)}.")
    return _done(result, began)


def _unreachable(error: psycopg.Error) -> bool:
    """Whether `error` is the server's absence (no connection, a dropped one, a pool timeout), not a
    refusal of what was sent: an OperationalError without an SQLSTATE, or of class 08 (connection) or
    57P (the server shutting down)."""
    state = error.sqlstate or ""
    return isinstance(error, psycopg.OperationalError) and (not state or state.startswith(("08", "57P")))


def _could_not_run(result: CheckResult, step: str, error: BaseException, began: float) -> CheckResult:
    result.outcome = Outcome.COULD_NOT_RUN
    reason = str(error).splitlines()[0]
    result.lines.append(f"? The check could not run {step} (no verdict: {', '.join(result.checked)} held before "
                        f"it): {reason}" if result.checked else
                        f"? The check could not run (nothing was graded): {reason}")
    return _done(result, began)


def _may_have_changed(before: Exercise, exercise: Exercise, earlier: Sequence[tuple[Exercise, str]]) -> bool:
    """Whether `before`'s stage runs a piece that may have changed since `before` was graded: the piece
    being checked, or a later exercise's learner code (a reference is graded with every stage by the lab's
    own tests). Nothing else can change what `before`'s forced schedules and scenario see."""
    stage_mechanisms = Mechanisms.up_to(before.name.replace("-", "_"))
    later = [exercise] + [other for other, code in earlier
                          if other.stage_number > before.stage_number and code != other.reference]
    return any(in_play(other, stage_mechanisms) for other in later)


async def _direct_held(result: CheckResult, exercise: Exercise, pieces: Pieces, seed: int, replay: str) -> bool:
    # A list, not a generator: every forced schedule's verdict is said, each naming its own mistake.
    return all([_held(result, one, replay) for one in await exercise.direct(pieces, seed)])


async def _scenario_held(result: CheckResult, exercise: Exercise, pieces: Pieces, seed: int, replay: str,
                         shown: bool = True) -> bool:
    async with asyncio.timeout(SCENARIO_DEADLINE_SECONDS):  # not wait_for: it can lose a Stop (reliableq.cancelling)
        scenario, run = await exercise.scenario(pieces, seed)
    if shown:
        result.run = run
    return _held(result, scenario, replay)


async def _held_again(result: CheckResult, before: Exercise, pieces: Pieces, seed: int, replay: str) -> bool:
    """An earlier stage's exercise run again with every piece in place: its forced schedules, then its
    scenario; if either breaks, named as that exercise's regression."""
    failures_before = len(result.lines)
    held = ((before.direct is None or await _direct_held(result, before, pieces, seed, replay))
            and await _scenario_held(result, before, pieces, seed, replay, shown=False))
    if not held:
        result.lines.insert(failures_before, f"✗ Regressed: exercise {before.name} (stage "
                                             f"{before.stage_number:02d}) no longer holds with your new code.")
    return held


async def _chaos_held(result: CheckResult, exercise: Exercise, pieces: Pieces, chaos_seed: int,
                      earlier: Sequence[tuple[Exercise, str]]) -> bool:
    config = replace(CHAOS, seed=chaos_seed, pieces=pieces)
    if not in_play(exercise, CHAOS.mechanisms):  # the fair claim: every mechanism on, the tenants mixed
        config = replace(config, mechanisms=Mechanisms(), quiet_tenants=ChaosConfig.quiet_tenants)
    try:
        async with asyncio.timeout(CHAOS_DEADLINE_SECONDS):
            report = await run_chaos(config)
    except RuntimeError as error:  # the run could not go on: the API refused a submission (500)
        # A learner's accept that raised inside the API recorded where: say that line instead.
        for learner_error in getattr(pieces.submission_order, "errors", ()):
            raise learner_error from None
        result.lines += [f"✗ Broken under chaos (seed {chaos_seed}): {str(error).splitlines()[0]}",
                         _whose(exercise, earlier), f"  Replay it: {_replay(exercise, chaos_seed)}"]
        return False
    if not report.ok:
        result.lines += _chaos_failure(exercise, report, earlier)
        return False
    return True


def _whose(exercise: Exercise, earlier: Sequence[tuple[Exercise, str]]) -> str:
    """Whose code ran in a chaos run (every piece in every worker): a failure there may be in any of it."""
    yours = [before.name for before, code in earlier if code != before.reference]
    return (f"  Your code in this run: {', '.join([*yours, exercise.name])}"
            + ("; the other exercises' pieces are the references." if len(yours) < len(earlier) else "."))


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


def _chaos_failure(exercise: Exercise, report: ChaosReport, earlier: Sequence[tuple[Exercise, str]]) -> list[str]:
    seed = report.config.seed
    broken = [check for check in report.checks if not check.held]
    lines = [f"✗ Broken under chaos (seed {seed}): {'; '.join(check.name for check in broken)}",
             _whose(exercise, earlier)]
    history = report.shortest_broken_history()
    if history:
        lines.append(f"  Shortest history that broke it ({report.label(history[0].job_id)}):")
        lines += [f"    {e.seconds:7.3f}s  {e.worker:<14} {e.kind:<14} {e.detail}" for e in history]
    lines.append(f"  Replay it: {_replay(exercise, seed)}")
    return lines


def _done(result: CheckResult, began: float) -> CheckResult:
    result.seconds = time.monotonic() - began
    return result
