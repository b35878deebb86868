"""Retry delays: capped exponential backoff with full jitter.

delay(n) = Uniform(0, min(max, base * 2^(n-1))) for the n-th failed attempt. Full jitter spreads the
retries of many jobs that failed together, so a recovering dependency is not hit in lockstep. The
delay is only a duration: the worker adds it to PostgreSQL's now(), never to its own clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol


class RetryDelays(Protocol):
    def delay(self, attempt: int, job_key: str = "") -> float:
        """Seconds to wait after failed attempt `attempt` (1-based) of the job `job_key`."""
        ...


@dataclass(frozen=True)
class Backoff:
    base_seconds: float = 0.5
    max_seconds: float = 60.0
    seed: int | None = None  # None: system randomness; an int: the same delays on every run

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the delay after failed attempt number `attempt` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # Cap the exponent too: 2**attempt overflows a float long before attempts run out.
        return min(self.max_seconds, self.base_seconds * 2 ** min(attempt - 1, 64))

    def delay(self, attempt: int, job_key: str = "") -> float:
        """The jittered delay after failed attempt `attempt` of the job `job_key`.

        With a seed, the draw depends only on (seed, job, attempt), not on which worker ran it or in
        which order jobs finished, so a seeded run reproduces its schedule exactly."""
        rng = random.Random(f"{self.seed}:{job_key}:{attempt}") if self.seed is not None else random
        return rng.uniform(0.0, self.ceiling(attempt))
