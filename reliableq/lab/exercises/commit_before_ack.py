"""Exercise 02, commit-before-ack: write the order in which the API stores a submission and answers it.

The learner writes `async def accept(store, acknowledge)`; the real API runs it for every submission
(single and batch) in place of its shipped order (reliableq/api.py). The starter is the order the stage
runs with commit_before_ack off (acknowledge, then store); the reference is the order with it on. The
invariant is the stage's: every acknowledged job is stored (lost_jobs = 0). Besides the stage's crash,
a direct check runs accept with a store and an acknowledge that only record what happened, so the order
is graded without depending on when a crash or a commit happens to land.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerCoroutine, LearnerError, load_function
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
    "Await the store, and only then acknowledge. Await it in accept itself: a store started with "
    "asyncio.create_task, or called without await, has not committed when the 202 goes out.",
)

# How long the API waits for accept to acknowledge a submission, and then again for it to finish its
# store: an honest commit takes milliseconds even on a loaded 2-core machine; the harness's client gives
# up after 10 s, so the API answers (500) well before that.
API_DEADLINE_SECONDS = 5.0
# The direct check's store and acknowledge answer at once, so a second is far more than accept needs.
TRIAL_DEADLINE_SECONDS = 1.0
# A store accept starts in a task of its own (rather than awaiting it itself) commits only once accept
# acknowledged, finished, or waited this long: long enough that a 202 sent before the commit is seen,
# short enough that a right answer which awaits such a task is not kept waiting much.
HELD_COMMIT_SECONDS = 0.3


def load(text: str) -> Pieces:
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
    What went wrong inside the API (on the server's thread) is also kept in `errors`, for the check to say."""
    function: Callable[..., LearnerCoroutine]
    deadline_seconds: float = API_DEADLINE_SECONDS
    waiter: str = "the API"  # who waits for accept, in what a miss says
    errors: list[LearnerError] = field(default_factory=list)

    async def __call__(self, store: Callable[[], Awaitable[object]],
                       acknowledge: Callable[[], Awaitable[None]]) -> None:
        acknowledged = False
        async with asyncio.timeout(self.deadline_seconds) as deadline:
            async def acknowledge_noted() -> None:
                nonlocal acknowledged
                acknowledged = True
                deadline.reschedule(asyncio.get_running_loop().time() + self.deadline_seconds)
                await acknowledge()
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

    def _late(self, line: int | None, acknowledged: bool) -> str:
        where = f"{FILENAME}, line {line}" if line else FILENAME
        if acknowledged:
            return (f"{where}: accept acknowledged, then was still waiting here {self.deadline_seconds:g} s later "
                    "(its store, if it has one after the 202, never finished)")
        return (f"{where}: {self.waiter} waited {self.deadline_seconds:g} s for accept to call acknowledge(), "
                "and accept was still waiting here (its client would wait for ever for the 202)")


# -- the direct check: accept with a store and an acknowledge that only record ------------------------


class InsertFailed(Exception):
    """What the recording store raises when the trial makes the insert fail, as a database error would."""


@dataclass
class Trial:
    """What accept did with one submission, in the order it happened."""
    stores: int = 0  # store() calls that ran (an un-awaited store() never runs)
    commits: int = 0
    acknowledgements: int = 0
    acknowledged_before_commit: bool = False
    store_in_own_task: bool = False  # a store started with create_task (or gather), not awaited by accept itself
    late: bool = False  # accept did not acknowledge, or did not finish after it, within the deadline
    waiting_at: int | None = None  # the line accept was still waiting at then


