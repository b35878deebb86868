"""Exercise 02, commit-before-ack: write the order in which the API stores a submission and answers it.

The learner writes `async def accept(store, acknowledge)`; the real API runs it for every submission
(single and batch) in place of its shipped order (reliableq/acknowledgement.py). The starter is the order the stage
runs with commit_before_ack off (acknowledge, then store); the reference is the order with it on. The
invariant is the stage's: every acknowledged job is stored (lost_jobs = 0). Before the stage's crash,
the forced schedules run accept on a clock the check controls (virtual_clock.py) with a store and an
acknowledge that only record: a store held far beyond any timeout, one that fails, one that commits at
once. So the order is graded by what accept does while its insert has not committed, never by when a
crash or a commit happens to land.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from reliableq.lab.exercises import virtual_clock
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import (
    LearnerCoroutine,
    LearnerError,
    lab_awaitable,
    load_function,
    the_labs,
    within_deadline,
)
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import LOST, ScenarioParams, ScenarioResult

FILENAME = "commit_before_ack.py"
FUNCTION = "accept"

STARTER = '''"""Exercise 02, commit-before-ack. Write accept: in which order the API stores a job and answers 202.

When the API answers 202 Accepted, the client stops worrying: it shows "payment scheduled" and will never
send that job again. As it stands, accept answers first and stores afterwards, so an API that crashes
in between (stage 02 crashes it there) leaves the client holding a 202 for a job that was never stored:
job-1 is LOST. Change accept so that every 202 it sends is true.

    await store()        inserts the job and commits it; returns once PostgreSQL has it (raises if not)
    await acknowledge()  sends the client its 202 Accepted; a request has exactly one answer

Check it with:  reliableq exercise check commit-before-ack
"""


async def accept(store, acknowledge):
    """Store one submitted job (or batch) and acknowledge it to the client."""
    await acknowledge()
    await store()
'''

REFERENCE = '''"""Exercise 02, commit-before-ack: the reference. Commit first, then answer."""


async def accept(store, acknowledge):
    """Store one submitted job (or batch) and acknowledge it to the client."""
    await store()  # returns once the insert has committed (and raises if it could not)
    await acknowledge()
'''

WHY = ("`await store()` returns only once PostgreSQL has committed the insert, and raises if it could not; "
       "acknowledging after it means every 202 names a job that is already stored, so a crash at any moment "
       "either comes before the 202 (the client sees an error and retries) or after the commit (the job is "
       "safe). A store that fails is never acknowledged: its exception ends accept before acknowledge(), and "
       "the API answers 500. Started as a task of its own, or not awaited, the insert may not have committed "
       "(or even begun) when the 202 goes out: the same window as answering first.")

HINTS = (
    "The starter sends the 202 first. If the API dies right after that, which of the two steps never "
    "happened, and what does the client believe?",
    "Only one order makes the 202 true at the moment it is sent: the job must already be in the database.",
    "Await the store, and only then acknowledge, however long the store takes: a store called without "
    "await, started in a task nobody waits for, or given up on after a timeout has not committed when the "
    "202 goes out.",
)

# How long the API waits for accept to acknowledge a submission, and then again for it to finish its
# store: an honest commit takes milliseconds even on a loaded 2-core machine; the harness's client gives
# up after 10 s, so the API answers (500) well before that.
API_DEADLINE_SECONDS = 5.0
# The forced schedules run accept on the check's own clock (virtual_clock.py). A slow store is held until
# HELD_SECONDS on it: twelve times the API's own patience, so any timeout after which an accept would
# acknowledge anyway fires first (in the real API a longer one could never send its 202 at all), and at
# no real cost. TRIAL_DEADLINE_SECONDS on that clock bounds each part of accept, as the API's deadline does.
HELD_SECONDS = 60.0
TRIAL_DEADLINE_SECONDS = 2 * HELD_SECONDS
# Real time a trial may take before its clock jumps past every deadline (and a task accept started is
# stopped at its line): a right answer takes milliseconds, one that polls its store every millisecond of
# the clock about a second; only a loop that never ends gets here.
TRIAL_REAL_SECONDS = 5.0
GIVE_UP_AT = 100 * TRIAL_DEADLINE_SECONDS


def load(text: str) -> Pieces:
    # Under learners_time, so that a `from time import monotonic` in the learner's file reads the check's
    # clock in a trial (and the real one anywhere else).
    with virtual_clock.learners_time():
        return Pieces(submission_order=LearnerOrder(load_function(text, FILENAME, FUNCTION)))


class Late(LearnerError):
    """accept did not acknowledge, or did not finish after acknowledging, within its deadline."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line  # of the learner's file, where accept was waiting


