"""A worker's permits: how many more jobs it may claim, given the jobs it has in flight.

`limit` permits; a claim of n jobs takes n, and each of those jobs gives its permit back when its handler
is done (finished, crashed or cut off at shutdown). With the semaphore on, the worker asks before each
claim and claims at most that many, so it never holds more than `limit` jobs. With its own Permits (not
a learner's), a worker's success may also pass its permit straight to one job claimed in the same commit:
the permit is then held on, by one job after the other, never by two. What this does not bound: the
other workers (a fleet limit does, in PostgreSQL) or how often requests are sent.
"""

from __future__ import annotations

from typing import Protocol


class ClaimPermits(Protocol):
    def free(self) -> int: ...

    def taken(self, n: int) -> None: ...

    def released(self) -> None: ...


class Permits:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # jobs this worker may have in flight at once
        self.in_flight = 0

    def free(self) -> int:
        """How many more jobs the worker may claim now."""
        return self.limit - self.in_flight

    def taken(self, n: int) -> None:
        """The worker just claimed `n` jobs."""
        self.in_flight += n

    def released(self) -> None:
        """One of the worker's jobs is done: its permit is free again."""
        self.in_flight -= 1


class Unlimited:
    """The semaphore off: every claim may take up to `claim_limit` jobs, whatever is in flight."""

    def __init__(self, claim_limit: int) -> None:
        self.claim_limit = claim_limit

    def free(self) -> int:
        return self.claim_limit

    def taken(self, n: int) -> None:
        pass

    def released(self) -> None:
        pass
