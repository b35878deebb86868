"""Exercise 10, sync-standby: write what each of the API's database sessions runs first, so that a commit
returns (and the API answers 202) only once the standby has the job. The starter is the statement the
API's sessions run with sync_standby off (`SET synchronous_commit = local`); the reference the one they
run with it on. Both are made from sql/queue.sql; the learner's statement runs in the real API (its pool
runs it on every new session) against a real synchronous pair (reliableq/standby.py).

The forced schedules run on a pair whose server is configured `synchronous_commit = local`, as servers
tuned for speed are, so that only what the learner's sessions set counts (a RESET, or a SET LOCAL that
lasts no longer than its own statement, leaves the server's). The link to the standby is cut (SIGSTOP),
so no commit can reach the standby until the check says: whether a commit waited is read from the server,
not from a timing. Then the waiting commit is cancelled, as an operator or a timeout would, and the
client's keyed retry must not be answered "replayed" for a job only the primary has; then the primary is
killed and the standby promoted, and every job acknowledged is looked for on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import psycopg

from reliableq import db, sql
from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import LOST, ScenarioParams, ScenarioResult
from reliableq.lab.waiting import wait_until
from reliableq.servers import LoopbackServer
from reliableq.standby import StandbyPair, start_pair

FILENAME = "sync_standby.sql"
QUERY = "api_session"

HEADER = """-- Exercise 10, sync-standby. Make every 202 survive the death of the primary.
--
-- The queue's database is a primary with a synchronous standby: the primary names the standby in its
-- synchronous_standby_names, so a commit *can* wait until the standby has its WAL. Whether a commit waits
-- is its session's synchronous_commit. As it stands, each of the API's database sessions runs the
-- statement below first, as stage 10 does with its mechanism off: a commit returns once the primary alone
-- has it, and the API answers 202. When the primary dies before the standby received the job (stage 10
-- stalls the link between them, then kills the primary and promotes the standby), the promoted server has
-- never heard of it: an acknowledged job is LOST.
--
-- Write what each API session runs first, so that a commit returns only once the standby has the job.
-- PostgreSQL's levels: https://www.postgresql.org/docs/current/runtime-config-wal.html#GUC-SYNCHRONOUS-COMMIT
-- The check's primary is configured with synchronous_commit = local, as servers tuned for speed are: what
-- your sessions set is what counts. The sessions are in autocommit mode (each statement its own
-- transaction). Keep the `-- name:` line.
--
-- Check it with:  reliableq exercise check sync-standby
"""
NAMED = f"-- name: {QUERY}\n-- Run by each new database session of the API, before anything else.\n"


def _file(body: str) -> str:
    return f"{HEADER}\n{NAMED}{body}\n"


STARTER = _file(sql.queries("queue")["session_commits_local"])
REFERENCE = _file(sql.queries("queue")["session_commits_wait_for_standby"])

WHY = ("`synchronous_commit = on` makes each commit wait until the synchronous standby has flushed the "
       "transaction's WAL to its disk, so the 202 the API sends after the commit names a job two machines "
       "have: the primary's death cannot take it. `remote_apply` waits longer (until the standby has also "
       "replayed it, so a read there sees it) and is as safe; `remote_write` waits only until the standby's "
       "operating system has the WAL: it survives the primary's death, which is what this lab can stage, "
       "but not both machines losing power at once. `local` and `off` never wait for the standby. Setting it "
       "per session, rather than trusting the server's configuration, keeps the guarantee the API's own: "
       "`SET LOCAL` lasts one transaction (in autocommit, nothing), and `RESET` goes back to the server's. "
       "The same setting closes the cancelled-wait hole: a commit whose wait is cancelled becomes visible on "
       "the primary alone, but the retry that finds it locks its key's row, a write, so the retry's own "
       "commit waits for the standby before the API may answer \"replayed\".")

HINTS = (
    "The starter says `local`: a commit returns once the primary has it. Which other values does "
    "synchronous_commit take, and which of them wait for the standby?",
    "A commit must not return before the standby has flushed (or at least received) its WAL. Look at "
    "`on`, `remote_write` and `remote_apply` in PostgreSQL's documentation.",
    "Set it for the whole session (plain SET, not SET LOCAL, which ends with its transaction) to a level "
    "that waits for the standby: `SET synchronous_commit = on;`.",
)

# The check's own database on the pair, and how long the API waits for the database before answering
# 503: the API's default, so a learner's statement_timeout shorter than the real API's patience (one that
# cancels the wait and lets the commit return) is met as the real API would meet it.
DATABASE = "rq_exercise_standby"
API_DB_TIMEOUT_SECONDS = db.DEFAULT_DB_TIMEOUT_SECONDS
CHARGE = {"amount_cents": 1250, "currency": "USD"}
# How long the check waits for what the server must show next (a commit waiting, a row visible): it
# happens in milliseconds; the bound only keeps a broken run from hanging.
SETTLE_SECONDS = 15.0


def load(text: str) -> Pieces:
    return Pieces(standby_session=load_queries(text, FILENAME, (QUERY,))[QUERY])


@asynccontextmanager
async def _api(url: str, pieces: Pieces) -> AsyncIterator[httpx.AsyncClient]:
    """The real API over `url`, its sessions running the learner's statement first."""
    server = LoopbackServer(create_api_app(url, Mechanisms(), kinds=STANDARD_KINDS, order=pieces.submission_order,
                                           standby_session=pieces.standby_session,
                                           db_timeout=API_DB_TIMEOUT_SECONDS))
    base = await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=API_DB_TIMEOUT_SECONDS * 4) as client:
            yield client
    finally:
        await asyncio.to_thread(server.stop)


