"""Exercise 07, backoff: write the retry delay. The starter retries at once, as the stage shows with
backoff off; the invariant is the stage's: the n-th retry waits Uniform(0, min(cap, base * 2^(n-1))).

The direct checks judge the delays the policy gives, not how it is written: replayed from the rng it is
given, within the ceiling at every attempt a job can reach and across every base and cap a worker
accepts, and uniform below the ceiling by a goodness-of-fit test at a stated significance. Every draw is
seeded, so the same file gets the same verdict every time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from hypothesis import strategies as st

from reliableq.config import WorkerSettings
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, load_function
from reliableq.lab.exercises.properties import smallest_wrong, uniform_fit
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.payload import MAX_ATTEMPTS_LIMIT

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

    attempt: it keeps counting when an operator replays a dead job, so it can reach the thousands.
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
       "float after attempt 1024, which a job replayed often enough reaches.")

HINTS = (
    "The starter returns 0.0: the job is due again the instant it fails. What should the first retry wait, "
    "and the second?",
    "The ceiling after attempt n is base * 2**(n - 1), but never more than cap: min(cap, base * 2**(n - 1)). "
    "Cap the exponent too (min(n - 1, 64)): 2**1024 does not fit in a float.",
    "Waiting exactly the ceiling brings every job that failed together back together. Draw the delay "
    "between 0 and the ceiling with the rng you are given: rng.uniform(0, ceiling).",
)

# The stage's own knobs (stages/s07_backoff.py): the first retry's cap and the cap of every retry.
BASE_SECONDS, CAP_SECONDS = 0.05, 1.0
# With full jitter and the stage's knobs, 4 jobs send about 7 requests each during the 1.5 s outage;
# without backoff, hundreds. The bound leaves room for a slow machine without letting a missing
# backoff through.
OUTAGE_REQUESTS_PER_JOB = 12

# The direct checks' range. Every attempt a job with the largest budget the API accepts can fail, each at
# three (base, cap) pairs, one per way the ceiling is decided: doubling, then the cap (the worker's
# defaults); the cap from the first attempt (cap below base); doubling through attempt 50 (tiny base,
# huge cap), so a mistake in 2^(n-1) shows far up.
ATTEMPTS = MAX_ATTEMPTS_LIMIT
GRID = ((0.5, 60.0), (2.0, 0.5), (1e-6, 1e9))
DRAWS = 64  # per attempt and pair: a window left half empty (D >= 0.5) is rejected at any seed
# A right answer is failed by the uniformity test with at most this probability (per seed), the whole
# check together; each of its tests runs at SIGNIFICANCE / the number of tests (Bonferroni).
SIGNIFICANCE = 1e-6
# Beyond the grid, the search over the whole range: attempts a job reaches when replayed (or with DEAD
# off) past 1025, where 2**(attempt - 1) no longer fits in a float (nothing new happens further up); a
# base and a cap anywhere from a microsecond (PostgreSQL's resolution) to 10^9 s (32 years), cap below,
# equal to or above base.
PAST_ANY_BUDGET = 1100
SHORTEST, LONGEST = 1e-6, 1e9
EXAMPLES = 200  # cases the search tries before shrinking: about a millisecond each
_seconds = st.floats(SHORTEST, LONGEST)
RANGE = st.tuples(st.integers(1, PAST_ANY_BUDGET), st.one_of(st.tuples(_seconds, _seconds),
                                                              _seconds.map(lambda seconds: (seconds, seconds))))
TOLERANCE = 1e-9  # relative: a ceiling computed another way (a loop, ldexp) may differ in its last bit


def load(text: str) -> Pieces:
    """The learner's policy, tried once: an exception or an answer that is not a number of seconds is said
    at once (the direct checks then ask every attempt)."""
    function = load_function(text, FILENAME, FUNCTION)
    pieces = Pieces(retry_delays=lambda settings: LearnerBackoff(function, settings))
    pieces.retry_delays(_settings(BASE_SECONDS, CAP_SECONDS, 0)).delay(1, "tried")
    return pieces


def _settings(base: float, cap: float, seed: int) -> WorkerSettings:
    return WorkerSettings(backoff_base_seconds=base, backoff_max_seconds=cap, backoff_seed=seed)


@dataclass(frozen=True)
class LearnerBackoff:
    """The learner's retry_delay as the worker calls it: seeded per (seed, job, attempt) like the shipped
    Backoff, so a seeded run replays the same delays."""
    function: object
    settings: WorkerSettings

    def delay(self, attempt: int, job_key: str = "") -> float:
        s = self.settings
        rng = random.Random(f"{s.backoff_seed}:{job_key}:{attempt}")
        try:
            delay = self.function(attempt, s.backoff_base_seconds, s.backoff_max_seconds, rng)
        except LearnerError as error:
            raise LearnerError(f"{error} (asked retry_delay({attempt}, {s.backoff_base_seconds!r}, "
                               f"{s.backoff_max_seconds!r}, rng))") from None
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay != delay:
            raise LearnerError(f"{FILENAME}: retry_delay must return a number of seconds; for attempt {attempt} "
                               f"it returned {delay!r}")
        return float(delay)


def ceiling(attempt: int, base: float, cap: float) -> float:
    """The invariant's bound, min(cap, base·2^(attempt-1)), stated apart from the reference. Past 2^1023 the
    cap decides everywhere in the checked range, so the exponent stops there rather than overflow."""
    return min(cap, base * 2.0 ** min(attempt - 1, 1023))


@dataclass(frozen=True)
class Sample:
    """DRAWS delays of one attempt at one (base, cap), each from its own job's seeded rng."""
    base: float
    cap: float
    attempt: int
    delays: list[float]

    @property
    def ceiling(self) -> float:
        return ceiling(self.attempt, self.base, self.cap)

    def fractions(self) -> list[float]:
        """Each delay as a fraction of the ceiling, clipped to [0, 1] (the bound is a check of its own)."""
        top = self.ceiling
        return [min(max(delay / top, 0.0), 1.0) for delay in self.delays]


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """The delays replay from the rng; every one is within the ceiling, on the grid and across the whole
    range; and they are spread uniformly below it. Delays that do not replay are judged on nothing else:
    the other checks would judge numbers a second run would not give."""
    samples, unreplayed = [], []
    for base, cap in GRID:
        policy = pieces.retry_delays(_settings(base, cap, seed))
        for attempt in range(1, ATTEMPTS + 1):
            sample = Sample(base, cap, attempt, [policy.delay(attempt, f"job-{draw}") for draw in range(DRAWS)])
            again = policy.delay(attempt, "job-0")
            if again != sample.delays[0]:
                unreplayed.append({"base": f"{base:g} s", "cap": f"{cap:g} s", "attempt": attempt,
                                   "yours": f"{sample.delays[0]:g} s, then {again:g} s"})
            samples.append(sample)
    replayed = Check(f"retry_delay draws from the rng it is given: the same seed gives the same delay "
                     f"({len(samples)} cases asked twice), so a seeded run replays", _first(unreplayed, len(samples)),
                     note="take every random number from rng (not the random module, not the clock), and keep "
                          "nothing from one call to the next")
    if not replayed.held:
        return [replayed]
    return [replayed, _within(samples), _whole_range(pieces, seed), _spread(samples)]


