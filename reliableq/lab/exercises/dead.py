"""Exercise 08, dead: write the worker's finalize decision (succeed, retry or dead). The starter never
gives up, which is what the stage shows with DEAD off; the reference is the shipped
reliableq.finalize_decision.decide itself. The invariants are the stage's: a permanent failure goes DEAD
after one attempt, a spent budget goes DEAD at exactly max_attempts, a transient or ambiguous failure is
retried while budget remains, and a DEAD job replays to one charge."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from reliableq import finalize_decision
from reliableq.finalize_decision import DECISIONS, Decision
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, load_function
from reliableq.lab.exercises.properties import smallest_wrong
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.payload import MAX_ATTEMPTS_LIMIT

FILENAME = "dead.py"
FUNCTION = "decide"
KINDS = ("ok", "transient", "permanent", "ambiguous")  # the handlers' classified outcomes (handlers.py)
PAST_BUDGET = 3  # attempts asked past each budget: with DEAD off the worker still asks, and goes on
# An operator's replay sets max_attempts to attempts + up to 100, so budgets grow past what a submission
# may ask, without end: those are searched (seeded), not asked one by one.
REPLAYED_UP_TO = 10**6
EXAMPLES = 200


@st.composite
def replayed(draw: st.DrawFn) -> tuple[str, int, int]:
    """A case with a budget only replays make: attempts near its end (where the decision turns) or anywhere."""
    kind, max_attempts = draw(st.sampled_from(KINDS)), draw(st.integers(MAX_ATTEMPTS_LIMIT + 1, REPLAYED_UP_TO))
    near_the_end = st.integers(max_attempts - PAST_BUDGET, max_attempts + PAST_BUDGET)
    return kind, draw(st.one_of(near_the_end, st.integers(1, REPLAYED_UP_TO + PAST_BUDGET))), max_attempts


HEADER = '''"""Exercise 08, dead. Write decide: what the worker does with a job once its handler has answered.

Without a DEAD state a job is retried until it succeeds, so a card the charge service rejects (422,
a permanent failure) is retried for ever, far past its attempt budget (stage 08 shows it). Decide for
each answer: "succeed", "retry" (later, with backoff) or "dead" (stop, keep the job for an operator
to inspect and replay).

The handler's answer, outcome_kind, is one of:
  ok         the work is done
  transient  not now (503, unreachable): a later try may succeed
  permanent  never (422, card rejected): the same request gets the same answer
  ambiguous  no complete answer: the charge may have happened; a retry with the same key is safe

Check it with:  reliableq exercise check dead
"""
'''

STARTER = HEADER + '''

def decide(outcome_kind: str, attempts: int, max_attempts: int) -> str:
    """'succeed', 'retry' or 'dead' for a job whose attempt number `attempts` (1 for the first) ended
    with `outcome_kind`; `max_attempts` is its budget."""
    if outcome_kind == "ok":
        return "succeed"
    return "retry"
'''

# The shipped decision, as the worker runs it (annotated `str` in the learner's file, which does not
# import the core's Decision type).
REFERENCE = HEADER + "\n\n" + inspect.getsource(finalize_decision.decide).replace("-> Decision:", "-> str:")

WHY = ("The decision reads two things. The kind of failure: a permanent one (the business said no) gets the "
       "same answer every time, so it goes DEAD at once instead of burning the budget. And the budget: any "
       "other failure is retried while attempts < max_attempts, and the attempt numbered max_attempts is the "
       "last one (attempts >= max_attempts: DEAD, not one attempt later). A transient or ambiguous failure "
       "must not die early: a good job would be lost to a hiccup. DEAD keeps the job, so an operator can "
       "replay it with the same idempotency key.")

HINTS = (
    "The starter retries every failure: a 422 is retried for ever. Which outcome can never succeed, "
    "however often it is tried?",
    "A permanent failure goes DEAD at once. Any other failure is retried, but only while the job has budget "
    "left.",
    "attempts counts from 1, and max_attempts attempts are allowed: after attempt number max_attempts "
    "(attempts >= max_attempts) there is no budget left.",
)


def load(text: str) -> Pieces:
    """The learner's decision, asked once for each outcome first: an exception or an answer that is not a
    decision is said at once (the direct checks then ask every case)."""
    decision = LearnerDecision(load_function(text, FILENAME, FUNCTION))
    for kind in KINDS:
        decision(kind, 1, 1)
    return Pieces(decision=decision)


@dataclass(frozen=True)
class LearnerDecision:
    """The learner's decide as the worker calls it, its answer checked to be one of DECISIONS."""
    function: Callable[..., object]

    def __call__(self, outcome_kind: str, attempts: int, max_attempts: int) -> Decision:
        asked = f"({outcome_kind!r}, {attempts}, {max_attempts})"
        try:
            answer = self.function(outcome_kind, attempts, max_attempts)
        except LearnerError as error:
            raise LearnerError(f"{error} (asked decide{asked})") from None
        if answer not in DECISIONS:
            raise LearnerError(f"{FILENAME}: decide must return \"succeed\", \"retry\" or \"dead\"; for "
                               f"{asked} it returned {answer!r}")
        return answer


