"""The harness's switches for the core's named fault points (`reliableq.hooks`): a `FaultPlan` arms them.

The core calls `await hook.reach(point, job)` at each named point; a FaultPlan is such a hook, and
unarmed it does nothing. Tests, stages and the chaos suite arm a point to crash or pause there. Faults
live here, in the harness's hands, never as sleeps sprinkled through library code. A crash is either
simulated in-process (`SimulatedCrash`: the worker stops dead: no finalize, no lease release, its open
transaction rolled back) or real (SIGKILL to its own process, for the demos that run separate
processes). A third kind of fault loses the answer to a COMMIT that succeeded, as a dropped connection
would: the caller cannot tell.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from reliableq.hooks import FaultHook, SimulatedCrash

# Which of the core's points (reliableq.hooks.POINTS) each action may be armed at. Crashes: worker points,
# in the order a job passes them, and the API's point between 202 and commit.
CRASH_POINTS = ("after_claim_before_effect", "after_effect_before_finalize", "during_finalize",
                "after_ack_before_commit", "after_commit_before_ack")
# Where `reliableq api --crash-at` may kill the API: a committed submission whose 202 never leaves.
API_KILL_POINTS = ("after_commit_before_ack",)
# Pauses may also stop a naive claimer between its read and its update (stage `skip-locked`), hold a
# handler inside its effect while its lease is renewed (a slow dependency), hold a group of successes
# before their commit (a slow commit), or hold a renewal inside its transaction (a slow renewal).
PAUSE_POINTS = CRASH_POINTS + ("before_claim_update", "during_effect", "before_group_commit", "during_renewal")
# A pause here stands for a stopped worker (a GC pause, SIGSTOP): its lease may run out, and that is
# the fault's doing. A pause anywhere else stands for slow work by a live worker, which keeps its lease.
STALLING_POINTS = ("after_claim_before_effect", "after_effect_before_finalize", "during_renewal")
# Where an answer can be lost: after a finalize's COMMIT succeeded, before the worker hears of it.
LOST_ANSWER_POINTS = ("after_finalize_commit",)


class AnswerLost(psycopg.OperationalError):
    """Raised at an armed lost-answer point: the statement committed, but the connection dropped
    before its answer arrived, so the caller sees a database error it cannot tell from a failure."""


JobFilter = Callable[[Any], bool]


@dataclass(frozen=True)
class Triggered:
    at: datetime  # wall clock, comparable with PostgreSQL's clock_timestamp() on the same machine
    point: str
    action: str  # crash | kill | pause | resume | lose_answer
    job_id: Any
    worker_id: str


@dataclass
class _Armed:
    action: str  # "crash" | "kill" | "pause" | "lose_answer"
    times: int  # how many more hits trigger it
    job_filter: JobFilter | None
    pause_seconds: float = 0.0
    resume: asyncio.Event | None = None


@dataclass
class FaultPlan(FaultHook):
    """Armed faults by point. One plan may be shared by several in-process workers."""

    stops_inside_transactions = True  # whatever is armed now: a plan may be armed while a finalize runs

    armed: dict[str, list[_Armed]] = field(default_factory=dict)
    triggered: list[Triggered] = field(default_factory=list)  # in order; read by timelines
    pauses_in_progress: int = 0  # a harness waits for these before judging a run

    def arm_crash(self, point: str, *, times: int = 1, job_filter: JobFilter | None = None,
                  real_kill: bool = False) -> None:
        """Crash the worker the next `times` times it reaches `point` (SIGKILL if `real_kill`)."""
        self._check(point, CRASH_POINTS)
        if point in API_KILL_POINTS and not real_kill:
            # In process there is no connection to drop: the client would hear an answer, not silence.
            raise ValueError(f"{point} loses an answer only with a real kill (real_kill=True)")
        self.armed.setdefault(point, []).append(
            _Armed("kill" if real_kill else "crash", times, job_filter))

    def arm_pause(self, point: str, *, seconds: float = 0.0, until: asyncio.Event | None = None,
                  times: int = 1, job_filter: JobFilter | None = None) -> None:
        """Pause the worker at `point` for `seconds`, or until the event `until` is set."""
        self._check(point, PAUSE_POINTS)
        if until is None and seconds <= 0:
            raise ValueError("a pause needs positive seconds or an event to wait for")
        self.armed.setdefault(point, []).append(
            _Armed("pause", times, job_filter, pause_seconds=seconds, resume=until))

    def arm_lost_answer(self, point: str = "after_finalize_commit", *, times: int = 1,
                        job_filter: JobFilter | None = None) -> None:
        """Lose the answer to the next `times` committed finalizes at `point` (raise AnswerLost)."""
        self._check(point, LOST_ANSWER_POINTS)
        self.armed.setdefault(point, []).append(_Armed("lose_answer", times, job_filter))

    @staticmethod
    def _check(point: str, allowed: tuple[str, ...]) -> None:
        if point not in allowed:
            raise ValueError(f"unknown fault point {point!r}; expected one of {', '.join(allowed)}")

    def _take(self, point: str, job: Any) -> _Armed | None:
        for armed in self.armed.get(point, []):
            if armed.times > 0 and (armed.job_filter is None or armed.job_filter(job)):
                armed.times -= 1
                return armed
        return None

    async def reach(self, point: str, job: Any = None, worker_id: str = "") -> None:
        armed = self._take(point, job)
        if armed is None:
            return
        job_id = getattr(job, "id", job)
        self.triggered.append(Triggered(datetime.now(UTC), point, armed.action, job_id, worker_id))
        if armed.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if armed.action == "crash":
            raise SimulatedCrash(point, job_id)
        if armed.action == "lose_answer":
            raise AnswerLost(f"the connection dropped after COMMIT at {point} (simulated); its answer was lost")
        self.pauses_in_progress += 1
        try:
            if armed.resume is not None:
                await armed.resume.wait()
            else:
                await asyncio.sleep(armed.pause_seconds)
        finally:
            self.pauses_in_progress -= 1
        self.triggered.append(Triggered(datetime.now(UTC), point, "resume", job_id, worker_id))

