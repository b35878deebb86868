"""Exercise 03, skip-locked: write the claim's lock, so that each due job is taken by one claimer only and
a claimer skips the jobs another one holds. The starter is the shipped claim without its lock; the
reference is the shipped claim. Both are made from sql/queue.sql, so the exercise cannot drift from the
queue it grades.

The forced schedules (`direct`, run first) catch each class of wrong lock in the interleaving that shows
it, as PostgreSQL's isolation tester would: claims that read the same rows at the same moment (a lock
claimers can share, FOR SHARE or FOR KEY SHARE, or none: a job taken twice, a wait, a deadlock), a claim
meeting rows another holds (FOR UPDATE waits, NOWAIT fails), and a claim over a job in every state (a
WHERE that takes a job not yet due, under a live lease, or finished). The stage's scenario then makes its
two workers' claims meet in the real system.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import AsyncExitStack
from dataclasses import dataclass

import psycopg

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code, schedules
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult, job_labels
from reliableq.scratch import scratch_databases

FILENAME = "skip_locked.sql"
QUERY = "job_claim_due_skip_locked"
MARK = "-- ✎ skip-locked: lock the rows read here, and skip the rows another claimer holds"
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


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, (QUERY,)))


CLAIMERS = ("claimer-A", "claimer-B", "claimer-C", "claimer-D")
PER_CLAIM = 2
# The switches the domain of job states is claimed under: leases on (a later stage's claim always
# reclaims, and this one must stay right there), with and without the attempt budget.
SWITCHES = ((True, True), (True, False))


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Forced on a scratch database, in order: one claim over a job in every state (due, not yet due,
    under a live lease, out of attempts, finished), judged on what it leaves too; four claims that have
    all read the due jobs before any of them writes one (held at a barrier in front of every update of a
    job row, then let go together); claimer A's claim holding its transaction open while claimer B
    claims; claimer B claiming while claimer A holds two jobs read with a lock claimers share, not yet
    written (the moment two such claims meet, made to happen whatever PostgreSQL's plan and timing)."""
    claim = pieces.queue_queries.get(QUERY, shipped())
    async with schedules.scratch(MECHANISMS) as scratch:
        # SQL PostgreSQL refuses is said at the learner's line before any schedule runs it.
        await learner_code.try_queries({QUERY: claim}, FILENAME, scratch.url, TRY_PARAMS)
        runs = [await schedules.claim_over_every_state(scratch, claim, reclaim, enforce)
                for reclaim, enforce in SWITCHES]
        await scratch.run("lab_jobs_clear")
        same_moment = await read_at_the_same_moment(scratch, claim)
        await scratch.run("lab_jobs_clear")
        held = await claimed_while_another_holds(scratch, claim)
        await scratch.run("lab_jobs_clear")
        shared = await claimed_while_another_reads(scratch, claim)
    return [*schedules.domain_checks(runs, closing=True), *same_moment, held, shared]


@dataclass(frozen=True)
class Layout:
    """The jobs a schedule of claims meets: due PENDING jobs, or RUNNING jobs whose leases ran out (which a
    claim takes with reclaim_expired: the fair claim reads those in a branch, and locks, of their own)."""

    detail: str  # how the checks name the jobs, after "jobs"
    lapsed: bool = False

    async def lay_out(self, scratch: schedules.Scratch, n: int) -> list:
        ids = await scratch.submit(n)
        if self.lapsed:
            await scratch.lapse(ids)
        return ids


DUE = Layout("")
LAPSED = Layout(" whose leases ran out", lapsed=True)


async def _claim(conn: psycopg.AsyncConnection, claim: str, worker_id: str, limit: int,
                 layout: Layout) -> list[dict]:
    return await schedules.claim_once(conn, claim, worker_id=worker_id, limit=limit, reclaim_expired=layout.lapsed,
                                      enforce_budget=False, lease_seconds=LEASE_SECONDS)