def _prepare(pair: StandbyPair) -> str:
    """The check's database on the pair, its schema applied, the primary told to commit locally unless a
    session says otherwise; its URL (both hosts)."""
    url = pair.url(DATABASE)
    db.ensure_database(url)
    db.apply_schema(url, "queue")
    with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = local")
        conn.execute("SELECT pg_reload_conf()")
    pair.wait_caught_up()
    return url


def _on_primary(pair: StandbyPair, key: str) -> bool:
    """Whether the job submitted with `key` is visible on the primary (its commit returned)."""
    with psycopg.connect(pair.primary.url(DATABASE), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM job_submission_keys WHERE key = %s", [key]).fetchone() is not None


async def _commit_waited(pair: StandbyPair, key: str) -> bool:
    """Whether the commit of `key`'s submission is waiting for the standby (True) or returned without it
    (False): whichever the server shows first. One of the two happens at once; the deadline is for a run
    gone wrong."""
    def shown() -> str | None:
        if pair.commits_waiting():
            return "waiting"
        return "returned" if _on_primary(pair, key) else None
    said = await wait_until(lambda: asyncio.to_thread(shown), SETTLE_SECONDS,
                            f"the commit of {key} to wait for the standby or to return")
    return said == "waiting"


def _answer(response: httpx.Response) -> str:
    body = response.json()
    if response.status_code == 202:
        return "202 replayed" if body.get("replayed") else "202"
    return f"{response.status_code}: {body.get('error', body)}"


LIVE = "with the standby connected, a submission is acknowledged (202)"
CUT = ("while the link to the standby is cut, a submission is not acknowledged: its commit waits for the "
       "standby instead of returning with the primary alone")
RETRY = ("a keyed retry is not answered \"replayed\" for a job only the primary has (its first commit's wait was "
         "cancelled): the retry's own commit waits for the standby too")
KEPT = "after the primary's death and the standby's promotion, every acknowledged job is on the promoted server"


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """The forced schedules on a synchronous pair of their own (started here, stopped after): a submission
    with the standby connected; the link cut, a submission; its waiting commit cancelled, the client's
    keyed retry; the primary killed and the standby promoted. The same on every run: the cut is made before
    the submission, so a commit that waits cannot return until the check lets it."""
    pair = await start_pair(synchronous=True)
    try:
        url = await asyncio.to_thread(_prepare, pair)
        # The learner's SQL once on its own first: PostgreSQL's refusal at the learner's line, not inside a pool.
        await learner_code.try_queries({QUERY: pieces.standby_session}, FILENAME, url, None)
        return await _schedules(pair, url, pieces)
    finally:
        await asyncio.to_thread(pair.stop)


async def _schedules(pair: StandbyPair, url: str, pieces: Pieces) -> list[Check]:
    cut, retry, kept = [], [], []
    acknowledged: dict[str, str] = {}  # job id -> the submission's key

    async def submit(api: httpx.AsyncClient, key: str) -> httpx.Response:
        response = await api.post("/v1/jobs", headers={"Idempotency-Key": key}, json=CHARGE)
        if response.status_code == 202:
            acknowledged[response.json()["id"]] = key
        return response

    async with _api(url, pieces) as api:
        first = await submit(api, "order-1")
        if first.status_code != 202:  # nothing after this could say anything: the API does not work at all
            return [Check(LIVE, [{"submission": "order-1", "answered": _answer(first)}])]
        await asyncio.to_thread(pair.wait_caught_up)

        pair.link.cut()
        second = await submit(api, "order-2")
        waited = await _commit_waited(pair, "order-2")
        if second.status_code == 202 or not waited:
            cut.append({"submission": "order-2", "answered": _answer(second),
                        "its commit": "waited for the standby" if waited else
                        "returned with the primary alone (the standby could not have it: the link was cut)"})
        if waited:  # cancelled, as an operator or a timeout may: the job is now visible on the primary alone
            await asyncio.to_thread(pair.cancel_waiting_commits)
            await wait_until(lambda: asyncio.to_thread(_on_primary, pair, "order-2"), SETTLE_SECONDS,
                             "the cancelled commit of order-2 to show on the primary", 0.02)
        again = await submit(api, "order-2")
        if again.status_code == 202:
            retry.append({"retry of": "order-2", "answered": _answer(again),
                          "but": "only the primary had the job (the link to the standby was cut)"})
    await asyncio.to_thread(pair.fail_over)
    with psycopg.connect(url, autocommit=True) as conn:
        promoted = {str(row[0]) for row in conn.execute("SELECT id FROM jobs")}
    kept += [{"submitted as": key, "acknowledged": "202", "on the promoted server": f"no: {LOST}"}
             for job_id, key in acknowledged.items() if job_id not in promoted]
    return [Check(LIVE, []), Check(CUT, cut), Check(RETRY, retry), Check(KEPT, kept)]


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    stage = reliableq_stages.get("sync-standby")
    result = await stage.scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    lost = [{"job": row["job"], "status": row["status"]} for row in result.rows() if row["status"] == LOST]
    return Check("stage 10's failover after the link was cut: every acknowledged job is on the promoted server "
                 "(lost_jobs = 0)", lost,
                 note=f"{result.measurements['acknowledged_during_the_cut']} acknowledged during the cut"), result


EXERCISE = Exercise(name="sync-standby", stage_number=10, filename=FILENAME,
                    summary="what each API session runs first: the synchronous_commit that makes a 202 survive "
                            "the primary's death",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
