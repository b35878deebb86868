"""Exercise 04, leases: write the lease into the claim: an expiry set at claim time on PostgreSQL's clock,
and a RUNNING job whose lease has expired counted as due. The starter is the skip-locked claim with
leases off (no expiry, no reclaim), which is what the stage runs with leases off; the reference is the
shipped claim with leases always on. Both are made from sql/queue.sql, so the exercise cannot drift
from the queue it grades. Exercise 03's checks run again on the learner's claim (it replaces the same
query), so dropping the lock is named as a regression of skip-locked."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from reliableq import db
from reliableq.config import Mechanisms
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, load_queries
from reliableq.lab.exercises.skip_locked import QUERY, claim_file, shipped, try_claim
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult, job_labels
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Job, Queue

FILENAME = "leases.sql"
EXPIRY_MARK = "-- ✎ leases: until when does this claim hold the job? (NULL: for ever)"
RECLAIM_MARK = "-- ✎ leases: which RUNNING job is due again?"
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
--      another worker's work in progress.
-- A job on its last attempt is not claimed again once stage dead's budget is on: give the reclaim
-- `AND (NOT %(enforce_budget)s OR attempts < max_attempts)` too. `expired` already closes the claim
-- you take over, and the lock (`FOR UPDATE SKIP LOCKED`) is exercise 03's: keep it.
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
    text = _RECLAIM.sub(lambda m: f"\n{m['indent']}{RECLAIM_MARK}\n", text)
    return _EXPIRY.sub(lambda m: f"{m['indent']}{EXPIRY_MARK}\n{m['indent']}lease_expires_at = NULL,\n", text)


STARTER = claim_file(HEADER, _without_leases(shipped()))
REFERENCE = claim_file(HEADER, _with_leases(shipped()))

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
    "Add to `due`'s WHERE: OR (status = 'RUNNING' AND lease_expires_at <= coalesce(%(now)s::timestamptz, "
    "now()) AND (NOT %(enforce_budget)s OR attempts < max_attempts)).",
)

MECHANISMS = Mechanisms.up_to("leases")  # stage 04's switches
SHORT_LEASE, LONG_LEASE = 0.3, 30.0  # seconds: a lease the check sees run out, and one it must not
CLOCK_SLACK = timedelta(milliseconds=50)  # a claim's own now() and the reads around it


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, (QUERY,)))


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """On a scratch database: worker-1 claims one job with a short lease and the other with a long one;
    each expiry must be the lease length after the claim on PostgreSQL's clock. worker-2's claim must not
    take the long-leased job while its lease is live, and must take the other once its lease ran out
    (waited for on the database's clock, so a claim that reads now() rather than %(now)s is graded the
    same), closing worker-1's claim of it as expired."""
    with db.scratch_databases("rq_exercise") as databases:
        async with await db.open_pool_checked(databases.queue_url, max_size=2) as pool:
            queue = Queue(pool, MECHANISMS, replaced_queries=pieces.queue_queries)
            ids = [(await queue.submit(Submission({"amount_cents": 1000 + n, "currency": "USD"}, 5))).id
                   for n in range(2)]
            labels = job_labels(ids)
            expiries, stolen, stranded, unclosed = [], [], [], []
            short = await _claimed(queue, SHORT_LEASE, labels, expiries)
            long = await _claimed(queue, LONG_LEASE, labels, expiries)
            taken = {job.id for job in await queue.claim(2, "worker-2", LONG_LEASE)}
            if short.lease_expires_at is not None and short.id not in taken:
                await wait_until(lambda: _passed(queue, short.lease_expires_at), 5.0,
                                 f"{labels[str(short.id)]}'s lease to run out")
                taken |= {job.id for job in await queue.claim(2, "worker-2", LONG_LEASE)}
            if long.id in taken:
                stolen.append({"job": labels[str(long.id)], "lease": f"{LONG_LEASE:g} s, still running",
                               "taken by": "worker-2"})
            if short.id not in taken:
                stranded.append({"job": labels[str(short.id)], "status": (await queue.get(short.id)).status,
                                 "lease": f"{SHORT_LEASE:g} s, ran out"})
            else:
                first = (await queue.attempts_of(short.id))[0]
                if first["outcome"] != "expired":
                    unclosed.append({"job": labels[str(short.id)], "worker-1's claim": first["outcome"] or "open"})
    return [Check("a claim's lease expires lease_seconds after the claim, on PostgreSQL's clock", expiries),
            Check("a job whose lease is still running is never claimed by another worker", stolen),
            Check("a RUNNING job whose lease has run out is due: another worker claims it", stranded),
            Check("the claim it takes over is closed as expired", unclosed)]


async def _claimed(queue: Queue, lease_seconds: float, labels: dict[str, str], wrong: list[dict]) -> Job:
    """worker-1's claim of one job with `lease_seconds`; its expiry, if not where it should be, added to
    `wrong`."""
    before = await queue.database_now()
    claimed = await queue.claim(1, "worker-1", lease_seconds)
    if len(claimed) != 1:
        raise LearnerError(f"{FILENAME}: asked for one job of the PENDING ones, the claim took {len(claimed)}")
    (job,) = claimed
    after = await queue.database_now()
    lease = timedelta(seconds=lease_seconds)
    expires = job.lease_expires_at
    if expires is None or not before + lease - CLOCK_SLACK <= expires <= after + lease + CLOCK_SLACK:
        wrong.append({"job": labels[str(job.id)], "lease": f"{lease_seconds:g} s",
                      "expires": "never (NULL)" if expires is None
                      else f"{(expires - before).total_seconds():.2f} s after the claim"})
    return job


async def _passed(queue: Queue, moment: datetime) -> bool:
    return await queue.database_now() > moment


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    await try_claim(pieces, FILENAME)
    result = await stages.get("leases").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    m = result.measurements
    left = [{"job": row["job"], "status": row["status"]} for row in result.rows() if row["status"] != "SUCCEEDED"]
    return Check("stage 04's dead worker: every job worker-1 held is claimed again by worker-2 once its lease "
                 "ran out, and succeeds", left,
                 note=f"stranded {m['stranded']}, reclaimed by worker-2 {m['reclaimed_by_worker_2']}"), result


EXERCISE = Exercise(name="leases", stage_number=4, filename=FILENAME,
                    summary="the claim's lease: an expiry on PostgreSQL's clock, and expired leases due (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