@dataclass
class LearnerOrder:
    """The learner's accept as the API calls it (a `SubmissionOrder`): each step of their coroutine within
    the call deadline, and the whole bounded: acknowledged within `deadline_seconds` of the submission,
    finished within as long again after that. A miss cancels it and says at which line it was waiting.
    What went wrong inside the API (on the server's thread) is also kept in `errors`, for the check to say.
    It changes nothing of what accept does: acknowledge() may be called from any task, at any time."""
    function: Callable[..., LearnerCoroutine]
    deadline_seconds: float = API_DEADLINE_SECONDS
    waiter: str = "the API"  # who waits for accept, in what a miss says
    errors: list[LearnerError] = field(default_factory=list)
    # The API's store and acknowledge are wrapped so that what they raise (a database that did not answer)
    # reaches the API as it was: the API's to answer (503), not the learner's mistake. A trial's are not:
    # it tells each store() call's coroutine apart, and marks its own failure (InsertFailed).
    wrap_the_labs: bool = True
    # A trial's: every acknowledge() coroutine accept was given, to close (and say) those it never awaited.
    handed: list[Coroutine] | None = None

    async def __call__(self, store: Callable[[], Awaitable[object]],
                       acknowledge: Callable[[], Awaitable[None]]) -> None:
        acknowledged, running = False, True
        async with asyncio.timeout(self.deadline_seconds) as deadline:
            async def acknowledge_noted() -> None:
                nonlocal acknowledged
                acknowledged = True
                # From another task, or after accept returned, the deadline is not accept's to move.
                if running and not deadline.expired():
                    deadline.reschedule(asyncio.get_running_loop().time() + self.deadline_seconds)
                await acknowledge()
            if self.wrap_the_labs:
                store, acknowledge_noted = lab_awaitable(store), lab_awaitable(acknowledge_noted)
            if self.handed is not None:
                acknowledge_noted = _recorded_in(self.handed, acknowledge_noted)
            learner = self.function(store, acknowledge_noted)
            if not isinstance(learner, LearnerCoroutine):
                raise LearnerError(f"{FILENAME}: define accept with `async def`, so that it can await store() and "
                                   "acknowledge()")
            try:
                await learner
            except LearnerError as error:
                self.errors.append(error)
                raise
            except asyncio.CancelledError:
                if deadline.expired():
                    error = Late(self._late(learner.waiting_at, acknowledged), learner.waiting_at)
                    self.errors.append(error)
                    raise error from None
                raise
            finally:
                running = False

    def _late(self, line: int | None, acknowledged: bool) -> str:
        where = f"{FILENAME}, line {line}" if line else FILENAME
        if acknowledged:
            return (f"{where}: accept acknowledged, then was still waiting here {self.deadline_seconds:g} s later "
                    "(its store, if it has one after the 202, never finished)")
        return (f"{where}: {self.waiter} waited {self.deadline_seconds:g} s for accept to call acknowledge(), "
                "and accept was still waiting here (its client would wait for ever for the 202)")


def _recorded_in(calls: list[Coroutine], function: Callable[[], Coroutine]) -> Callable[[], Coroutine]:
    def recorded() -> Coroutine:
        calls.append(function())
        return calls[-1]
    return recorded


# -- the forced schedules: accept on the check's clock, with a store the check holds ------------------


class InsertFailed(Exception):
    """What the trial's store raises when the trial makes the insert fail, as a database error would."""


@dataclass
class StoreCall:
    """One store() accept called: the coroutine it got, and what became of it."""
    coroutine: Coroutine = field(compare=False)
    in_task: bool = False  # handed to a task (create_task, gather, wait_for...), which may not have begun it
    started: bool = False
    committed: bool = False
    failed: bool = False
    cancelled: bool = False

    def said(self) -> str:
        if self.committed:
            return "committed"
        if self.failed:
            return "failed (the database refused the insert)"
        if self.cancelled:
            return ("cancelled before its insert committed (a timeout around the store? a slow insert has not "
                    "failed: it may still commit)")
        if not self.started and self.in_task:
            return "handed to a task of its own that accept did not wait for, and not even begun"
        if not self.started:
            return "called but never awaited: a coroutine nobody runs, so its insert never happens"
        return f"still running: the check held the insert until {HELD_SECONDS:g} s, as a slow database may"


# How a trial's store behaves: commits at once, is held until HELD_SECONDS, or is held and then fails.
STORES = ("fast", "slow", "failing")


