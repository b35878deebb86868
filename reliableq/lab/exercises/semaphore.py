"""Exercise 09, semaphore: write the worker's permits (how many jobs it may claim, given the jobs it has
in flight). The starter lets it claim everything due, which is what the stage shows with the semaphore
off; the reference is the shipped reliableq.permits.Permits itself. The invariants are the stage's: a
worker never has more than its limit of jobs in flight (so a charge service of that capacity refuses
none), and a finished job gives its permit back (so the worker never stops claiming)."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable

from reliableq import permits
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, guarded, load_function
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

FILENAME = "semaphore.py"
CLASS = "Permits"
METHODS = ("free", "taken", "released")
# The permits a direct check gives a worker: every small limit, where off-by-ones show, and a few large ones
# (a worker accepts any limit of at least 1).
SMALL_LIMITS = range(1, 33)
LIMITS = (*SMALL_LIMITS, 64, 100, 1000)
STEPS = 120  # decisions per life

HEADER = '''"""Exercise 09, semaphore. Write Permits: how many jobs a worker may claim, given the jobs it has in flight.

The charge service takes 2 requests at once and refuses the rest (503 overloaded). A worker that claims
everything due starts every job at once: stage 09 shows 4 in flight and refused requests. Give the
worker `limit` permits: a job claimed takes one, a job finished gives it back, and the worker claims at
most as many jobs as there are free permits.

The worker drives your class: before each claim it asks free() and claims at most that many jobs (fewer
if fewer are due; none if free() is 0 or less); right after a claim of n jobs it calls taken(n); each
time one of its jobs is done (finished, failed, crashed or cut off), released().

Check it with:  reliableq exercise check semaphore
"""
'''

STARTER = HEADER + '''
EVERYTHING_DUE = 1000  # as many as one claim takes with no limit (the semaphore off)


class Permits:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # jobs this worker may have in flight at once

    def free(self) -> int:
        """How many more jobs the worker may claim now."""
        return EVERYTHING_DUE

    def taken(self, n: int) -> None:
        """The worker just claimed `n` jobs."""

    def released(self) -> None:
        """One of the worker's jobs is done: its permit is free again."""