def _first(rows: list[dict], cases: int) -> list[dict]:
    """The first row (the smallest attempt of the first pair), saying in how many of the `cases` it is so."""
    return [{**rows[0], "wrong in": f"{len(rows)} of {cases} cases"}] if rows else []


def _within(samples: Sequence[Sample]) -> Check:
    rows = []
    for (base, cap), pair in groupby(samples, key=lambda sample: (sample.base, sample.cap)):
        wrong = [(sample, said) for sample in pair if (said := _outside(sample))]
        if wrong:
            rows.append({"base": f"{base:g} s", "cap": f"{cap:g} s",
                         "attempts": _span([sample.attempt for sample, _ in wrong]),
                         "first": f"attempt {wrong[0][0].attempt}: {wrong[0][1]}"})
    return Check(f"every delay is between 0 and min(cap, base·2^(n-1)), at every attempt 1 to {ATTEMPTS} "
                 f"(base and cap {_grid()}; {DRAWS} seeded draws each)", rows)


def _outside(sample: Sample) -> str | None:
    """What is wrong with the sample's bounds, in the words of the likely mistake; None if nothing."""
    low, high, top = min(sample.delays), max(sample.delays), sample.ceiling
    if low < 0:
        return f"a delay of {low:g} s, below 0"
    if high <= top * (1 + TOLERANCE):
        return None
    ratio = high / top
    if 500 <= ratio <= 1000 * (1 + TOLERANCE):
        return (f"delays up to {high:g} s, {ratio:.0f} times the ceiling {top:g} s: milliseconds, where "
                "seconds are asked")
    if top == sample.cap:
        return f"delays up to {high:g} s, above the cap {top:g} s: the cap is not applied"
    if ratio <= 2 * (1 + TOLERANCE):
        return (f"delays up to {high:g} s, above the ceiling {top:g} s and within twice it: an exponent one "
                "too large (2^n for 2^(n-1))?")
    return f"delays up to {high:g} s, {ratio:.3g} times the ceiling {top:g} s"


