"""Exercise 04, leases: write the lease into the claim: an expiry set at claim time on PostgreSQL's clock,
and a RUNNING job whose lease has expired counted as due. The starter is the skip-locked claim with
leases off (no expiry, no reclaim), which is what the stage runs with leases off; the reference is the
shipped claim with leases always on. Both are made from sql/queue.sql, so the exercise cannot drift
from the queue it grades. Exercise 03's checks run again on the learner's claim (it replaces the same
query), so dropping the lock is named as a regression of skip-locked."""

from __future__ import annotations

import re
from datetime import timedelta

from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code, schedules, skip_locked
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.exercises.skip_locked import QUERY, TRY_PARAMS, claim_file, shipped, try_claim
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

FILENAME = "leases.sql"
EXPIRY_MARK = "-- ✎ leases: until when does this claim hold the job? (NULL: for ever)"
RECLAIM_MARK = "-- ✎ leases: in place of FALSE, which RUNNING job is due again?"
BUDGET_GIVEN = "-- given: stage 08's attempt budget; keep it"
# The shipped claim's reclaim branch, `OR (%(reclaim_expired)s AND <condition>)` over its lines, and its
# expiry, `lease_expires_at = <expiry>,` over two lines.
_RECLAIM = re.compile(r"\n(?P<indent> *)OR \(%\(reclaim_expired\)s AND (?P<condition>[^\n]*(?:\n +AND [^\n]*)*)\)\n")
_EXPIRY = re.compile(r"(?P<indent> *)lease_expires_at = (?P<expiry>[^\n]*\n[^\n]*),\n")

HEADER = """-- Exercise 04, leases. Make a claim a lease: it expires, and an expired one makes the job due again.
--
-- A worker that dies after claiming leaves its jobs RUNNING. As it stands this claim never lets them go:
-- it sets no expiry (lease_expires_at stays NULL) and counts only PENDING jobs as due, so no other
-- worker ever claims them again (stage 04: stranded 4). Where the lines are marked ✎:
--   1. set lease_expires_at: %(lease_seconds)s from now, on PostgreSQL's clock (never the worker's);
--   2. count as due a RUNNING job whose lease has expired, and only then: a job under a live lease is
--      another worker's work in progress. Write it in place of FALSE. The line after it is given: once
--      stage 08 (dead) is on, a job whose attempts are spent is not claimed again. Keep it.
-- `expired` already closes the claim you take over. The lock is exercise 03's (your own answer, if you
-- passed 03 before starting this one): keep it.
--
-- Parameters you can use: %(now)s (NULL, except when a test moves the clock: write
-- coalesce(%(now)s::timestamptz, now()) where you mean "now"), %(lease_seconds)s, %(enforce_budget)s.
-- Keep the `-- name:` line.
--
-- Check it with:  reliableq exercise check leases

"""


def _with_leases(text: str) -> str:
    return _RECLAIM.sub(lambda m: f"\n{m['indent']}OR ({m['condition']})\n", text)


def _without_leases(text: str) -> str:
    def reclaim_asked(m: re.Match) -> str:
        # The budget is stage 08's: given, so that this starter asks only for what stages up to 04 teach.
        budget = m["condition"].rsplit("\n", 1)[-1].strip()
        if "%(enforce_budget)s" not in budget:
            raise ValueError(f"the shipped reclaim no longer ends with the attempt budget: {budget!r}")
        return f"\n{m['indent']}OR (FALSE  {RECLAIM_MARK}\n{m['indent']}    {budget})  {BUDGET_GIVEN}\n"
    text = _RECLAIM.sub(reclaim_asked, text)
    return _EXPIRY.sub(lambda m: f"{m['indent']}{EXPIRY_MARK}\n{m['indent']}lease_expires_at = NULL,\n", text)


STARTER = claim_file(HEADER, _without_leases(shipped()))
REFERENCE = claim_file(HEADER, _with_leases(shipped()))


def starter_on(skip_locked_file: str) -> str | None:
    """The starter made from the learner's own claim of exercise 03 (their lock, the lease left out), or None
    when their file no longer holds the claim's reclaim and expiry lines as shipped."""
    try:
        claim = load_queries(skip_locked_file, skip_locked.FILENAME, (QUERY,))[QUERY]
    except learner_code.LearnerError:
        return None
    if not (_RECLAIM.search(claim) and _EXPIRY.search(claim)):
        return None
    return claim_file(HEADER, _without_leases(claim))

