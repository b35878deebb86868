"""The checker's mutation score: mutants of each exercise's reference, each graded by the real checker.

A mutant is the reference with one plausible mistake in it (mutants_sql.py edits PostgreSQL's syntax
tree, mutants_python.py Python's). The checker grades it as a learner's file: its deterministic part
only (the forced schedules and the stage's scenario, seed 1, no chaos: a mistake must be caught by what
is forced, not by chaos luck), beside the earlier exercises' references as a learner's first check is
(an earlier stage runs again only where the mutant's piece runs in it). Each mutant is then:

    rejected    the checker failed it
    refused     the checker would not use it, saying why ("could not be used")
    equivalent  it passed, and EQUIVALENT (mutants_equivalent.py) says why it behaves as the reference
                does; a differential run of mutant and reference (mutants_differential.py: the whole
                input domain of a pure piece, the forced schedules of SQL) must agree, or it counts as
                survived
    survived    it passed and nothing says why: a false accept waiting for a learner
    crashed     the checker raised instead of giving a verdict (a learner would see a traceback)

What this does not guarantee: that the operators make every mistake a learner can; a score says how
much of what they make the checker catches.
"""

from __future__ import annotations

import asyncio
import difflib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from reliableq.finalize_decision import DECISIONS
from reliableq.lab.exercises import EXERCISES, mutants_python, mutants_sql
from reliableq.lab.exercises.checker import CheckResult, Outcome, check
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.mutant import Mutant
from reliableq.lab.exercises.mutants_differential import CHECK_SEED, SQL_EXERCISES, differential
from reliableq.lab.exercises.mutants_equivalent import EQUIVALENT

ANSWERS = {"dead": DECISIONS}  # the strings a Python exercise's function may return, swapped for one another


def mutants_of(exercise: Exercise, operators: Collection[str] | None = None) -> tuple[str, list[Mutant]]:
    """The baseline (the reference as the operators print it, so that each mutant differs from it by one
    edit) and every mutant of `exercise`'s reference (of `operators` only, if given), in a fixed order."""
    if exercise.name in SQL_EXERCISES:
        return mutants_sql.mutants(exercise.reference, operators)
    baseline, made = mutants_python.mutants(exercise.reference, ANSWERS.get(exercise.name, ()))
    return baseline, [m for m in made if operators is None or m.operator in operators]


def sample(mutants: list[Mutant], n: int | None, seed: int, exercise: str) -> list[Mutant]:
    """`n` of `mutants`, the same ones for the same seed, in their own order; all of them if n is None."""
    if n is None or n >= len(mutants):
        return mutants
    rng = random.Random(f"{seed}:{exercise}")
    return [mutants[i] for i in sorted(rng.sample(range(len(mutants)), n))]


class Fate(Enum):
    REJECTED = "rejected"
    REFUSED = "refused"
    EQUIVALENT = "equivalent"
    SURVIVED = "survived"
    CRASHED = "crashed"


FATES = tuple(Fate)


@dataclass(frozen=True)
class Judged:
    mutant: Mutant
    fate: Fate
    said: str  # the checker's first line, the crash, the equivalence reason or why it is not one


Checker = Callable[..., Awaitable[CheckResult]]
# A right answer's deterministic part takes a few seconds; a mutant that makes a run wait out the checker's
# own deadlines (minutes) is failed by them, so the score stops waiting sooner.
MUTANT_SECONDS = 60.0


def references_before(exercise: Exercise) -> list[tuple[Exercise, str]]:
    """What a learner's first check of `exercise` runs beside it: the earlier exercises' references. Where
    the mutant's piece runs in an earlier stage (the leases claim in stage 03), that stage's forced
    schedules and scenario run again, as they would for the learner."""
    return [(before, before.reference) for before in EXERCISES.values() if before.stage_number < exercise.stage_number]


async def judge(exercise: Exercise, mutant: Mutant, baseline: str, checker: Checker = check,
                equivalent: dict[str, dict[str, str]] = EQUIVALENT) -> Judged:
    try:
        result = await asyncio.wait_for(checker(exercise, mutant.text, seed=CHECK_SEED, seeds=0,
                                                earlier=references_before(exercise)), MUTANT_SECONDS)
    except TimeoutError:  # the checker's own deadline would fail it ("the run did not finish"), later
        return Judged(mutant, Fate.REJECTED, f"still running after {MUTANT_SECONDS:g} s: the run did not finish")
    except Exception as error:  # noqa: BLE001  (a checker that raises is what this reports)
        return Judged(mutant, Fate.CRASHED, f"{type(error).__name__}: {str(error).splitlines()[0]}")
    first = result.lines[0] if result.lines else ""
    if result.outcome is Outcome.FAILED:
        refused = any(line.startswith("✗ Your code could not be used") for line in result.lines)
        return Judged(mutant, Fate.REFUSED if refused else Fate.REJECTED, first)
    if result.outcome is Outcome.COULD_NOT_RUN:
        return Judged(mutant, Fate.CRASHED, first)
    reason = equivalent.get(exercise.name, {}).get(mutant.description)
    if reason is None:
        return Judged(mutant, Fate.SURVIVED, "passed, and no reason it is equivalent is listed")
    differs = await differential(exercise, baseline, mutant.text)
    if differs:
        return Judged(mutant, Fate.SURVIVED, f"listed as equivalent, but differs from the reference: {differs}")
    return Judged(mutant, Fate.EQUIVALENT, reason)


