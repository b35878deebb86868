"""Exercise 05, fencing: write the token condition of the four ownership-sensitive updates (renew,
succeed, retry, dead). The starter is the shipped SQL with the condition taken out, which is what the
stage runs with fencing off; the reference is the shipped SQL with fencing always on. Both are made
from sql/queue.sql, so the exercise cannot drift from the queue it grades."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from reliableq import db, sql
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.payload import Submission
from reliableq.queue import Job, Queue

FILENAME = "fencing.sql"
QUERIES = ("job_renew_lease", "job_succeed", "job_retry", "job_dead")
MARK = "-- ✎ fencing: which rows may this owner's write change?"
# The shipped switch: `AND (NOT %(fenced)s OR (<condition>))` in each update's WHERE, and in
# job_succeed's per-claim win `AND (NOT %(fenced)s OR <condition>)`.
_WHERE_SWITCH = re.compile(r"AND \(NOT %\(fenced\)s OR \((?P<condition>[^\n]*)\)\)")
_WIN_SWITCH = re.compile(r" AND \(NOT %\(fenced\)s OR (?P<condition>f\.lease_token = owned\.lease_token)\)")

HEADER = """-- Exercise 05, fencing. Make every write of a job's owner carry its lease token.
--
-- A worker that paused past its lease still believes it owns the job; another worker has reclaimed it.
-- Below are the four updates an owner makes: renew its lease, succeed, retry, dead. As they stand,
-- each changes the job whatever its state and whoever owns it now, so the paused worker's late
-- finalize lands too (stage 05: F=2). Where a line is marked ✎, add the condition under which this
-- owner's write may land. Each update returns whether it won;
-- the worker acts on that.
--
-- Parameters you can use: %(job_id)s, %(lease_token)s (the token of this owner's claim); in job_succeed,
-- one row per claim in `owned` (owned.job_id, owned.lease_token). Keep each `-- name:` line.
--
-- Check it with:  reliableq exercise check fencing

"""


def _shipped(name: str) -> str:
    return sql.queries("queue")[name]


def _file(body: dict[str, str]) -> str:
    return HEADER + "\n\n".join(f"-- name: {name}\n{text}" for name, text in body.items()) + "\n"


def _fenced(text: str) -> str:
    text = _WHERE_SWITCH.sub(lambda m: f"AND ({m['condition']})", text)
    return _WIN_SWITCH.sub(lambda m: f" AND {m['condition']}", text)


def _unfenced(text: str) -> str:
    text = _WHERE_SWITCH.sub(MARK, text)
    return _WIN_SWITCH.sub("", text)


STARTER = _file({name: _unfenced(_shipped(name)) for name in QUERIES})
REFERENCE = _file({name: _fenced(_shipped(name)) for name in QUERIES})

WHY = ("Every write of an owner names the job *and* the claim: `status = 'RUNNING' AND lease_token = "
       "%(lease_token)s`. A reclaim gives the job a new token, so a stale owner's update matches zero rows "
       "and reports that it lost; the attempt records `lost_succeed` (or lost_retry, lost_dead, lost_renew). "
       "The status matters too: a job finished and claimed again later has a new token, but a finished job "
       "whose token was never replaced must not be sent back to PENDING. In job_succeed, the win is per "
       "claim: a stale claim and the current one may be in the same group, and only the token that owns "
       "the job may say it won.")

HINTS = (
    "Which worker owns a job right now? The jobs row records it: the lease token of the current claim.",
    "Each update's WHERE needs: the job is still RUNNING, and its lease_token is this owner's "
    "%(lease_token)s. Do the same in all four: a stale retry or dead is as harmful as a stale success.",
    "job_succeed handles many claims at once (`owned`): compare jobs.lease_token with owned.lease_token, "
    "and in the `won` step say a claim won only if the finalized row's lease_token is that claim's.",
)

# Dummy parameters that match no row: each query is tried once, inside a transaction rolled back.
_TRY_PARAMS = {"job_id": uuid.UUID(int=0), "lease_token": uuid.UUID(int=0), "job_ids": [uuid.UUID(int=0)],
               "lease_tokens": [uuid.UUID(int=0)], "fenced": True, "lease_seconds": 1.0, "delay_seconds": 0.0,
               "error": "tried"}


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, QUERIES))


async def try_queries(pieces: Pieces) -> None:
    """This exercise's queries only, each run once, rolled back: SQL PostgreSQL refuses is said at once.
    `pieces` holds the earlier exercises' too, which take other parameters."""
    with db.scratch_databases("rq_try") as databases:
        await learner_code.try_queries({name: pieces.queue_queries[name] for name in QUERIES}, FILENAME,
                                       databases.queue_url, _TRY_PARAMS)


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """The interleavings a scenario meets only by luck, forced one step at a time on a scratch database:
    one job claimed by a worker whose lease then ran out and reclaimed by another (the database clock
    moved on through the queries' `now`). The stale owner's renew, succeed, retry and dead must each lose
    and change nothing; and in one grouped success holding both claims, only the current one wins."""
    refused, grouped = [], []
    with db.scratch_databases("rq_exercise") as databases:
        async with await db.open_pool_checked(databases.queue_url, max_size=2) as pool:
            queue = Queue(pool, Mechanisms(), replaced_queries=pieces.queue_queries)
            stale, current = await _claimed_twice(queue)
            before = await queue.get(current.id)
            for write, won in [("renew", await queue.renew(stale, 30.0)), ("succeed", await queue.succeed(stale)),
                               ("retry", await queue.retry(stale, 0.0, "stale retry")),
                               ("dead", await queue.dead(stale, "stale dead"))]:
                if won:
                    refused.append({"stale owner's": write, "won": True})
            after = await queue.get(current.id)
            if (after.status, after.lease_token) != (before.status, before.lease_token):
                refused.append({"job": "changed by the stale owner", "status": f"{before.status} -> {after.status}"})
            for order in ("stale first", "current first"):
                stale, current = await _claimed_twice(queue)
                group = [stale, current] if order == "stale first" else [current, stale]
                won = await queue.succeed_many(group)
                said = dict(zip(("stale" if claim is stale else "current" for claim in group), won, strict=True))
                if said != {"stale": False, "current": True}:
                    grouped.append({"group": order, "stale claim won": said["stale"],
                                    "current claim won": said["current"]})
    return [Check("a stale owner's renew, succeed, retry and dead each lose and change nothing", refused),
            Check("in one grouped success holding a stale and the current claim of a job, only the current "
                  "claim wins (each claim is told its own outcome)", grouped)]


async def _claimed_twice(queue: Queue) -> tuple[Job, Job]:
    await queue.submit(Submission({"amount_cents": 1250, "currency": "USD"}, 5))
    (stale,) = await queue.claim(1, "paused-worker", lease_seconds=1.0)
    later = await queue.database_now() + timedelta(seconds=2)
    (current,) = await queue.claim(1, "rescuer", 30.0, now=later)
    return stale, current


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    await try_queries(pieces)
    result = await stages.get("fencing").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    twice = [{"job": row["job"], "finalized": row["F"]} for row in result.rows() if row["F"] != 1]
    won = result.measurements["stale_finalizes_won"]
    stale = [{"stale finalizes that won": won}] if won else []
    return Check("stage 05's paused worker: its stale finalizes are refused and every job is finalized once "
                 "(F=1)", twice + stale,
                 note=f"{result.measurements['stale_finalizes_refused']} stale finalizes refused"), result


EXERCISE = Exercise(name="fencing", stage_number=5, filename=FILENAME,
                    summary="the lease-token condition of renew, succeed, retry and dead (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
