"""The checker's mutation score: mutants of each exercise's reference, each graded by the real checker.

A mutant is the reference with one plausible mistake in it (mutants_sql.py edits PostgreSQL's syntax
tree, mutants_python.py Python's). The checker grades it as a learner's file: its deterministic part
only (the forced schedules and the stage's scenario, seed 1, no chaos: a mistake must be caught by what
is forced, not by chaos luck), beside the earlier exercises' references as a learner's first check is
(an earlier stage runs again only where the mutant's piece runs in it). Each mutant is then:

    rejected    the checker failed it
    refused     the checker would not use it, saying why ("could not be used")
    equivalent  it passed, and EQUIVALENT says why it behaves as the reference does; a differential run
                of mutant and reference (the whole input domain of a pure piece, the forced schedules
                of SQL) must agree, or it counts as survived
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import product

from reliableq.config import WorkerSettings
from reliableq.finalize_decision import DECISIONS
from reliableq.lab.exercises import EXERCISES, commit_before_ack, dead, mutants_python, mutants_sql
from reliableq.lab.exercises.checker import CheckResult, Outcome, check
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.exercises.mutant import Mutant

SQL_EXERCISES = ("skip-locked", "leases", "fencing", "idempotency")
ANSWERS = {"dead": DECISIONS}  # the strings a Python exercise's function may return, swapped for one another
CHECK_SEED = 1


def mutants_of(exercise: Exercise) -> tuple[str, list[Mutant]]:
    """The baseline (the reference as the operators print it, so that each mutant differs from it by one
    edit) and every mutant of `exercise`'s reference, in a fixed order."""
    if exercise.name in SQL_EXERCISES:
        return mutants_sql.mutants(exercise.reference)
    return mutants_python.mutants(exercise.reference, ANSWERS.get(exercise.name, ()))


def sample(mutants: list[Mutant], n: int | None, seed: int, exercise: str) -> list[Mutant]:
    """`n` of `mutants`, the same ones for the same seed, in their own order; all of them if n is None."""
    if n is None or n >= len(mutants):
        return mutants
    rng = random.Random(f"{seed}:{exercise}")
    return [mutants[i] for i in sorted(rng.sample(range(len(mutants)), n))]


# -- equivalent mutants, reviewed ---------------------------------------------------------------------

_CLAIM = "job_claim_due_skip_locked: "
# The claim's mutants that behave as the reference does, in exercise 03 and 04 alike.
_CLAIM_EQUIVALENT = {
    _CLAIM + "due: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED":
        "a right answer: FOR NO KEY UPDATE conflicts with itself, so claimers still exclude each other, and "
        "skip each other's rows",
    _CLAIM + "due: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _CLAIM + "due: `now()` -> clock_timestamp() #2": "a right answer: another clock read (issue 22, item 5)",
    _CLAIM + "due: `run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <":
        "the boundary instant only: a job due at exactly the claim's now() is taken by the next claim a "
        "moment later; a right answer may write either (tests/exercises/test_leases_exercise.py, PLAIN_NOW)",
    _CLAIM + "due: `lease_expires_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <":
        "as run_at's `<= -> <`: a lease that runs out at exactly the claim's now() is reclaimed a moment later",
    _CLAIM + "due: `status = 'RUNNING'`: = -> >=":
        "admits SUCCEEDED too, whose lease_expires_at job_succeed always sets NULL: never `<= now()`",
    _CLAIM + "expired: `due.status = 'RUNNING'` removed":
        "a PENDING job's token names a claim its retry or replay already closed (retried, dead, expired), so "
        "`outcome IS NULL OR = 'lost_renew'` excludes it; only an unfenced stale retry leaves one open",
    _CLAIM + "expired: `due.status = 'RUNNING'`: = -> <=": "as `due.status = 'RUNNING'` removed: `due` holds only "
                                                      "PENDING and RUNNING jobs, both <= 'RUNNING'",
    _CLAIM + "expired: `due.status = 'RUNNING'`: = -> >=": "`due` holds only PENDING and RUNNING jobs: of those only "
                                                      "RUNNING is >= 'RUNNING'",
    _CLAIM + "expired: `a.outcome = 'lost_renew'`: = -> <=":
        "the claim of a RUNNING job's current token is on record open or lost_renew only (any finalize by its "
        "owner takes the job out of RUNNING), and NULL OR 'lost_renew' <= 'lost_renew' holds for both",
    _CLAIM + "expired: `a.outcome = 'lost_renew'`: = -> >=": "as `= -> <=`: only NULL and 'lost_renew' are met",
    _CLAIM + "expired: `now()` -> clock_timestamp()": "a right answer: the closed claim's finished_at on another clock",
    _CLAIM + "claimed: `now()` -> clock_timestamp()": "a right answer: the expiry from another clock read",
    _CLAIM + "claimed: `now()` -> clock_timestamp() #2": "a right answer: updated_at (and the claim's claimed_at) from "
                                                    "another clock read",
}
_TOKEN_NAMES_THE_JOB = ("the token names the claim: every claim writes a fresh gen_random_uuid() (unique on "
                        "record in job_attempts), so the token condition alone picks this one job")
