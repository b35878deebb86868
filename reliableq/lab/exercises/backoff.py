"""Exercise 07, backoff: write the retry delay. The starter retries at once, as the stage shows with
backoff off; the invariant is the stage's: the n-th retry waits Uniform(0, min(cap, base * 2^(n-1)))."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from reliableq.config import WorkerSettings
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, load_function
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

FILENAME = "backoff.py"
FUNCTION = "retry_delay"

STARTER = '''"""Exercise 07, backoff. Write retry_delay: how long a job waits after a failed attempt.

While the charge service is down, a job that retries at once hammers it (stage 07 shows about 80
requests a second). Make the n-th retry wait a random time between 0 and min(cap, base * 2**(n-1)):
exponential, so retries slow down the longer the outage lasts; capped, so no job waits for ever; and
random (full jitter), so jobs that failed together do not come back together.

Check it with:  reliableq exercise check backoff
"""

import random


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 for the first) before the job is due again.

    base: the largest delay after the first failure; cap: no delay may be longer; rng: take every random
    number from it (rng.random(), rng.uniform(a, b)), so a seeded check can replay your delays."""
    return 0.0
'''

REFERENCE = '''"""Exercise 07, backoff: the reference. Capped exponential backoff with full jitter."""

import random


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 for the first) before the job is due again."""
    ceiling = min(cap, base * 2 ** min(attempt - 1, 64))  # the exponent capped too: 2**1100 overflows a float
    return rng.uniform(0.0, ceiling)
'''

WHY = ("Each failure doubles the ceiling (base, 2·base, 4·base, …) until the cap, so a long outage is met by "
       "fewer and fewer retries; drawing the whole delay uniformly below the ceiling (full jitter) spreads "
       "jobs that failed at the same moment over the whole window, so the recovering service is not hit by "
       "all of them at once. The exponent is capped before it is computed: 2**(attempt - 1) overflows a "
       "float after about a thousand attempts.")

HINTS = (
    "The starter returns 0.0: the job is due again the instant it fails. What should the first retry wait, "
    "and the second?",
    "The ceiling after attempt n is base * 2**(n - 1), but never more than cap: min(cap, base * 2**(n - 1)).",
    "Waiting exactly the ceiling brings every job that failed together back together. Draw the delay "
    "between 0 and the ceiling with the rng you are given: rng.uniform(0, ceiling).",
)

# The stage's own knobs (stages/s07_backoff.py): the first retry's cap and the cap of every retry.
BASE_SECONDS, CAP_SECONDS = 0.05, 1.0
DRAWS = 400  # delays drawn per attempt number for the direct checks
ATTEMPTS = 12  # attempt numbers checked: past the cap (attempt 6 with these knobs)
# With full jitter and the stage's knobs, 4 jobs send about 7 requests each during the 1.5 s outage;
# without backoff, hundreds. The bound leaves room for a slow machine without letting a missing
# backoff through.
OUTAGE_REQUESTS_PER_JOB = 12
_SETTINGS = WorkerSettings(backoff_base_seconds=BASE_SECONDS, backoff_max_seconds=CAP_SECONDS, backoff_seed=0)


def load(text: str) -> Pieces:
    """The learner's policy, tried once on every attempt number first: an exception or an answer that is
    not a number of seconds is said at once, not met later inside a worker."""
    function = load_function(text, FILENAME, FUNCTION)
    pieces = Pieces(retry_delays=lambda settings: LearnerBackoff(function, settings))
    policy = pieces.retry_delays(_SETTINGS)
    for attempt in range(1, ATTEMPTS + 1):
        policy.delay(attempt, "tried")
    return pieces


@dataclass(frozen=True)
class LearnerBackoff:
    """The learner's retry_delay as the worker calls it: seeded per (seed, job, attempt) like the shipped
    Backoff, so a seeded run replays the same delays."""
    function: object
    settings: WorkerSettings

    def delay(self, attempt: int, job_key: str = "") -> float:
        s = self.settings
        rng = random.Random(f"{s.backoff_seed}:{job_key}:{attempt}")
        delay = self.function(attempt, s.backoff_base_seconds, s.backoff_max_seconds, rng)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay != delay:
            raise LearnerError(f"{FILENAME}: retry_delay must return a number of seconds; for attempt {attempt} "
                               f"it returned {delay!r}")
        return float(delay)


def ceiling(attempt: int) -> float:
    return min(CAP_SECONDS, BASE_SECONDS * 2 ** (attempt - 1))


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Every attempt's delays, drawn DRAWS times with seeded generators: a number, never negative, never
    above the ceiling (the cap included), and spread over the whole window below it (full jitter)."""
    policy = pieces.retry_delays(replace(_SETTINGS, backoff_seed=seed))
    outside, lockstep = [], []
    for attempt in range(1, ATTEMPTS + 1):
        delays = [policy.delay(attempt, f"draw-{draw}") for draw in range(DRAWS)]
        top = ceiling(attempt)
        if min(delays) < 0 or max(delays) > top * (1 + 1e-9):
            outside.append({"attempt": attempt, "lowest": round(min(delays), 4), "highest": round(max(delays), 4),
                            "allowed": f"0 to {top:g}"})
        # Full jitter covers the window: some delays in its bottom fifth, some in its top fifth, and a
        # median near its middle. A fixed delay, a delay of exactly the ceiling, or "equal jitter"
        # (half the ceiling plus a random half) fails here.
        if not (min(delays) < 0.2 * top and max(delays) > 0.8 * top
                and 0.35 * top < statistics.median(delays) < 0.65 * top):
            lockstep.append({"attempt": attempt, "lowest": round(min(delays), 4),
                             "median": round(statistics.median(delays), 4), "highest": round(max(delays), 4),
                             "window": f"0 to {top:g}"})
    return [Check(f"every delay is between 0 and min(cap, base·2^(n-1)) (base {BASE_SECONDS:g} s, cap "
                  f"{CAP_SECONDS:g} s, attempts 1 to {ATTEMPTS})", outside),
            Check("delays are spread over the whole window, so jobs that failed together come back apart "
                  "(full jitter)", lockstep)]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    result = await stages.get("backoff").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    requests, jobs = result.measurements["outage_requests"], len(result.jobs)
    unsettled = [{"job": row["job"], "status": row["status"]} for row in result.rows() if row["status"] != "SUCCEEDED"]
    too_many = [{"requests": requests, "jobs": jobs}] if requests > OUTAGE_REQUESTS_PER_JOB * jobs else []
    return Check(f"stage 07's outage: retries backed off (at most {OUTAGE_REQUESTS_PER_JOB} requests per job in "
                 f"{result.measurements['outage_seconds']:g} s) and every job succeeded after it",
                 too_many + unsettled, note=f"{requests} requests from {jobs} jobs"), result


EXERCISE = Exercise(name="backoff", stage_number=7, filename=FILENAME,
                    summary="retry_delay(attempt, base, cap, rng): capped exponential backoff with full jitter",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