def _whole_range(pieces: Pieces, seed: int) -> Check:
    def wrong(case: tuple[int, tuple[float, float]]) -> str | None:
        attempt, (base, cap) = case
        policy = pieces.retry_delays(_settings(base, cap, seed))
        delay, again, top = policy.delay(attempt, "job-0"), policy.delay(attempt, "job-0"), ceiling(attempt, base, cap)
        if again != delay:
            return f"{delay!r} s, then {again!r} s for the same seed"
        if not 0 <= delay <= top * (1 + TOLERANCE):
            return f"a delay of {delay!r} s, outside 0 to {top!r} s"
        return None
    found = smallest_wrong(RANGE, wrong, seed, EXAMPLES)
    rows = []
    if found is not None:
        (attempt, (base, cap)), said = found
        rows.append({"smallest case": f"attempt {attempt}, base {base!r} s, cap {cap!r} s", "yours": said})
    return Check(f"across the whole range, attempts 1 to {PAST_ANY_BUDGET} and base and cap from {SHORTEST:g} s "
                 f"to {LONGEST:g} s: a number between 0 and the ceiling, the same for the same seed", rows,
                 note=f"{EXAMPLES} cases searched by hypothesis, seeded, the failing one shrunk to the smallest; "
                      "2**(attempt-1) leaves float range after attempt 1024")


def _spread(samples: Sequence[Sample]) -> Check:
    """Kolmogorov-Smirnov against Uniform(0, ceiling), for each attempt at each pair (which names where the
    spread is wrong), then for all delays together as fractions of their ceiling (which sees a shape too
    subtle for 64 draws, such as a normal clipped to the window)."""
    tests = len(samples) + 1
    each = SIGNIFICANCE / tests
    judged = [(sample, sample.fractions()) for sample in samples]
    rejected = [(sample, fractions, fit) for sample, fractions in judged
                if (fit := uniform_fit(fractions)).rejected(each)]
    rows = []
    for (base, cap, shape), group in groupby(rejected, key=lambda one: (one[0].base, one[0].cap, _shape(one[1]))):
        group = list(group)
        capped = [sample.ceiling == cap for sample, _, _ in group]
        where = " (at the cap)" if all(capped) else "" if any(capped) else " (ceiling below the cap)"
        worst = max((fit for _, _, fit in group), key=lambda fit: fit.statistic)
        rows.append({"base": f"{base:g} s", "cap": f"{cap:g} s",
                     "attempts": _span([sample.attempt for sample, _, _ in group]) + where,
                     "yours": _how_spread(shape, [f for _, fractions, _ in group for f in fractions]),
                     "KS": f"D up to {worst.statistic:.3f}, p {_p(worst.p_value)}"})
    everything = [f for _, fractions in judged for f in fractions]
    fit = uniform_fit(everything)
    if fit.rejected(each):
        rows.append({"all delays": f"{len(everything):,} as fractions of their ceiling",
                     "yours": _how_spread(_shape(everything), everything),
                     "KS": f"D {fit.statistic:.3f}, p {_p(fit.p_value)}"})
    return Check(f"delays are spread evenly over the whole window, 0 to the ceiling (full jitter): "
                 f"Kolmogorov-Smirnov against Uniform(0, ceiling), at significance {SIGNIFICANCE:g} for the "
                 f"whole check", rows,
                 note=f"{tests} tests at {each:.1e} each: every attempt's {DRAWS} draws at each pair, then all "
                      f"{len(samples) * DRAWS:,} together; a test rejects when its p is below that")


def _shape(fractions: Sequence[float]) -> str:
    """Which way a sample misses full jitter: 'same', 'bottom' (its lowest quarter empty), 'top' (its highest
    quarter empty), or 'shape' (anything else)."""
    low, high = min(fractions), max(fractions)
    if high - low < TOLERANCE:
        return "same"
    return "bottom" if low >= 0.25 else "top" if high <= 0.75 else "shape"


def _how_spread(shape: str, fractions: Sequence[float]) -> str:
    if shape == "same":
        return "the same delay for every job: no jitter, so jobs that failed together come back together"
    if shape == "bottom":
        return (f"never below {min(fractions):.2f} of the ceiling: the bottom of the window is never used "
                "(equal jitter?)")
    if shape == "top":
        return (f"never above {max(fractions):.2f} of the ceiling: the top of the window is never used "
                "(an exponent one too small?)")
    quarters = [sum(q / 4 <= f < (q + 1) / 4 or q == 3 and f == 1 for f in fractions) for q in range(4)]
    return (f"{', '.join(f'{100 * n / len(fractions):.0f}%' for n in quarters)} of the delays in the window's "
            "four quarters, where full jitter puts 25% in each")


def _p(p_value: float) -> str:
    return f"{p_value:.1e}" if p_value > 1e-300 else "below 1e-300"


def _span(numbers: Sequence[int]) -> str:
    """Ascending numbers said as runs: '1 to 7, 9, 12 to 20'."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(f"{run[0]}" if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs)


def _grid() -> str:
    return "; ".join(f"{base:g} s, {cap:g} s" for base, cap in GRID)


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    result = await reliableq_stages.get("backoff").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
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