_WRITTEN_ONCE = ("only the same claim writing again after its own finalize won meets it (the token is still the "
                 "job's): the worker never does (it asks finalize_recorded before trying a lost answer again), and "
                 "the token without the status is a right answer (tests/exercises/test_fencing_exercise.py)")
_ONLY_RUNNING_IS_LIVE = ("renew also needs a live lease, and only a RUNNING job has one: succeed, retry and dead set "
                         "lease_expires_at NULL, and job_dead_expired_exhausted makes DEAD only jobs whose lease "
                         "already ran out")
_NO_WAIT_CYCLE = ("with the token condition a group updates only the rows whose token is its claim's, and only a claim "
                  "replaces a token, and a claim never waits (SKIP LOCKED): two groups can never each wait to update "
                  "a row the other updated, so no lock is needed before the update (the shipped query needs it with "
                  "fencing off). A lock two groups may share does deadlock: FOR SHARE is rejected "
                  "(fencing._groups_sharing_jobs)")
# exercise -> mutant description -> why it behaves as the reference does. A survivor listed here is
# still run against the reference (differential below); a difference makes it a survivor again.
EQUIVALENT: dict[str, dict[str, str]] = {
    "backoff": {
        "retry_delay, line 8: 64 -> 65": "the exponent's own cap: base·2^64 and base·2^65 are both far above any cap "
                                         "the worker takes, so min(cap, …) is the cap either way",
        "retry_delay, line 8: 64 -> 63": "as 64 -> 65: base·2^63 is above every cap too (base ≥ 1 ms)",
    },
    "dead": {
        "decide, lines 21 and 23: `if outcome_kind == 'ok':` and `if outcome_kind == 'permanent':` swapped":
            "two early returns on conditions that never hold together: their order cannot matter",
        "decide, lines 23 and 25: `if outcome_kind == 'permanent':` and `if attempts >= max_attempts:` swapped":
            "both return 'dead': whichever is asked first, a case either meets is dead",
    },
    "fencing": {
        'job_renew_lease: renewed: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_renew_lease: renewed: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_renew_lease: renewed: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_succeed: finalized: `jobs.id = owned.job_id` removed':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: = -> <=':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: = -> >=':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: `jobs.id` -> `owned.job_id`':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: `owned.job_id` -> `jobs.id`':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id` removed':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: = -> <=':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: = -> >=':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: `f.id` -> `owned.job_id`':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: `owned.job_id` -> `f.id`':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        "job_renew_lease: renewed: `status = 'RUNNING'` removed":
            _ONLY_RUNNING_IS_LIVE,
        "job_renew_lease: renewed: `status = 'RUNNING'`: = -> <=":
            _ONLY_RUNNING_IS_LIVE,
        "job_renew_lease: renewed: `status = 'RUNNING'`: = -> >=":
            _ONLY_RUNNING_IS_LIVE,
        'job_renew_lease: renewed: `lease_expires_at > clock_timestamp()`: > -> >=':
            "the boundary instant only: a lease expiring at exactly the renewal's clock read, live by one reading "
            "and not the other",
        'job_renew_lease: renewed: `clock_timestamp()` -> now()':
            "a right answer: the new expiry from the statement's transaction start, the renewal's first statement "
            "(milliseconds apart)",
        'job_renew_lease: renewed: `clock_timestamp()` -> now() #2':
            "a right answer: updated_at from another clock read",
        'job_renew_lease: renewed: `clock_timestamp()` -> now() #3':
            "the renewal is its transaction's first statement except under a fleet limit (chaos only, behind "
            "job_fleet_renewal_gate), so now() and clock_timestamp() read the same moment to milliseconds; no forced "
            "schedule holds a renewal at the gate",
        'job_succeed: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_succeed: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_succeed: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_retry: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_retry: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_retry: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_dead: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_dead: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_dead: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_succeed: locked: lock FOR UPDATE removed': _NO_WAIT_CYCLE,
        'job_succeed: locked: lock FOR UPDATE -> FOR KEY SHARE':
            _NO_WAIT_CYCLE + "; FOR KEY SHARE does not conflict with an update's own lock: as if none were taken",
        'job_succeed: locked: lock FOR UPDATE -> FOR KEY SHARE SKIP LOCKED':
            _NO_WAIT_CYCLE + "; FOR KEY SHARE conflicts only with FOR UPDATE, which only a claim, a sweep of "
            "exhausted jobs or the pruner takes, each about to take the job from its owner or past it: the group "
            "that skips it has lost it either way",
        'job_succeed: finalized: `jobs.id IN (SELECT id FROM locked)` removed':
            _NO_WAIT_CYCLE + "; nothing then reads the `locked` step, and PostgreSQL does not run a SELECT in WITH "
            "that nothing reads: as if the lock were removed",
        'job_succeed: locked: lock FOR UPDATE -> FOR NO KEY UPDATE':
            "a right answer: FOR NO KEY UPDATE conflicts with itself and with the UPDATE's own lock, so two groups "
            "still lock their rows in id order",
        "job_succeed: finalized: `jobs.status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_succeed: finalized: `jobs.status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_succeed: finalized: `jobs.status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
    },
    "idempotency": {
        "charge_insert_once: created: ON CONFLICT DO NOTHING: conflict target removed":
            "charges has two unique indexes, the key's and the primary key's, and the id is a fresh random uuid: "
            "every conflict this insert can meet is on the key",
    },
    "skip-locked": {
        _CLAIM + "due: `%(reclaim_expired)s` removed":
            "the leases exercise's reference is this claim (reclaim always on from stage 04); with leases off the "
            "queue passes lease_seconds NULL, so no claim writes an expiry and no RUNNING lease can have run out",
        **_CLAIM_EQUIVALENT,
    },
    "leases": _CLAIM_EQUIVALENT,  # the same claim, its reclaim always on
    "semaphore": {
        "__init__, lines 18 and 19: `self.limit = limit` and `self.in_flight = 0` swapped":
            "two assignments to different attributes, neither reading the other",
    },
}