'''

REFERENCE = HEADER + "\n\n" + inspect.getsource(permits.Permits)

WHY = ("A permit is taken for every job claimed and given back when that job is done, whatever its end, so "
       "free() = limit - jobs in flight: the worker claims at most that many and can never hold more than "
       "`limit`. Counting at claim time (not when a handler starts) matters: a claimed job is leased to this "
       "worker and invisible to the others. Forget to give permits back and the worker stalls after `limit` "
       "jobs; allow one too many and the service is asked for more than it can take.")

HINTS = (
    "The starter says every job due may be claimed: four requests at once for a service that takes two. "
    "What should free() say when `limit` jobs are already in flight?",
    "Count the jobs in flight: taken(n) adds n, released() takes one away; free() is what is left of the "
    "limit.",
    "free() is self.limit - self.in_flight. Every job claimed must be released once it is done, or the "
    "worker stops claiming.",
)


def load(text: str) -> Pieces:
    """The learner's class, made and driven once through a claim and a finished job first: an exception or
    an answer that is not a whole number is said at once, not met later inside a worker."""
    make = load_function(text, FILENAME, CLASS, kind="class")
    tried = LearnerPermits(make, 2)
    tried.free()
    tried.taken(1)
    tried.free()
    tried.released()
    tried.free()
    return Pieces(permits=lambda limit: LearnerPermits(make, limit))


class LearnerPermits:
    """The learner's Permits as the worker drives it: each method called within the deadline, errors said
    at the learner's line, and free()'s answer checked to be a whole number."""

    def __init__(self, make: Callable[..., object], limit: int) -> None:
        made = make(limit)
        missing = [name for name in METHODS if not callable(getattr(made, name, None))]
        if missing:
            raise LearnerError(f"{FILENAME}: Permits needs a method named {', '.join(missing)}")
        self._free, self._taken, self._released = (guarded(getattr(made, name), FILENAME) for name in METHODS)

    def free(self) -> int:
        answer = self._free()
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise LearnerError(f"{FILENAME}: free() must return a whole number of jobs; it returned {answer!r}")
        return answer

    def taken(self, n: int) -> None:
        self._taken(n)

    def released(self) -> None:
        self._released()


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """A worker's life replayed on the learner's permits for every limit in LIMITS, driven exactly as the
    worker drives them (one free() per decision, taken(n) never for more than it said, a released() per
    finished job, jobs finishing between a free() and its taken() too): seeded random lives, and one where a
    permit is held through the whole life while the others turn over. After every free(): never more than
    the permits left, and never none while one is free (with nothing in flight that is a worker that never
    claims again)."""
    rng = random.Random(seed)
    over: list[dict] = []
    stalled: list[dict] = []
    idle: list[dict] = []
    for limit in LIMITS:
        for life, held_through in (("random", False), ("one permit held throughout", True)):
            said = _first_wrong_answer(pieces.permits(limit), limit, rng, held_through)
            if said is None:
                continue
            in_flight, free, steps = said
            row = {"limit": limit, "in flight": in_flight, "free() said": free, "right": limit - in_flight,
                   "after": f"{steps} decisions ({life})"}
            (over if free > limit - in_flight else stalled if in_flight == 0 else idle).append(row)
    return [Check(f"free() never lets a worker have more than `limit` jobs in flight (limits {_limits()})", over[:5],
                  note=f"{len(over)} lives broke it" if over else ""),
            Check("a finished job gives its permit back: with nothing in flight, a permit is free (or the worker "
                  "never claims again)", stalled[:5], note=f"{len(stalled)} lives broke it" if stalled else ""),
            Check("while a permit is free, free() says so (fewer than `limit` jobs in flight: at least 1), or "
                  "the worker waits with capacity to spare", idle[:5],
                  note=f"{len(idle)} lives broke it" if idle else "")]


def _first_wrong_answer(permits: LearnerPermits, limit: int, rng: random.Random,
                        held_through: bool) -> tuple[int, int, int] | None:
    """Drive `permits` for STEPS decisions; the first free() answer out of (0, limit - in flight] (or not 0
    when full) as (in flight, what free() said, decisions so far), or None if every answer was right."""
    in_flight = 0
    held = 1 if held_through else 0  # a job that never finishes: its permit stays taken
    for step in range(STEPS):
        free = permits.free()
        left = limit - in_flight
        if free > left or (left > 0 and free <= 0):
            return in_flight, free, step
        # Jobs may finish while the claim is on its way: before taken(), as in the worker.
        in_flight -= _finish(permits, rng, in_flight - held)
        n = rng.randint(1, free) if free > 0 and rng.random() < 0.8 else 0  # fewer may be due, or none
        if n:
            permits.taken(n)
            in_flight += n
        in_flight -= _finish(permits, rng, in_flight - held)
    return None


def _finish(permits: LearnerPermits, rng: random.Random, finishable: int) -> int:
    """Some of the `finishable` jobs finish: released() for each; how many."""
    n = rng.randint(0, finishable) if finishable > 0 and rng.random() < 0.5 else 0
    for _ in range(n):
        permits.released()
    return n


def _limits() -> str:
    return f"1 to {max(SMALL_LIMITS)}, " + ", ".join(str(limit) for limit in LIMITS if limit > max(SMALL_LIMITS))


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    stage = reliableq_stages.get("semaphore")
    params = ScenarioParams(seed=seed, pieces=pieces)
    result = await stage.scenario(True, params)
    m = result.measurements
    wrong = []
    if m["in_flight_peak"] > params.concurrency:
        wrong.append({"jobs in flight at the worker's peak": m["in_flight_peak"], "limit": params.concurrency})
    if m["refused"]:
        wrong.append({"requests refused as overloaded": m["refused"], "capacity": m["capacity"]})
    unfinished = [{"job": row["job"], "status": row["status"], "attempts": row["A"]}
                  for row in result.rows() if row["status"] != "SUCCEEDED"]
    never_ran = sum(row["attempts"] == 0 for row in unfinished)
    stalled = (f"; the worker stopped claiming with no job in flight: {never_ran} job(s) never ran"
               if never_ran else "")
    return Check(f"stage 09's burst: at most {params.concurrency} jobs in flight, none refused by a charge service "
                 f"of capacity {m['capacity']}, and every job ran and succeeded", wrong + unfinished,
                 note=f"peak {m['in_flight_peak']} in flight, {m['refused']} refused{stalled}"), result


EXERCISE = Exercise(name="semaphore", stage_number=9, filename=FILENAME,
                    summary="class Permits: free(), taken(n), released(): claim no more jobs than there are permits",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
