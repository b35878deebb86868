"""Exercise 03, skip-locked: write the claim's lock, so that each due job is taken by one claimer only and
a claimer skips the jobs another one holds. The starter is the shipped claim without its lock; the
reference is the shipped claim. Both are made from sql/queue.sql, so the exercise cannot drift from the
queue it grades.

The stage's scenario makes the two workers' claims meet (rows held locked until both have met them), so
a claim without a lock takes every job twice there, as the naive claim did. What it cannot tell apart is
a claim that waits for the held rows from one that skips them: the direct check forces that step by
step, as PostgreSQL's isolation tester would: claimer A's claim holds its transaction open while
claimer B claims.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

from reliableq import db, sql
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult, job_labels
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Job, Queue

FILENAME = "skip_locked.sql"
QUERY = "job_claim_due_skip_locked"
MARK = "-- ✎ skip-locked: lock the rows read here, and skip the rows another claimer holds"
_LAB_Q = sql.queries("lab_queue")
_LOCK = re.compile(r"^(?P<indent> *)FOR UPDATE SKIP LOCKED$", re.MULTILINE)

HEADER = """-- Exercise 03, skip-locked. Make the claim take each due job for one worker only.
--
-- The claim below reads the due jobs (`due`) and marks them RUNNING for this worker (`claimed`), in one
-- statement. As it stands it locks nothing when it reads: a second worker's claim running at the same
-- moment reads the same jobs as still PENDING, waits for the first claim's update, then marks them
-- again, and both workers run them (A=2). Where the line is marked ✎, lock the rows `due` reads, so
-- that no other claim can take them, and make a claim skip rows another claim holds rather than wait
-- for them (waiting serialises every worker behind one).
--
-- Leave the rest as it is: %(reclaim_expired)s and %(enforce_budget)s are the switches of later stages
-- (leases, dead), and `expired` and `opened` keep the record of each claim. Keep the `-- name:` line.
--
-- Check it with:  reliableq exercise check skip-locked