@dataclass
class ExerciseScore:
    exercise: str
    baseline: str
    judged: list[Judged] = field(default_factory=list)
    baseline_failed: str = ""  # the baseline itself did not pass: nothing measured

    def count(self, fate: Fate) -> int:
        return sum(j.fate is fate for j in self.judged)


async def score(exercise: Exercise, sample_size: int | None = None, seed: int = 0, checker: Checker = check,
                equivalent: dict[str, dict[str, str]] = EQUIVALENT,
                progress: Callable[[str], None] = lambda line: None) -> ExerciseScore:
    """Every mutant of `exercise` (or a seeded sample of `sample_size`) judged, after the baseline passed."""
    baseline, mutants = mutants_of(exercise)
    chosen = sample(mutants, sample_size, seed, exercise.name)
    result = ExerciseScore(exercise.name, baseline)
    progress(f"{exercise.name}: the baseline, then {len(chosen)} of {len(mutants)} mutants")
    checked = await checker(exercise, baseline, seed=CHECK_SEED, seeds=0, earlier=references_before(exercise))
    if checked.outcome is not Outcome.PASSED:
        result.baseline_failed = checked.text()
        return result
    for mutant in chosen:
        result.judged.append(await judge(exercise, mutant, baseline, checker, equivalent))
        if result.judged[-1].fate in (Fate.SURVIVED, Fate.CRASHED):  # said now: a whole run takes a while
            progress(f"  {result.judged[-1].fate.value}: {mutant.description}")
    progress(f"{exercise.name}: " + ", ".join(f"{result.count(fate)} {fate.value}" for fate in FATES))
    return result


def report(scores: Sequence[ExerciseScore], seconds: float) -> list[str]:
    """The table per exercise, the fates per operator, then every survivor and crash with its diff."""
    width = max(len(name) for name in [*EXERCISES, "exercise"])
    header = f"{'exercise':<{width}} {'mutants':>8}" + "".join(f" {fate.value:>10}" for fate in FATES)
    lines = [header]
    for s in scores:
        lines.append(f"{s.exercise:<{width}} {len(s.judged):>8}" + "".join(f" {s.count(f):>10}" for f in FATES)
                     + (" (the baseline failed: nothing measured)" if s.baseline_failed else ""))
    judged = [j for s in scores for j in s.judged]
    lines.append(f"{'all':<{width}} {len(judged):>8}"
                 + "".join(f" {sum(j.fate is f for j in judged):>10}" for f in FATES))
    lines += ["", f"{'operator':<{width}} {'mutants':>8}" + "".join(f" {fate.value:>10}" for fate in FATES)]
    by_operator = Counter((j.mutant.operator, j.fate) for j in judged)
    for operator in sorted({j.mutant.operator for j in judged}):
        total = sum(n for (o, _), n in by_operator.items() if o == operator)
        lines.append(f"{operator:<{width}} {total:>8}" + "".join(f" {by_operator[operator, f]:>10}" for f in FATES))
    lines.append(f"({seconds:.0f} s)")
    for s in scores:
        if s.baseline_failed:
            lines += ["", f"{s.exercise}: the baseline (the reference as the operators print it) failed:",
                      *("  " + line for line in s.baseline_failed.splitlines())]
        for j in s.judged:
            if j.fate in (Fate.SURVIVED, Fate.CRASHED):
                lines += ["", f"{j.fate.value.upper()} {s.exercise}: {j.mutant.description}", f"  {j.said}",
                          *_diff(s.baseline, j.mutant.text)]
    return lines


def _diff(baseline: str, text: str) -> list[str]:
    return [line.rstrip("\n") for line in difflib.unified_diff(baseline.splitlines(True), text.splitlines(True),
                                                                "reference", "mutant", n=1)]


def failed(scores: Iterable[ExerciseScore]) -> bool:
    """Whether the run shows the checker wrong: a survivor, a crash, or a baseline that did not pass."""
    return any(s.baseline_failed or s.count(Fate.SURVIVED) or s.count(Fate.CRASHED) for s in scores)


async def run(names: Sequence[str], sample_size: int | None = None, seed: int = 0,
              progress: Callable[[str], None] = lambda line: None) -> tuple[list[str], bool]:
    """The report of `names`' mutants and whether it shows the checker wrong."""
    began = time.monotonic()
    scores = [await score(EXERCISES[name], sample_size, seed, progress=progress) for name in names]
    return report(scores, time.monotonic() - began), failed(scores)


def main(names: Sequence[str], sample_size: int | None, seed: int,
         progress: Callable[[str], None] = lambda line: None) -> tuple[list[str], bool]:
    return asyncio.run(run(names, sample_size, seed, progress))