WHY = ("The claim writes `lease_expires_at = now() + lease_seconds` on PostgreSQL's clock, the one clock every "
       "worker shares (a worker's own clock may be off, or frozen while it is paused). A live worker renews "
       "its lease while it works, so only a dead or stalled worker's lease runs out. The claim then treats "
       "`status = 'RUNNING' AND lease_expires_at <= now()` as due, exactly like a PENDING job whose time has "
       "come: the expired claim is closed as `expired`, the job gets a fresh token and a new expiry, and "
       "another worker finishes it. A RUNNING job whose lease is still live is never due, or the claim would "
       "take work a healthy worker is doing.")

HINTS = (
    "Two things are missing: the claim never says until when it holds the job, and a RUNNING job is never "
    "due. Start with the first: what should lease_expires_at be?",
    "lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s). "
    "Now: when is a RUNNING job due again?",
    "In place of FALSE: status = 'RUNNING' AND lease_expires_at <= coalesce(%(now)s::timestamptz, now()).",
)

MECHANISMS = Mechanisms.up_to("leases")  # stage 04's switches
LEASES = (30.0, 120.0)  # seconds: two lengths, so an expiry that ignores %(lease_seconds)s is seen
CLOCK_SLACK = timedelta(milliseconds=50)  # a claim's own clock reads and the reads around it
# The switches the domain of job states is claimed under: the claim always reclaims (leases on), with the
# attempt budget enforced (stage dead on) and not.
BUDGET = (True, False)


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, (QUERY,)))


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Forced on a scratch database: claims with two lease lengths, whose expiries must be that long
    after the claim on PostgreSQL's clock; then one claim over a job in every state (due, not yet due,
    under a live lease, lease run out before, on and past its last attempt, finished), with
    %(enforce_budget)s on and off. Leases run out because the check writes their expiry an hour into the
    past, so a claim reading now(), clock_timestamp() or %(now)s gets one verdict, and nothing waits."""
    claim = pieces.queue_queries[QUERY]
    async with schedules.scratch(MECHANISMS) as scratch:
        # SQL PostgreSQL refuses is said at the learner's line before any schedule runs it.
        await learner_code.try_queries({QUERY: claim}, FILENAME, scratch.url, TRY_PARAMS)
        expiries = []
        for lease_seconds in LEASES:
            expiries += await _expiry_wrong(scratch, claim, lease_seconds)
        runs = [await schedules.claim_over_every_state(scratch, claim, True, enforce) for enforce in BUDGET]
    return [Check("a claim's lease expires lease_seconds after the claim, on PostgreSQL's clock", expiries),
            *schedules.domain_checks(runs, closing=True)]


async def _expiry_wrong(scratch: schedules.Scratch, claim: str, lease_seconds: float) -> list[dict]:
    """worker-1's claim of the one job there is, due, with `lease_seconds`: a row if its expiry is not
    where it should be."""
    await scratch.run("lab_jobs_clear")
    await scratch.submit(1)
    before = await scratch.shipped.database_now()
    async with await scratch.connect() as conn:
        claimed = await schedules.claim_once(conn, claim, worker_id="worker-1", limit=1, reclaim_expired=True,
                                             enforce_budget=False, lease_seconds=lease_seconds)
    after = await scratch.shipped.database_now()
    if len(claimed) != 1:
        return [{"lease": f"{lease_seconds:g} s", "claimed": f"{len(claimed)} jobs of the one due"}]
    lease = timedelta(seconds=lease_seconds)
    expires = claimed[0]["lease_expires_at"]
    if expires is not None and before + lease - CLOCK_SLACK <= expires <= after + lease + CLOCK_SLACK:
        return []
    said = "never (NULL)" if expires is None else f"{(expires - before).total_seconds():.0f} s after the claim"
    return [{"lease": f"{lease_seconds:g} s", "expires": said}]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    await try_claim(pieces, FILENAME)
    result = await reliableq_stages.get("leases").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    m = result.measurements
    left = [{"job": row["job"], "status": row["status"]} for row in result.rows() if row["status"] != "SUCCEEDED"]
    return Check("stage 04's dead worker: every job worker-1 held is claimed again by worker-2 once its lease "
                 "ran out, and succeeds", left,
                 note=f"stranded {m['stranded']}, reclaimed by worker-2 {m['reclaimed_by_worker_2']}"), result


EXERCISE = Exercise(name="leases", stage_number=4, filename=FILENAME,
                    summary="the claim's lease: an expiry on PostgreSQL's clock, and expired leases due (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct, builds_on=("skip-locked", skip_locked.FILENAME, starter_on))