@dataclass
class Trial:
    """What accept did with one submission (equal for two accepts that did the same)."""
    store: str  # one of STORES
    stores: list[StoreCall] = field(default_factory=list)
    acknowledgements: int = 0
    acknowledgements_never_awaited: int = 0  # acknowledge() called, its coroutine never run
    early: list[dict[str, str]] = field(default_factory=list)  # each acknowledge() before any commit: what then
    acknowledged_failure: bool = False  # acknowledge() after the insert failed
    answered: bool = False  # acknowledged before accept ended, as the API needs to send the 202
    error: str | None = None  # accept ended with this exception: the API answers 500
    late: bool = False  # accept did not acknowledge, or did not finish after it, within the deadline
    waiting_at: int | None = None  # the line accept was still waiting at then

    @property
    def commits(self) -> int:
        return sum(call.committed for call in self.stores)


async def trial(order: LearnerOrder, store: str) -> Trial:
    """Run accept once, on a clock of its own (virtual_clock.py), with a store that commits at once
    ("fast"), is held until HELD_SECONDS on that clock ("slow"), or is held and then fails ("failing").
    Every moment is the same on every run, and a held store shows each acknowledgement that did not wait
    for its commit, whatever timeout or poll let it go. An exception in accept with a fast store, or a step
    that never ends, raises LearnerError; with a held store accept may give up (the API answers 500)."""
    order = replace(order, deadline_seconds=TRIAL_DEADLINE_SECONDS, waiter="the check", errors=[], wrap_the_labs=False,
                    handed=[])
    # The outer deadline stops an endless loop in a task accept started (its own steps have theirs).
    return await asyncio.to_thread(within_deadline, virtual_clock.run,
                                   (partial(_trial, order, store), FILENAME, TRIAL_REAL_SECONDS, GIVE_UP_AT),
                                   FILENAME, TRIAL_REAL_SECONDS)


async def _trial(order: LearnerOrder, store_kind: str) -> Trial:
    loop = asyncio.get_running_loop()
    facts = Trial(store_kind)
    released = asyncio.Event()
    if store_kind == "fast":
        released.set()
    else:
        loop.call_at(HELD_SECONDS, released.set)
    answered = loop.create_future()

    async def insert(call: StoreCall) -> None:
        call.started = True
        try:
            await released.wait()
            await asyncio.sleep(0)  # a commit is a round trip: other tasks run meanwhile
        except asyncio.CancelledError:
            call.cancelled = True
            raise
        if store_kind == "failing":
            call.failed = True
            raise the_labs(InsertFailed("the insert failed (the database refused it)"))
        call.committed = True

    def store() -> Coroutine:  # a coroutine, as the API's store() gives: kept, to see whether it ever ran
        call = StoreCall(None)
        call.coroutine = insert(call)
        facts.stores.append(call)
        return call.coroutine

    async def acknowledge() -> None:
        facts.acknowledgements += 1
        facts.acknowledged_failure |= any(call.failed for call in facts.stores)
        if not facts.commits and not facts.acknowledged_failure:
            at = f"at {loop.time():g} s on the check's clock" if loop.time() else "at once"
            calls = facts.stores or [None]
            facts.early += [{"acknowledged": f"{at}, before the insert committed",
                             "store()": call.said() if call else "not called yet"} for call in calls]
        if not answered.done():
            answered.set_result(None)

    # Every task of the trial kept (a factory that only records), to say an endless loop in one accept
    # started, and which store() went to a task.
    tasks: list[asyncio.Task] = []

    def recorded(loop: asyncio.AbstractEventLoop, coroutine: Coroutine, **kwargs: Any) -> asyncio.Task:
        for call in facts.stores:
            call.in_task |= call.coroutine is coroutine
        tasks.append(asyncio.Task(coroutine, loop=loop, **kwargs))
        return tasks[-1]
    loop.set_task_factory(recorded)
    accepting = asyncio.create_task(order(store, acknowledge))
    # As the API does: it answers once accept acknowledged, or (500) once accept ended without that.
    await asyncio.wait({answered, accepting}, return_when=asyncio.FIRST_COMPLETED)
    facts.answered = answered.done()
    # Whatever accept left running (a store in a task of its own, an acknowledgement passed on) ends too,
    # on the check's clock; an endless loop in it is the learner's error to say.
    await asyncio.wait(tasks, timeout=TRIAL_DEADLINE_SECONDS)
    for task in tasks:
        task.cancel()
    outcomes = dict(zip(tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True))
    for call in facts.stores:
        if not call.started:
            call.coroutine.close()  # said in the check's words, not as Python's "never awaited" warning
    for coroutine in order.handed:
        if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
            coroutine.close()  # likewise
            facts.acknowledgements_never_awaited += 1
    failure = outcomes.pop(accepting)
    for outcome in outcomes.values():
        if isinstance(outcome, LearnerError):
            raise outcome
    if isinstance(failure, Late):
        facts.late, facts.waiting_at = True, failure.line
    elif isinstance(failure, InsertFailed):  # the failing store's error, let through: the API answers 500
        facts.error = str(failure)
    elif isinstance(failure, LearnerError):
        if store_kind == "fast":  # the normal case: an exception here is a mistake to show at its line
            raise failure
        facts.error = str(failure)
    elif isinstance(failure, BaseException):
        raise failure  # the check's own
    return facts