async def trial(order: LearnerOrder, store_fails: bool = False) -> Trial:
    """Run accept once. The commit of a store accept awaits itself follows at once; a store in a task of
    its own commits only once accept acknowledged or finished (or HELD_COMMIT_SECONDS passed), so a 202
    sent without waiting for the commit is seen every time, not by luck. With `store_fails` the insert
    raises instead of committing. An exception in accept, or a step that never ends, raises LearnerError."""
    order = replace(order, deadline_seconds=TRIAL_DEADLINE_SECONDS, waiter="the check", errors=[])
    facts = Trial()
    released = asyncio.Event()
    store_tasks: list[asyncio.Task] = []

    async def store() -> None:
        facts.stores += 1
        if asyncio.current_task() is not accepting:
            facts.store_in_own_task = True
            store_tasks.append(asyncio.current_task())
            try:
                await asyncio.wait_for(released.wait(), HELD_COMMIT_SECONDS)
            except TimeoutError:
                pass  # accept awaits this task (or something else) without acknowledging: let it commit
        await asyncio.sleep(0)  # a commit is a round trip: other tasks run meanwhile
        if store_fails:
            raise InsertFailed("the insert failed (the database refused it)")
        facts.commits += 1

    async def acknowledge() -> None:
        facts.acknowledgements += 1
        facts.acknowledged_before_commit |= facts.commits == 0
        released.set()

    # A store() the learner never awaited is a coroutine nobody runs: the check says so in its own words,
    # so Python's "never awaited" warning would only add noise.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        accepting = asyncio.create_task(order(store, acknowledge))
        try:
            await accepting
        except Late as late:
            facts.late, facts.waiting_at = True, late.line
        except LearnerError as error:
            # The failed insert's exception ending accept is right (the API answers 500); any other is
            # the learner's own, or a step that never ended.
            if not _passes_on_failed_insert(error):
                raise
        finally:
            released.set()
        await asyncio.sleep(0)  # a store task created just before accept returned takes its first step
        if store_tasks:
            await asyncio.wait(store_tasks, timeout=TRIAL_DEADLINE_SECONDS)
        for task in store_tasks:  # a failed insert nobody awaited: counted above, not an unretrieved error
            if task.done() and not task.cancelled():
                task.exception()
    return facts


def _passes_on_failed_insert(error: BaseException) -> bool:
    """Whether `error` is the failed insert's, raised on by accept as it was or as another exception."""
    while error is not None:
        if isinstance(error, InsertFailed):
            return True
        error = error.__context__
    return False


STORED_ONCE = ("the job is stored exactly once: accept awaits store() once (a store() never awaited never runs, "
               "and a second insert of the same job fails)")
ANSWERED_ONCE = ("every submission is answered exactly once: accept calls acknowledge() once (without it the "
                 "client waits for ever; a request has one answer)")
ACK_AFTER_COMMIT = ("every 202 is true when sent: acknowledge() only after store() has committed, and never "
                    "for an insert that failed")


def _trial_checks(facts: Trial) -> list[Check]:
    """STORED_ONCE and ANSWERED_ONCE of a trial whose store commits."""
    late = (f"after {TRIAL_DEADLINE_SECONDS:g} s accept was still waiting at line {facts.waiting_at or '?'}"
            if facts.late else "")
    stored, answered = [], []
    if facts.commits != 1:
        lost = "the acknowledged job is lost" if facts.acknowledgements else "the job is never stored"
        said = {0: f"never ran{': ' + late if late else ''}, so {lost}"}
        stored.append({"store()": said.get(facts.commits, f"ran {facts.commits} times")})
    if facts.acknowledgements != 1:
        said = {0: f"never called ({late or 'accept returned without it'}): the client would wait for ever for "
                   "its 202"}
        answered.append({"acknowledge()": said.get(facts.acknowledgements, f"called {facts.acknowledgements} times")})
    return [Check(STORED_ONCE, stored), Check(ANSWERED_ONCE, answered)]


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Accept run twice with a store and an acknowledge that only record: once with a store that commits
    (stored once, answered once, and the 202 after the commit), once with a store that fails (never
    acknowledged). No database, and the order is seen by construction rather than by when things happen
    to land: the same answer every time, whatever the seed (only an accept that waits on something other
    than its own store meets a deadline)."""
    committed = await trial(pieces.submission_order)
    failed = await trial(pieces.submission_order, store_fails=True)
    early = []
    if committed.acknowledged_before_commit:
        how = ("started in a task of its own, not awaited by accept" if committed.store_in_own_task
               else "not called yet" if committed.stores == 0 else "not committed yet")
        early.append({"acknowledged": "before the insert committed", "store()": how})
    if failed.acknowledgements:
        early.append({"acknowledged": "an insert that failed", "so": "the client holds a 202 for a job never stored"})
    return [*_trial_checks(committed), Check(ACK_AFTER_COMMIT, early)]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult | None]:
    """Stage 02's crash after job-1's 202, with accept in the real API. First one trial: an accept that
    does not store once and answer once is failed on that at once (the stage would wait on a job that
    never comes), and an exception in it is said at its line."""
    import stages
    for check in _trial_checks(await trial(pieces.submission_order)):
        if not check.held:
            return check, None
    try:
        result = await stages.get("commit-before-ack").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
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