async def read_at_the_same_moment(scratch: schedules.Scratch, claim: str, layout: Layout = DUE) -> list[Check]:
    """Four claims of two, eight due jobs: each claim reads (and locks, as it locks) its rows, then waits
    at the barrier at its first update, until every claim has returned or waits; then all go on. A lock
    that claimers can share lets two of them read the same rows here: one then waits for the other's
    update, and either both take the job or they deadlock."""
    ids = await layout.lay_out(scratch, len(CLAIMERS) * PER_CLAIM)
    labels = job_labels(ids)
    async with AsyncExitStack() as stack:
        conns = {name: await stack.enter_async_context(await scratch.connect()) for name in CLAIMERS}
        async with schedules.barrier(scratch):
            statements = {name: (asyncio.create_task(_claim(conn, claim, name, PER_CLAIM, layout)),
                                 conn.info.backend_pid) for name, conn in conns.items()}
            waits = await schedules.waiting_or_done(scratch, statements)
        outcomes = {name: await schedules.outcome(task) for name, (task, _) in statements.items()}
    taken = {name: [row["id"] for row in rows or ()] for name, (rows, _) in outcomes.items()}
    by_job = {job_id: [name for name, jobs in taken.items() if job_id in jobs] for job_id in ids}
    attempts = {job_id: (await scratch.shipped.get(job_id)).attempts for job_id in ids}
    twice = [{"job": labels[str(job_id)], "A": attempts[job_id], "claimed by": " and ".join(names) or "none"}
             for job_id, names in by_job.items()
             if len(names) > 1 or attempts[job_id] > 1 + layout.lapsed]  # a lapsed job was worker-0's first
    stalled = [{"claimer": name, "waited for": " and ".join(others)} for name, others in waits.items()]
    stalled += [{"claimer": name, "failed": failed} for name, (_, failed) in outcomes.items() if failed]
    counts = [{"claimer": name, "asked for": PER_CLAIM, "took": len(jobs)} for name, jobs in taken.items()
              if len(jobs) > PER_CLAIM]
    if not twice and not stalled and not counts and sum(map(len, taken.values())) < len(ids):
        counts.append({"claimers": len(CLAIMERS), "each asked for": PER_CLAIM, "jobs due": len(ids),
                       "taken in all": sum(map(len, taken.values()))})
    said = f"{len(CLAIMERS)} claims that read the {'jobs' + layout.detail if layout.lapsed else 'due jobs'} at the " \
           "same moment"
    return [Check(f"{said} take different jobs: none is claimed twice", twice),
            Check(f"{said} neither wait for each other nor fail", stalled),
            Check(f"{said} each take at most the {PER_CLAIM} jobs asked for, and together every due job", counts)]


async def claimed_while_another_holds(scratch: schedules.Scratch, claim: str, layout: Layout = DUE) -> Check:
    """Four due jobs: claimer A claims two and holds its transaction open; claimer B asks for two while A
    holds them, and must return at once with the other two; then A commits."""
    ids = await layout.lay_out(scratch, 4)
    labels = job_labels(ids)
    async with (await scratch.connect(autocommit=False) as held, await scratch.connect() as other):
        taken_by_a = {row["id"] for row in await _claim(held, claim, "claimer-A", 2, layout)}
        b_claim = asyncio.create_task(_claim(other, claim, "claimer-B", 2, layout))
        waits = await schedules.waiting_or_done(scratch, {"claimer-B": (b_claim, other.info.backend_pid)},
                                                holders={held.info.backend_pid: "claimer-A"})
        await held.commit()
        rows, b_failed = await schedules.outcome(b_claim)
    taken_by_b = {row["id"] for row in rows or ()}

    def named(jobs: set) -> str:
        return ", ".join(labels[str(job_id)] for job_id in ids if job_id in jobs) or "none"
    both = taken_by_a & taken_by_b
    wrong = [{"claimer B": "took jobs claimer A held", "jobs": named(both)}] if both else []
    if len(taken_by_a) > 2:
        wrong.append({"claimer A asked for": 2, "took": named(taken_by_a)})
    if waits:
        wrong.append({"claimer B": "waited for claimer A's lock"})
    if b_failed:
        wrong.append({"claimer B": f"failed: {b_failed}"})
    if not wrong and len(taken_by_b - taken_by_a) < min(2, len(ids) - len(taken_by_a)):
        wrong.append({"claimer B asked for": 2, "took": named(taken_by_b), "while A held": named(taken_by_a),
                      "jobs due": len(ids)})
    return Check(f"while claimer A's claim holds two jobs{layout.detail} (its transaction open), claimer B's claim "
                 "skips them: it takes the other two at once, neither waiting nor failing", wrong)