ACK_AFTER_COMMIT = ("every 202 is true when sent: acknowledge() only after store() has committed, however long "
                    "the insert takes, and never for an insert that failed")
STORED_ONCE = ("the job is stored exactly once: accept awaits store() once (a store() never awaited never runs, "
               "and a second insert of the same job fails)")
ANSWERED_ONCE = ("every submission is answered exactly once: acknowledge() runs once, before accept returns (a "
                 "call never awaited never runs; without it the client waits for ever; a request has one answer)")


def _stored_once(facts: Trial) -> list[dict[str, str]]:
    if facts.commits == 1:
        return []
    if facts.commits > 1:
        return [{"store()": f"committed {facts.commits} times: a second insert of the same job fails"}]
    lost = "the acknowledged job is lost" if facts.acknowledgements else "the job is never stored"
    if not facts.stores:
        return [{"store()": f"never called, so {lost}"}]
    return [{"store()": f"{call.said()}, so {lost}"} for call in facts.stores]


def _answered_once(facts: Trial) -> list[dict[str, str]]:
    if facts.acknowledgements == 1 and facts.answered:
        return []
    if facts.acknowledgements > 1:
        return [{"acknowledge()": f"called {facts.acknowledgements} times: a request has one answer"}]
    if facts.late:
        where = f"at line {facts.waiting_at}" if facts.waiting_at else "somewhere"
        return [{"acknowledge()": f"{'called, and then' if facts.acknowledgements else 'never called:'} accept was "
                                  f"still waiting {where} {TRIAL_DEADLINE_SECONDS:g} s later on the check's clock, "
                                  "its store long committed"}]
    if facts.acknowledgements:
        return [{"acknowledge()": "called only after accept had returned: the API had already answered 500"}]
    if facts.acknowledgements_never_awaited:
        return [{"acknowledge()": "called but never awaited: a coroutine nobody runs, so no 202 is ever sent"}]
    return [{"acknowledge()": "never called (accept returned without it): the client would wait for ever for its 202"}]


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Accept run three times, each on the check's own clock with a store that only records: a fast one
    (stored once, answered once), a slow store (held until the check lets it go, far beyond any timeout: a
    202 that did not wait for the commit is seen), and a failing one (never acknowledged). No database,
    and no moment left to chance: the same verdict on every run, whatever the seed or the machine's load.
    With a slow or failing store accept may give up with an exception (the API answers 500, no 202)."""
    fast = await trial(pieces.submission_order, "fast")  # first: an exception or an endless loop is said at once
    slow = await trial(pieces.submission_order, "slow")
    failing = await trial(pieces.submission_order, "failing")
    # The slow store shows any 202 that did not wait for its commit; the fast one can only repeat it.
    early = [{"store": "slow", **row} for row in slow.early] or [{"store": "fast", **row} for row in fast.early]
    if failing.acknowledged_failure:
        early.append({"store": "failing", "acknowledged": "an insert that failed",
                      "so": "the client holds a 202 for a job never stored"})
    return [Check(ACK_AFTER_COMMIT, early), Check(STORED_ONCE, _stored_once(fast)),
            Check(ANSWERED_ONCE, _answered_once(fast))]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    """Stage 02's crash after job-1's 202, with accept in the real API (the forced schedules ran before it,
    so an accept that does not store once and answer once never reaches it)."""
    import reliableq_stages
    stage = reliableq_stages.get("commit-before-ack")
    try:
        result = await stage.scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    except RuntimeError:  # a submission answered 500: accept failed inside the API
        if pieces.submission_order.errors:
            raise pieces.submission_order.errors[0] from None
        raise
    lost = [{"job": row["job"], "status": row["status"]} for row in result.rows() if row["status"] == LOST]
    return Check("stage 02's API crash right after job-1's 202: every acknowledged job is stored (lost_jobs = 0)",
                 lost, note=f"{result.measurements['api_crashes']} API crash(es)"), result


EXERCISE = Exercise(name="commit-before-ack", stage_number=2, filename=FILENAME,
                    summary="accept(store, acknowledge): in which order the API stores a job and answers 202",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