def cases() -> list[tuple[str, int, int]]:
    """Every outcome × attempts 1 to max_attempts + PAST_BUDGET × every budget the API accepts, smallest
    first."""
    return [(kind, attempts, max_attempts) for max_attempts in range(1, MAX_ATTEMPTS_LIMIT + 1)
            for attempts in range(1, max_attempts + PAST_BUDGET + 1) for kind in KINDS]


def right(kind: str, attempts: int, max_attempts: int) -> Decision:
    """What the invariants require, case by case (the checks' own statement, apart from the reference)."""
    if kind == "ok":
        return "succeed"
    return "dead" if kind == "permanent" or attempts >= max_attempts else "retry"


# The invariants, each with the wrong answers it owns, in the order a learner is told of them.
INVARIANTS = {
    "succeed": "an ok outcome succeeds, and nothing else does",
    "permanent": "a permanent failure goes DEAD at once, on any attempt",
    "retried": "a transient or ambiguous failure is retried while budget remains (attempt < max_attempts)",
    "budget": "a transient or ambiguous failure on the last attempt (attempt >= max_attempts) goes DEAD, not "
              "one attempt later",
}


def _invariant(kind: str, yours: Decision, expected: Decision) -> str:
    return ("succeed" if "succeed" in (yours, expected) else "permanent" if kind == "permanent"
            else "retried" if expected == "retry" else "budget")


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Every case a submitted job can meet, asked (the decision is a pure function with a small range:
    nothing is sampled); then, only if all of them held, a seeded search of the budgets replays reach.
    Each wrong answer is said under the invariant it breaks: its smallest case and how many are like it."""
    asked = cases()
    wrong: dict[tuple[str, str, Decision], list[tuple[str, int, int]]] = {}  # in order of each one's smallest case
    for case in asked:
        yours, expected = pieces.decision(*case), right(*case)
        if yours != expected:
            wrong.setdefault((_invariant(case[0], yours, expected), case[0], yours), []).append(case)
    rows: dict[str, list[dict]] = {invariant: [] for invariant in INVARIANTS}
    for (invariant, _, yours), group in wrong.items():
        lowest, highest = group[0][2], group[-1][2]  # the budgets it is wrong for (cases() goes up by budget)
        rows[invariant].append({**_row(group[0], yours), "wrong in": f"{len(group)} case(s), max_attempts "
                                f"{lowest}" + (f" to {highest}" if highest > lowest else "")})
    if not wrong:
        found = smallest_wrong(replayed(), lambda case: _said(pieces, case), seed, EXAMPLES)
        if found is not None:
            case, _ = found
            yours = pieces.decision(*case)  # an exception the search met is raised here again, naming the case
            rows[_invariant(case[0], yours, right(*case))].append(
                {**_row(case, yours), "found by": f"a seeded search of {EXAMPLES} cases with max_attempts past "
                                                  f"{MAX_ATTEMPTS_LIMIT}, as replays make"})
    note = (f"asked: every outcome × attempts 1 to max_attempts + {PAST_BUDGET} × max_attempts 1 to "
            f"{MAX_ATTEMPTS_LIMIT} ({len(asked):,} cases), then {EXAMPLES} searched with max_attempts up to "
            f"{REPLAYED_UP_TO:,}")
    return [Check(name, rows[invariant], note=note) for invariant, name in INVARIANTS.items()]


def _row(case: tuple[str, int, int], yours: Decision) -> dict:
    kind, attempts, max_attempts = case
    return {"outcome": kind, "attempt": attempts, "max_attempts": max_attempts, "yours": yours,
            "right": right(*case)}


def _said(pieces: Pieces, case: tuple[str, int, int]) -> str | None:
    """What is wrong with the decision on `case`; None if nothing."""
    yours = pieces.decision(*case)
    return None if yours == right(*case) else f"{yours}, where {right(*case)} is right"


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    stage = reliableq_stages.get("dead")
    result = await stage.scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    when_dead = result.measurements.get("attempts_when_dead", {})
    wrong = []
    for row in result.rows():
        attempts = when_dead.get(row["job"])
        if attempts is None:
            wrong.append({"job": row["job"], "status": row["status"], "attempts": row["A"],
                          "but": "never went DEAD"})
        elif attempts != 1:
            wrong.append({"job": row["job"], "went DEAD after": f"{attempts} attempts", "but": "its card was rejected"})
        elif (row["status"], row["C"], row["F"]) != ("SUCCEEDED", 1, 1):
            wrong.append({"job": row["job"], "after its replay": row["status"], "charged": row["C"],
                          "finalized": row["F"]})
    return Check(f"stage 08's rejected cards: each job went DEAD after 1 attempt (its budget is {stage.BUDGET}), "
                 "and its replay succeeded with one charge", wrong,
                 note=f"{result.measurements['dead_jobs']} of {len(result.jobs)} jobs went DEAD"), result


EXERCISE = Exercise(name="dead", stage_number=8, filename=FILENAME,
                    summary="decide(outcome_kind, attempts, max_attempts): succeed, retry or dead",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
