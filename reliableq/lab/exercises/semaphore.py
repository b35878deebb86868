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
LIMITS = (1, 2, 4)  # the permits a direct check gives a worker
STEPS = 200  # claims and finished jobs per limit, in a seeded order

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
    """A worker's life replayed on the learner's permits, for a few limits: claims of as many jobs as
    free() allows or fewer (fewer may be due), and jobs finishing, in a seeded order. After every step,
    free() must not let in-flight work pass the limit, and with nothing in flight a permit must be free
    (or the worker never claims again)."""
    over, stalled = [], []
    rng = random.Random(seed)
    for limit in LIMITS:
        worker = pieces.permits(limit)
        in_flight, claimed, done = 0, 0, 0
        for _ in range(STEPS):
            free = worker.free()
            if in_flight + free > limit and not over:
                over.append({"limit": limit, "in flight": in_flight, "free() said": free,
                             "at most": limit - in_flight, "after": f"{claimed} claimed, {done} done"})
            if in_flight == 0 and free <= 0:
                stalled.append({"limit": limit, "in flight": 0, "free() said": free,
                                "after": f"{claimed} claimed, {done} done"})
                break
            if free > 0 and in_flight < limit and (in_flight == 0 or rng.random() < 0.5):
                n = rng.randint(1, min(free, limit - in_flight))  # never past the limit: over is judged above
                worker.taken(n)
                in_flight, claimed = in_flight + n, claimed + n
            elif in_flight:
                worker.released()
                in_flight, done = in_flight - 1, done + 1
    return [Check("free() never lets a worker have more than `limit` jobs in flight", over),
            Check("a finished job gives its permit back: with nothing in flight, a permit is free (or the worker "
                  "never claims again)", stalled)]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    stage = stages.get("semaphore")
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
