"""Exercise 05, fencing: write the token condition of the four ownership-sensitive updates (renew,
succeed, retry, dead). The starter is the shipped SQL with the condition taken out, which is what the
stage runs with fencing off; the reference is the shipped SQL with fencing always on. Both are made
from sql/queue.sql, so the exercise cannot drift from the queue it grades."""

from __future__ import annotations

import asyncio
import re
import uuid
from contextlib import AsyncExitStack
from dataclasses import replace

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code, schedules
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.queue import Job, Queue
from reliableq.scratch import scratch_databases

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
       "The status is a second guard: a finished job keeps its last token, so only the same claim writing again "
       "after its own finalize won could meet it, which the worker never does (it asks whether a finalize was "
       "recorded before it tries a lost answer again); the token alone passes too. In job_succeed, the win is per "
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
    with scratch_databases("rq_try") as databases:
        await learner_code.try_queries({name: pieces.queue_queries[name] for name in QUERIES}, FILENAME,
                                       databases.queue_url, _TRY_PARAMS)


WORKER = "worker-1"  # the one worker of every schedule: it reclaims its own jobs, so only the token tells
# its claims apart (a write that names the owner by worker_id would pass if another worker reclaimed)
WRITES = ("renew", "succeed", "retry", "dead")
RETRY_DELAY = 3600.0  # a retried job is not due again within any schedule
# The stale claim's token, below and above any random one: a token compared by `<=` or `>=` is seen.
STALE_TOKENS = (uuid.UUID(int=2), uuid.UUID(int=2**128 - 2))
# What the record of a claim says after its write: won, and lost (renew keeps what the reclaim wrote).
RECORD_WON = {"renew": None, "succeed": "succeeded", "retry": "retried", "dead": "dead"}
RECORD_LOST = {"renew": "expired", "succeed": "lost_succeed", "retry": "lost_retry", "dead": "lost_dead"}


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Forced on a scratch database, one job per write so that each verdict stands alone; every reclaim
    is the same worker's, by the shipped claim, after the check wrote the lease's expiry an hour into the
    past: (1) the old claim's renew, succeed, retry and dead, each after the reclaim committed, must lose
    and change nothing, and the current claim's must win; (2) in one grouped success holding the old and
    the current claim, only the current wins, in either order, the old token below and above the current
    one (a token compared by `<=` in telling who won is seen); (3) each old write issued while the
    reclaim's transaction is still open, seen waiting for its row lock (or already refused) before the
    reclaim commits, so PostgreSQL re-checks the row the reclaim wrote; (4) the owner's succeed,
    retry and dead in progress while a reclaim comes: the reclaim passes over the job, and the write's
    answer is what it did to the job; (5) two success groups sharing jobs, and a third beside them, in flight
    at once (_groups_sharing_jobs)."""
    learner = {name: pieces.queue_queries[name] for name in QUERIES}
    async with schedules.scratch() as scratch:
        # SQL PostgreSQL refuses is said at the learner's line before any schedule runs it.
        await learner_code.try_queries(learner, FILENAME, scratch.url, _TRY_PARAMS)
        queue = Queue(scratch.pool, Mechanisms(), replaced_queries=learner)
        after_reclaim, current_lost, blocked, racing, elsewhere, records = [], [], [], [], [], []
        for write in WRITES:
            for stale_token in STALE_TOKENS:
                stale, current = await _reclaimed(scratch, stale_token=stale_token)
                bystanders = await scratch.run("lab_bystanders_seen")
                after_reclaim += await _stale_write(scratch, queue, write, stale)
                records += await _records_wrong(scratch, write, stale, current, won=False)
                if not await _write(queue, write, current):
                    current_lost.append({"job": scratch.label(current.id),
                                         f"your {write} for the current claim": "lost"})
                else:
                    records += await _records_wrong(scratch, write, stale, current, won=True)
                if await scratch.run("lab_bystanders_seen") != bystanders:
                    elsewhere.append({"your": f"{write} of the old and of the current claim of "
                                              f"{scratch.label(current.id)}",
                                      "changed": "another worker's job or its claim on record"})
        behind_renew = await _succeed_behind_renew(scratch, learner)
        run_out = await _renew_after_run_out(scratch, queue)
        grouped = [row for order in ("old claim first", "current claim first") for stale_token in STALE_TOKENS
                   for row in await _grouped(scratch, queue, order, stale_token)]
        for write in WRITES:
            blocked += await _behind_reclaim_in_progress(scratch, learner, write)
        for write in WRITES[1:]:
            racing += await _racing_a_reclaim(scratch, learner, write)
        crossed, held_beyond = await _groups_sharing_jobs(scratch, learner)
    return [Check("after the same worker reclaimed a job, its old claim's renew, succeed, retry and dead each lose "
                  "and change nothing", after_reclaim),
            Check("the current claim's renew, succeed, retry and dead win", current_lost),
            Check("an owner's write changes only its own job: not another worker's job, nor its claim on record",
                  elsewhere),
            Check("each claim's record says what its write did: the old claim's lost_succeed, lost_retry, lost_dead "
                  "(renew: still expired), the current claim's succeeded, retried, dead, with the error given; "
                  "the other claim's record untouched", records),
            Check("the current claim's succeed, issued while its own renew holds the job's row (its transaction "
                  "open), waits for it and then wins: it never skips its own job", behind_renew),
            Check("an owner's renew after its lease ran out, nobody having reclaimed the job yet, loses and "
                  "changes nothing: a lease that ran out is never revived", run_out),
            Check("in one grouped success holding a job's old and current claim, only the current one wins (each "
                  "claim is told its own outcome)", grouped),
            Check("an old claim's write that waited for a reclaim still in progress loses once the reclaim commits "
                  "(PostgreSQL re-checks the row it waited for)", blocked),
            Check("a finalize in progress while a reclaim comes: the reclaim passes over the job, and the "
                  "finalize's answer is what it did", racing),
            Check("two success groups sharing jobs, in flight at once, wait for each other rather than deadlock "
                  "(a lock before the update that both may hold lets each wait for the other), and each claim "
                  "is told its own outcome", crossed),
            Check("a success group in flight holds only the jobs it names: another job's success does not wait "
                  "for it", held_beyond)]


async def _reclaimed(scratch: schedules.Scratch, reclaim: Queue | None = None,
                     stale_token: uuid.UUID | None = None) -> tuple[Job, Job]:
    """A new job, the only one due (two bystanders beside it: another worker's, under live leases),
    claimed by WORKER (its token made `stale_token` if given), its lease run out (written), and reclaimed
    by WORKER (on `reclaim`'s connection, whose transaction may be held open): the old claim and the
    current one."""
    await scratch.run("lab_jobs_clear")
    await scratch.run("lab_bystanders")
    await scratch.submit(1)
    (stale,) = await scratch.shipped.claim(1, WORKER, 30.0)
    if stale_token is not None:
        await scratch.run("lab_claim_retoken", {"old": stale.lease_token, "new": stale_token})
        stale = replace(stale, lease_token=stale_token)
    await scratch.run_out(stale)
    (current,) = await (reclaim or scratch.shipped).claim(1, WORKER, 30.0)
    if current.id != stale.id:
        raise RuntimeError(f"the schedule's reclaim took {current.id}, not {stale.id}")
    return stale, current


async def _write(queue: Queue, write: str, claim: Job) -> bool:
    if write == "renew":
        return await queue.renew(claim, 30.0)
    if write == "succeed":
        return await queue.succeed(claim)
    if write == "retry":
        return await queue.retry(claim, RETRY_DELAY, _error(write, claim))
    return await queue.dead(claim, _error(write, claim))


def _error(write: str, claim: Job) -> str:
    return f"{write} of attempt {claim.attempts}"


async def _records_wrong(scratch: schedules.Scratch, write: str, stale: Job, current: Job, won: bool) -> list[dict]:
    """After the old claim's `write` lost (`won` False) or the current claim's won: each claim's record."""
    records = {r["lease_token"]: r for r in await scratch.shipped.attempts_of(current.id)}
    old, new = records.get(stale.lease_token, {}), records.get(current.lease_token, {})
    right_old = RECORD_LOST[write]
    right_new = RECORD_WON[write] if won else None
    wrong = []
    if old.get("outcome") != right_old:
        wrong.append(f"the old claim's record {old.get('outcome') or 'open'} (right: {right_old})")
    if new.get("outcome") != right_new:
        wrong.append(f"the current claim's record {new.get('outcome') or 'open'} (right: {right_new or 'open'})")
    if won and write == "renew":
        job = await scratch.shipped.get(current.id)
        if new.get("lease_expires_at") != job.lease_expires_at:
            wrong.append("the current claim's record kept its old expiry (right: the renewed one, as the job's)")
    if won and write in ("retry", "dead"):
        job = await scratch.shipped.get(current.id)
        if new.get("error") != _error(write, current) or job.last_error != _error(write, current):
            wrong.append(f"error on record {new.get('error')!r}, the job's last_error {job.last_error!r} "
                         f"(right: {_error(write, current)!r})")
    if not wrong:
        return []
    return [{"job": scratch.label(current.id), "after": f"your {write} for the {'current' if won else 'old'} claim",
             "wrong": "; ".join(wrong)}]


async def _succeed_behind_renew(scratch: schedules.Scratch, learner: dict[str, str]) -> list[dict]:
    """The current claim's renew runs and holds its transaction open (as a renewal does while it waits at
    a fleet gate: the job's row stays locked); the same claim's succeed is issued, seen waiting (or done),
    then the renew commits. A group that locks its rows with SKIP LOCKED passes over its own job here and
    says it lost."""
    _, current = await _reclaimed(scratch)
    async with (await scratch.connect() as holding, await scratch.connect() as writing):
        async with holding.transaction():
            await _write(Queue(schedules.OneConnection(holding), Mechanisms(), replaced_queries=learner),
                         "renew", current)
            task = asyncio.create_task(_write(Queue(schedules.OneConnection(writing), Mechanisms(),
                                                    replaced_queries=learner), "succeed", current))
            await schedules.waiting_or_done(scratch, {"succeed": (task, writing.info.backend_pid)})
        won, failed = await schedules.outcome(task)
    after = await scratch.shipped.get(current.id)
    if won and after.status == "SUCCEEDED":
        return []
    return [{"job": scratch.label(current.id), "your succeed for the current claim":
             f"failed: {failed}" if failed else ("won" if won else "lost"), "the job": after.status}]


async def _renew_after_run_out(scratch: schedules.Scratch, queue: Queue) -> list[dict]:
    """WORKER's claim, its lease run out (written), nobody has reclaimed it: its renew must lose (a lease
    that ran out is never revived: a fleet claim may already count its slot free) and change nothing."""
    await scratch.run("lab_jobs_clear")
    await scratch.submit(1)
    (claim,) = await scratch.shipped.claim(1, WORKER, 30.0)
    await scratch.run_out(claim)
    before = await scratch.shipped.get(claim.id)
    won = await _write(queue, "renew", claim)
    after = await scratch.shipped.get(claim.id)
    record = (await scratch.shipped.attempts_of(claim.id))[0]["outcome"]
    if not won and _state(before) == _state(after) and record == "lost_renew":
        return []
    return [{"job": scratch.label(claim.id), "lease": "ran out an hour ago, not reclaimed",
             "your renew": ("won" if won else "lost") + (", and moved the lease" if _state(before) != _state(after)
                                                         else ""),
             "its record": f"{record or 'open'} (right: lost_renew)"}]


def _state(job: Job) -> tuple:
    return job.status, job.lease_token, job.lease_expires_at, job.run_at, job.last_error


async def _stale_write(scratch: schedules.Scratch, queue: Queue, write: str, stale: Job) -> list[dict]:
    """The old claim's `write`, run now, judged: it must lose and change nothing."""
    before = await scratch.shipped.get(stale.id)
    won = await _write(queue, write, stale)
    return _judged(scratch, write, stale, won, before, await scratch.shipped.get(stale.id))


def _judged(scratch: schedules.Scratch, write: str, stale: Job, won: bool | None, before: Job, after: Job,
            failed: str | None = None) -> list[dict]:
    """A row saying what the old claim's `write` did, if it did anything but lose: `before`, the job as the
    reclaim left it; `after`, as the write left it."""
    row = {"job": scratch.label(stale.id), "reclaimed by": f"the same worker ({WORKER})"}
    if failed:
        return [row | {f"your {write} for the old claim": f"failed: {failed}"}]
    if won or _state(before) != _state(after):
        said = "won" if won else "said it lost"
        changed = f", and the job went {before.status} -> {after.status}" if before.status != after.status else (
            ", and changed the job" if _state(before) != _state(after) else "")
        return [row | {f"your {write} for the old claim": f"{said}{changed}"}]
    return []


async def _grouped(scratch: schedules.Scratch, queue: Queue, order: str, stale_token: uuid.UUID) -> list[dict]:
    stale, current = await _reclaimed(scratch, stale_token=stale_token)
    group = [stale, current] if order == "old claim first" else [current, stale]
    won = await queue.succeed_many(group)
    said = dict(zip(("old" if claim is stale else "current" for claim in group), won, strict=True))
    if said == {"old": False, "current": True}:
        return []
    return [{"job": scratch.label(stale.id), "group": order,
             "old claim's token": "below the current one" if stale_token < current.lease_token else "above it",
             "old claim won": said["old"], "current claim won": said["current"]}]


async def _behind_reclaim_in_progress(scratch: schedules.Scratch, learner: dict[str, str], write: str) -> list[dict]:
    """The same worker's reclaim holds its transaction open (the job's row locked, the new token not yet
    committed) while the old claim's `write` is issued; once that write waits for the row (or was refused
    at once), the reclaim commits."""
    async with (await scratch.connect(autocommit=False) as reclaiming, await scratch.connect() as writing):
        stale, _ = await _reclaimed(scratch, Queue(schedules.OneConnection(reclaiming), Mechanisms()))
        before = await scratch.shipped.get(stale.id)  # the last committed state: the reclaim is not yet
        task = asyncio.create_task(_write(Queue(schedules.OneConnection(writing), Mechanisms(),
                                                replaced_queries=learner), write, stale))
        await schedules.waiting_or_done(scratch, {write: (task, writing.info.backend_pid)})
        await reclaiming.commit()
        won, failed = await schedules.outcome(task)
    reclaimed = await scratch.shipped.get(stale.id)
    return _judged(scratch, write, stale, won, replace(before, **{f: getattr(reclaimed, f) for f in _RECLAIM_FIELDS}),
                   reclaimed, failed)


# What the reclaim itself wrote: compared against, not blamed on the old claim's write.
_RECLAIM_FIELDS = ("lease_token", "lease_expires_at", "attempts", "updated_at", "worker_id")


async def _racing_a_reclaim(scratch: schedules.Scratch, learner: dict[str, str], write: str) -> list[dict]:
    """WORKER's claim, its lease run out, the only job; its `write` runs and holds its transaction open; the
    same worker's reclaim comes meanwhile and is seen to return or wait; then the write commits. Whatever
    the write's answer, it must be what it did: won, the job finalized and not reclaimed; lost, the job as
    it was, or as the reclaim left it."""
    await scratch.run("lab_jobs_clear")
    await scratch.submit(1)
    (owner,) = await scratch.shipped.claim(1, WORKER, 30.0)
    await scratch.run_out(owner)
    before = await scratch.shipped.get(owner.id)
    async with (await scratch.connect() as writing, await scratch.connect() as reclaiming):
        async with writing.transaction():
            won = await _write(Queue(schedules.OneConnection(writing), Mechanisms(), replaced_queries=learner),
                               write, owner)
            reclaimer = Queue(schedules.OneConnection(reclaiming), Mechanisms())
            reclaim = asyncio.create_task(reclaimer.claim(1, WORKER, 30.0))
            await schedules.waiting_or_done(scratch, {"reclaim": (reclaim, reclaiming.info.backend_pid)})
        reclaimed, _ = await schedules.outcome(reclaim)
    after = await scratch.shipped.get(owner.id)
    if won:
        right = after.status == {"succeed": "SUCCEEDED", "retry": "PENDING", "dead": "DEAD"}[write] and not reclaimed
    elif reclaimed:  # the write left the job unlocked, and the reclaim took it: only the reclaim's changes
        right = after.status == "RUNNING" and after.lease_token == reclaimed[0].lease_token
    else:
        right = _state(after) == _state(before)
    if right:
        return []
    return [{"job": scratch.label(owner.id), f"your {write}": "won" if won else "lost", "the job": after.status,
             "the reclaim": "took it" if reclaimed else "passed over it"}]


IN_FLIGHT_JOBS = 2000  # another worker's jobs beside the schedule's (see lab_jobs_in_flight)
# Above every random (version 4) uuid. A lock taken row by row in id order, as the statement's scan asks
# for rows (see _groups_sharing_jobs), has taken every other row of the group by the time it reaches it.
LAST_ID = uuid.UUID("ffffffff-ffff-ffff-ffff-fffffffffffe")


async def _groups_sharing_jobs(scratch: schedules.Scratch, learner: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """Jobs A and B each reclaimed by WORKER (an old and a current claim each), jobs E and C claimed once,
    beside many jobs in flight. Group 1 holds E's, A's current and B's old claim, in that order; group 2
    B's current and A's old claim; group 3 C's claim. Each is issued in turn and seen waiting (at a
    barrier in front of every update, or behind another group) before the next; then all go on.

    Held at the barrier, group 1 has updated nothing but E, and holds whatever its lock before the update
    took on A and B. A lock two groups can share lets group 2 take A and B too, and then wait to update B
    for group 1, which waits to update A for group 2: a deadlock. The ids are in the order E > B > A:
    PostgreSQL locks a `locked` step's rows as the update asks for them, in id order, so group 1 has locked
    A and B by the time it reaches E, and group 2 A by the time it reaches B. A lock that excludes (FOR
    UPDATE) makes group 2 wait before it holds anything. Group 3 names none of their jobs: it must not wait for them."""
    await scratch.run("lab_jobs_clear")
    await scratch.run("lab_jobs_in_flight", {"n": IN_FLIGHT_JOBS})
    await scratch.run("lab_jobs_analyze")
    a, b = sorted(uuid.uuid4() for _ in range(2))
    e = LAST_ID
    await scratch.run("lab_jobs_due_with_ids", {"ids": [e, a, b]})
    scratch.labels |= {str(job_id): f"job-{len(scratch.labels) + 1 + i}" for i, job_id in enumerate((e, a, b))}
    (c,) = await scratch.submit(1)
    first = {claim.id: claim for claim in await scratch.shipped.claim(4, WORKER, 30.0)}
    for job_id in (a, b):
        await scratch.run_out(first[job_id])
    current = {claim.id: claim for claim in await scratch.shipped.claim(2, WORKER, 30.0)}
    groups = {"group 1": [first[e], current[a], first[b]], "group 2": [current[b], first[a]], "group 3": [first[c]]}
    right = {"group 1": [True, True, False], "group 2": [True, False], "group 3": [True]}

    def named(claim: Job) -> str:
        which = "current" if claim in current.values() else "old" if claim.id in current else "only"
        return f"{scratch.label(claim.id)}'s {which} claim"
    said = {name: ", ".join(map(named, group)) for name, group in groups.items()}
    async with AsyncExitStack() as stack:
        conns = {name: await stack.enter_async_context(await scratch.connect()) for name in groups}
        statements: dict[str, tuple[asyncio.Task, int]] = {}
        async with schedules.barrier(scratch):
            for name, group in groups.items():
                queue = Queue(schedules.OneConnection(conns[name]), Mechanisms(), replaced_queries=learner)
                statements[name] = (asyncio.create_task(queue.succeed_many(group)), conns[name].info.backend_pid)
                waits = await schedules.waiting_or_done(scratch, statements)
        outcomes = {name: await schedules.outcome(task) for name, (task, _) in statements.items()}

    def told(won: list[bool]) -> str:
        return ", ".join("won" if w else "lost" for w in won)
    crossed = [{"group": f"{name}: {said[name]}", "your succeed": f"failed: {failed}" if failed else told(won),
                "right": told(right[name])}
               for name, (won, failed) in outcomes.items() if failed or won != right[name]]
    held_beyond = [{"group 3": said["group 3"],
                    "waited for": " and ".join(f"{other} ({said[other]})" for other in others)}
                   for name, others in waits.items() if name == "group 3"]
    return crossed, held_beyond


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    await try_queries(pieces)
    result = await reliableq_stages.get("fencing").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
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