async def _differential_python(exercise: Exercise, reference: str, mutant: str) -> str | None:
    """The first input on which the mutant's answer differs from the reference's, over the piece's whole
    input domain as the system calls it; None if there is none."""
    def answers(text: str) -> list:
        pieces = exercise.load(text)
        if exercise.name == "dead":
            return [_outcome(pieces.decision, kind, attempts, budget) for kind in dead.KINDS
                    for budget in range(1, 101) for attempts in range(1, budget + 2)]  # the API's budgets
        if exercise.name == "backoff":
            return [_outcome(pieces.retry_delays(WorkerSettings(backoff_base_seconds=base, backoff_max_seconds=cap,
                                                                 backoff_seed=0)).delay, attempt, "job")
                    for base, cap in product((0.001, 0.05, 0.5, 1.0, 30.0), (0.01, 1.0, 60.0, 3600.0))
                    for attempt in (*range(1, 201), 1_000, 10_000, 10**6)]
        if exercise.name == "semaphore":
            return [_permits_life(pieces.permits, limit, steps) for limit in range(1, 5)
                    for steps in product(("free", "taken 1", "taken 2", "released"), repeat=5)]
        raise ValueError(f"no input domain for {exercise.name}")

    if exercise.name == "commit-before-ack":
        return await _differential_accept(reference, mutant)
    for n, (right, yours) in enumerate(zip(answers(reference), answers(mutant), strict=True)):
        if right != yours:
            return f"input #{n}: the reference {right}, the mutant {yours}"
    return None


def _outcome(function: Callable, *args: object) -> object:
    try:
        return function(*args)
    except (LearnerError, ArithmeticError) as error:
        return f"raised {type(error).__name__}"


def _permits_life(make: Callable, limit: int, steps: tuple[str, ...]) -> list[object]:
    """What free() says after each step of a worker's life (claims of 1 or 2, releases) on fresh permits."""
    permits, said = _outcome(make, limit), []
    for step in steps:
        if step == "free":
            said.append(_outcome(permits.free))
        elif step == "released":
            _outcome(permits.released)
        else:
            _outcome(permits.taken, int(step.split()[1]))
    return said


async def _differential_accept(reference: str, mutant: str) -> str | None:
    """accept's whole domain: a store that commits at once, one held, one that fails; what it did in each."""
    for store in commit_before_ack.STORES:
        right, yours = [await commit_before_ack.trial(commit_before_ack.load(text).submission_order, store)
                        for text in (reference, mutant)]
        if replace(right, waiting_at=None) != replace(yours, waiting_at=None):  # its lines may be numbered apart
            return f"{store} store: the reference {right}, the mutant {yours}"
    return None


async def _differential_sql(exercise: Exercise, reference: str, mutant: str) -> str | None:
    """The exercise's forced schedules run on both: every check must say the same."""
    said = [[(one.name, one.held, one.violations) for one in await exercise.direct(exercise.load(text), CHECK_SEED)]
            for text in (reference, mutant)]
    for right, yours in zip(*said, strict=True):
        if right != yours:
            return f"{right[0]}: the reference {right[1:]}, the mutant {yours[1:]}"
    return None


async def differential(exercise: Exercise, reference: str, mutant: str) -> str | None:
    if exercise.name in SQL_EXERCISES:
        return await _differential_sql(exercise, reference, mutant)
    return await _differential_python(exercise, reference, mutant)


# -- the run --------------------------------------------------------------------------------------------


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
