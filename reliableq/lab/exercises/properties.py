"""Judging a pure piece (a policy, a decision) over its whole input range, with the same verdict on every
run: the smallest input on which it is wrong, searched for by hypothesis, and the Kolmogorov-Smirnov
test of a sample against Uniform(0, 1).

The search is seeded by the check's seed and keeps nothing between runs (no example database, no
deadline, no health check that reads the clock), so the same file gets the same verdict on a loaded
machine as on an idle one. What this does not do: say what is right (each exercise states that itself),
or prove a piece right where the search found nothing (exhaustive checks do that where the range is
small enough).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample
from hypothesis.strategies import SearchStrategy

from reliableq.lab.exercises.learner_code import LearnerError

Case = TypeVar("Case")


def smallest_wrong(cases: SearchStrategy[Case], wrong: Callable[[Case], str | None], seed: int,
                   examples: int) -> tuple[Case, str] | None:
    """The smallest of `examples` cases drawn from `cases` (then shrunk) on which `wrong` says what is wrong,
    with what it says; None if it found nothing wrong. An exception in the learner's code is what is wrong
    with that case, so the search shrinks it to the first input that raises, too."""
    def said(case: Case) -> str | None:
        try:
            return wrong(case)
        except LearnerError as error:
            return str(error)
    search = settings(max_examples=examples, database=None, deadline=None, phases=(Phase.generate, Phase.shrink),
                      suppress_health_check=list(HealthCheck))
    try:
        case = find(cases, lambda case: said(case) is not None, settings=search, random=random.Random(seed))
    except NoSuchExample:
        return None
    return case, said(case)


@dataclass(frozen=True)
class Fit:
    """How well a sample fits Uniform(0, 1): the Kolmogorov-Smirnov statistic and its p-value."""
    draws: int
    statistic: float  # D: the largest gap between the sample's distribution and the uniform one
    p_value: float

    def rejected(self, significance: float) -> bool:
        return self.p_value < significance


def uniform_fit(sample: Sequence[float]) -> Fit:
    """The Kolmogorov-Smirnov test of `sample` (values in [0, 1]) against Uniform(0, 1).

    The p-value is the asymptotic Kolmogorov distribution's, Q(sqrt(n)·D) = 2 Σ (-1)^(k-1) exp(-2k²nD²). In
    the tail a check rejects in (p below 1e-6) its first term is all that counts, and that term is
    Massart's bound on the exact tail for every n, so the stated significance holds for small samples too."""
    ordered, n = sorted(sample), len(sample)
    statistic = max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(ordered))
    return Fit(n, statistic, kolmogorov_tail(math.sqrt(n) * statistic))


def kolmogorov_tail(x: float) -> float:
    """P(K > x) for Kolmogorov's K, the limit of sqrt(n)·D."""
    if x < 0.2:  # the series converges slowly there, and the tail is 1 to 16 digits
        return 1.0
    return min(1.0, max(0.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))))