"""


def shipped() -> str:
    return sql.queries("queue")[QUERY]


def claim_file(header: str, text: str) -> str:
    return f"{header}-- name: {QUERY}\n{text}\n"


STARTER = claim_file(HEADER, _LOCK.sub(lambda m: m["indent"] + MARK, shipped()))
REFERENCE = claim_file(HEADER, shipped())

WHY = ("`FOR UPDATE` locks each row `due` reads until the claim commits, so the UPDATE changes only rows "
       "this claim holds, and a second claim cannot read them as still due. `SKIP LOCKED` makes that second "
       "claim pass over the rows another claim holds and take the next due ones, instead of waiting for the "
       "first to commit (plain FOR UPDATE is safe but lines every worker up behind one claim). The lock, the "
       "LIMIT and the UPDATE are in one statement, so the rows marked are exactly the rows locked. "
       "`FOR NO KEY UPDATE SKIP LOCKED` works as well: a weaker lock, still exclusive between claimers.")

HINTS = (
    "Two claims read the same PENDING rows because reading takes no lock. Which clause of a SELECT locks "
    "the rows it returns?",
    "`FOR UPDATE` at the end of `due` locks its rows until the claim commits. But then a second claim waits "
    "for the first one's lock: what tells it to pass over locked rows instead?",
    "Add `FOR UPDATE SKIP LOCKED` as the last clause of `due`, after its LIMIT.",
)

# Stage 03's switches (skip_locked on, leases and later off) and the lease the claims are given.
MECHANISMS = Mechanisms.up_to("skip_locked")
LEASE_SECONDS = 30.0
# Dummy parameters for trying the claim once on an empty database.
TRY_PARAMS = {"now": None, "limit": 1, "reclaim_expired": True, "enforce_budget": True, "worker_id": "tried",
              "lease_seconds": 1.0}
WAIT_SECONDS = 5.0  # a claim that skips locked rows returns in milliseconds; this is only a backstop


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, (QUERY,)))


class _OneConnection:
    """A pool of one connection, for a Queue whose claim must run on a connection the check controls:
    one that is not in autocommit keeps the claim's transaction, and its locks, open until the check
    commits it."""

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        yield self.conn


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """The race forced one step at a time on a scratch database with four due jobs: claimer A claims two
    and holds its transaction open; claimer B asks for two while A holds them, and must return at once
    with the other two; then A commits and B finishes. No job may be claimed by both."""
    with db.scratch_databases("rq_exercise") as databases:
        async with await db.open_pool_checked(databases.queue_url, max_size=2) as pool:
            queue = Queue(pool, MECHANISMS)
            ids = [(await queue.submit(Submission({"amount_cents": 1000 + n, "currency": "USD"}, 5))).id
                   for n in range(4)]
            labels = job_labels(ids)
            # B's statement timeout is a backstop, never met by a claim that skips.
            async with (await psycopg.AsyncConnection.connect(databases.queue_url) as held,
                        await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True,
                                                              options="-c statement_timeout=10s") as other):
                claimer_a = Queue(_OneConnection(held), MECHANISMS, replaced_queries=pieces.queue_queries)
                claimer_b = Queue(_OneConnection(other), MECHANISMS, replaced_queries=pieces.queue_queries)
                taken_by_a = await claimer_a.claim(2, "claimer-A", LEASE_SECONDS)
                b_claim = asyncio.create_task(claimer_b.claim(2, "claimer-B", LEASE_SECONDS))
                try:
                    waited = await _returned_or_waiting(b_claim, other.info.backend_pid, queue)
                except TimeoutError:
                    b_claim.cancel()  # neither done nor waiting for a lock: a statement far too slow
                    raise
                await held.commit()
                try:
                    taken_by_b, b_failed = await asyncio.wait_for(b_claim, WAIT_SECONDS * 3), None
                except psycopg.Error as error:
                    taken_by_b, b_failed = [], error.diag.message_primary or str(error)
            after = {job_id: await queue.get(job_id) for job_id in ids}
    return _checks(labels, taken_by_a, taken_by_b, after, waited, b_failed)


async def _returned_or_waiting(claim: asyncio.Task, pid: int, queue: Queue) -> bool:
    """Whether the claim in `claim`, on backend `pid`, is waiting for another session's lock (rather than
    done); polled until one or the other."""
    async def settled() -> str | None:
        if claim.done():
            return "returned"
        async with queue.pool.connection() as conn:
            blocked = (await (await conn.execute(_LAB_Q["lab_session_blocked"], {"pid": pid})).fetchone())[0]
        return "waiting" if blocked else None
    return await wait_until(settled, WAIT_SECONDS, "claimer B's claim to return or to wait for a lock") == "waiting"


def _checks(labels: dict[str, str], taken_by_a: list[Job], taken_by_b: list[Job], after: dict,
            waited: bool, b_failed: str | None) -> list[Check]:
    def named(jobs: list[Job]) -> str:
        return ", ".join(labels[str(job.id)] for job in jobs) or "none"

    a_ids, b_ids = {job.id for job in taken_by_a}, {job.id for job in taken_by_b}
    twice = [{"job": labels[str(job_id)], "A": job.attempts, "claimed by": "claimer-A and claimer-B"}
             for job_id, job in after.items() if job_id in a_ids & b_ids or job.attempts > 1]
    free = len(labels) - len(a_ids)
    counts = []
    if len(a_ids) > 2:
        counts.append({"claimer A asked for": 2, "took": named(taken_by_a)})
    if not twice and not b_failed and len(b_ids - a_ids) < min(2, free):
        counts.append({"claimer B asked for": 2, "took": named(taken_by_b),
                       "while A held": named(taken_by_a), "jobs due": len(labels)})
    waits = [{"claimer B": "waited for claimer A's lock"}] if waited else []
    if b_failed:
        waits.append({"claimer B": f"failed: {b_failed}"})
    return [Check("each job is claimed by one claimer at a time: claimer B took none of the jobs claimer A held",
                  twice),
            Check("a claim takes at most as many jobs as it asks for, and claimer B took the due jobs A did not "
                  "hold", counts),
            Check("a claim skips the jobs another claimer holds: it neither waits for that claimer's lock nor "
                  "fails", waits)]


async def try_claim(pieces: Pieces, filename: str) -> None:
    """The learner's claim run once, rolled back: SQL PostgreSQL refuses is said at once, at its line (only
    the claim: `pieces` may hold other exercises' queries, which take other parameters)."""
    with db.scratch_databases("rq_try") as databases:
        await learner_code.try_queries({QUERY: pieces.queue_queries[QUERY]}, filename, databases.queue_url,
                                       TRY_PARAMS)


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    await try_claim(pieces, FILENAME)
    result = await stages.get("skip-locked").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    twice = [{"job": row["job"], "A": row["A"]} for row in result.rows() if row["A"] != 1]
    claims = ", ".join(f"{worker} {n}" for worker, n in result.measurements["claims_by_worker"].items())
    return Check("stage 03's two workers: each job is claimed by one worker (A=1)", twice,
                 note=f"claims: {claims}"), result


EXERCISE = Exercise(name="skip-locked", stage_number=3, filename=FILENAME,
                    summary="the claim's lock: each due job taken by one claimer, locked rows skipped (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