async def claimed_while_another_reads(scratch: schedules.Scratch, claim: str, layout: Layout = DUE) -> Check:
    """Four due jobs: claimer A has read the first two with a lock claimers share (FOR SHARE) and not yet
    written them, as a claim whose lock can be shared stands between its read and its update; claimer B
    asks for two, and must pass over A's and take the other two at once. Started together, two such
    claims meet here only when PostgreSQL happens to run both reads before either update (the plan reads
    `due` lazily, a row at a time): held open here, they meet every time. A lock claimers can share
    (FOR SHARE, FOR KEY SHARE, none) takes A's jobs and then waits for A."""
    ids = await layout.lay_out(scratch, 4)
    labels = job_labels(ids)
    async with (await scratch.connect(autocommit=False) as held, await scratch.connect() as other):
        await held.execute(schedules.lab_query("lab_jobs_hold_shared"), {"ids": ids[:2]})
        b_claim = asyncio.create_task(_claim(other, claim, "claimer-B", 2, layout))
        waits = await schedules.waiting_or_done(scratch, {"claimer-B": (b_claim, other.info.backend_pid)},
                                                holders={held.info.backend_pid: "claimer-A"})
        await held.rollback()
        rows, b_failed = await schedules.outcome(b_claim)
    taken_by_b = {row["id"] for row in rows or ()}
    read_by_a = set(ids[:2])

    def named(jobs: set) -> str:
        return ", ".join(labels[str(job_id)] for job_id in ids if job_id in jobs) or "none"
    wrong = []
    if waits:
        wrong.append({"claimer B": "took jobs claimer A had read, then waited for claimer A to write them",
                      "jobs A had read": named(read_by_a)})
    elif taken_by_b & read_by_a:
        wrong.append({"claimer B": "took jobs claimer A had read", "jobs": named(taken_by_b & read_by_a)})
    if b_failed:
        wrong.append({"claimer B": f"failed: {b_failed}"})
    if not wrong and len(taken_by_b - read_by_a) < 2:
        wrong.append({"claimer B asked for": 2, "took": named(taken_by_b), "while A had read": named(read_by_a),
                      "jobs due": len(ids)})
    return Check(f"while claimer A has read two jobs{layout.detail} with a lock claimers share (FOR SHARE) and not "
                 "yet written them, claimer B's claim passes over them: your lock must be one no other claim's read "
                 "can share, so B takes the other two at once", wrong)


async def try_claim(pieces: Pieces, filename: str, query: str = QUERY) -> None:
    """The learner's claim (`query`: the first-in-first-out one, or the fair one) run once, rolled back: SQL
    PostgreSQL refuses is said at once, at its line (only the claim: `pieces` may hold other exercises'
    queries, which take other parameters)."""
    with scratch_databases("rq_try") as databases:
        await learner_code.try_queries({query: pieces.queue_queries[query]}, filename, databases.queue_url,
                                       TRY_PARAMS)


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    await try_claim(pieces, FILENAME)
    result = await reliableq_stages.get("skip-locked").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    twice = [{"job": row["job"], "A": row["A"]} for row in result.rows() if row["A"] != 1]
    claims = ", ".join(f"{worker} {n}" for worker, n in result.measurements["claims_by_worker"].items())
    return Check("stage 03's two workers: each job is claimed by one worker (A=1)", twice,
                 note=f"claims: {claims}"), result


EXERCISE = Exercise(name="skip-locked", stage_number=3, filename=FILENAME,
                    summary="the claim's lock: each due job taken by one claimer, locked rows skipped (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
