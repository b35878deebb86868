"""Exercise 06, idempotency: write the charge service's insert, and so its answer to a repeat. The starter
is the insert as the stage runs it with idempotency off: the key is never stored and nothing conflicts,
so a retried job is charged again (C=2). The reference is the shipped INSERT ... ON CONFLICT
(idempotency_key) DO NOTHING, a repeat then being answered with the original charge. Both are made from
sql/charge.sql, so the exercise cannot drift from the service it grades; the learner's SQL runs in the
real charge service (charge.service.charge_once, the code its POST /v1/charges runs)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from reliableq import db, sql
from reliableq.charge.client import idempotency_key
from reliableq.charge.service import charge_once, charge_queries
from reliableq.lab.exercises import learner_code
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import LearnerError, load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.lab.waiting import wait_until

FILENAME = "idempotency.sql"
QUERIES = ("charge_insert_once", "charge_get_by_key")
MARK = "-- ✎ idempotency: one charge per key; a repeat of the key creates nothing"

HEADER = """-- Exercise 06, idempotency. Make the charge service create one charge per idempotency key.
--
-- A worker charged a job, then crashed before finalizing it; another worker runs the job again and sends
-- the same charge request, with the same Idempotency-Key (every attempt of a job sends the same key).
-- As it stands, charge_insert_once stores every request as a new charge and never looks at the key,
-- which is what the service does with idempotency off: the customer pays twice (stage 06: C=2).
--
-- How the service uses these two queries, for each POST /v1/charges:
--   1. charge_insert_once: it must create the charge and return its row (RETURNING *) when this key has
--      none yet, and return no row when the key already has its charge. The service answers 201 with a
--      row it returned.
--   2. Only when it returned no row, charge_get_by_key: the charge the key already has. The service
--      answers the repeat with it (200), or refuses it (409) if the repeat's body differs.
-- Two requests with one key may arrive at the same moment: the second must not create a charge, nor
-- fail, while the first is still being committed.
--
-- Parameters: %(idempotency_key)s (NULL when the caller sends no key), %(job_id)s, %(amount_cents)s,
-- %(currency)s, %(payload_sha256)s (a digest of the request's body). The table is in
-- sql/charge_schema.sql: charges.idempotency_key is UNIQUE. Where a line is marked ✎, write your part;
-- keep each `-- name:` line, and the `logged` step (it records the request, so H can be counted).
--
-- Check it with:  reliableq exercise check idempotency

"""


def _shipped(name: str) -> str:
    return sql.queries("charge")[name]


def _file(body: dict[str, str]) -> str:
    return HEADER + "\n\n".join(f"-- name: {name}\n{text}" for name, text in body.items()) + "\n"


def _replaced_once(text: str, old: str, new: str) -> str:
    """`text` with `old` replaced; the shipped SQL must hold `old` exactly once, so a change to it breaks
    this at import rather than quietly making a starter that is not the stage's."""
    if text.count(old) != 1:
        raise ValueError(f"sql/charge.sql changed: expected {old!r} once in charge_insert_once")
    return text.replace(old, new)


def _keyless(text: str) -> str:
    """The shipped insert as it runs with idempotency off: no key stored (NULL), so nothing conflicts."""
    text = _replaced_once(text, "(idempotency_key, job_id,", "(job_id,")
    text = _replaced_once(text, "(%(idempotency_key)s, %(job_id)s,", "(%(job_id)s,")
    return _replaced_once(text, "ON CONFLICT (idempotency_key) DO NOTHING", MARK)


STARTER = _file({"charge_insert_once": _keyless(_shipped("charge_insert_once")),
                 "charge_get_by_key": _shipped("charge_get_by_key")})
REFERENCE = _file({name: _shipped(name) for name in QUERIES})

WHY = ("The key is stored with the charge, and the UNIQUE constraint on it makes PostgreSQL the judge of "
       "\"is this a repeat?\": `INSERT ... ON CONFLICT (idempotency_key) DO NOTHING` creates the row or does "
       "nothing, in one statement. When a second request arrives while the first one's insert is not yet "
       "committed, PostgreSQL makes it wait for that commit and then do nothing, so it can read the original "
       "and answer with it. Looking the key up first and inserting if none is found (check-then-insert) "
       "leaves a gap between the look and the insert: both requests look, both insert, and the UNIQUE "
       "constraint turns the second into an error. DO UPDATE would answer a repeat by overwriting the "
       "original charge with whatever the repeat said; DO NOTHING keeps the original, and the service "
       "answers the repeat with it.")

HINTS = (
    "The starter never stores the key: every request is a new charge. Put %(idempotency_key)s in the "
    "insert's columns and VALUES, then make a second insert of the same key create nothing.",
    "Looking the key up first, then inserting, is not enough: two requests can both look before either "
    "inserts. Let the UNIQUE constraint decide, in the insert itself.",
    "PostgreSQL's INSERT ... ON CONFLICT (the unique column) DO NOTHING inserts the row, or does nothing "
    "and returns no row when the key exists (waiting for a concurrent insert of it to commit first).",
)

# Parameters for trying each query once, in a transaction rolled back: each query gets what the service
# gives it (charge.service.charge_once).
_TRY_PARAMS = {"charge_insert_once": {"idempotency_key": "tried", "job_id": uuid.UUID(int=0), "amount_cents": 1250,
                                      "currency": "USD", "payload_sha256": "tried"},
               "charge_get_by_key": {"idempotency_key": "tried"}}
UNIQUE_VIOLATION = "23505"
LOCK_WAIT_SECONDS = 5.0  # the second request of the forced overlap must block or finish within this


def load(text: str) -> Pieces:
    return Pieces(charge_queries=load_queries(text, FILENAME, QUERIES))


async def try_queries(pieces: Pieces) -> None:
    """Each of the learner's queries run once, then a request, another key's and a repeat of the first
    through the service's own code, all rolled back: SQL PostgreSQL refuses, and a request the service
    fails or refuses with this SQL, are said at once, not met inside the stage's run (whose jobs would
    retry a refused charge for ever)."""
    with db.scratch_databases("rq_try") as databases:
        for name in QUERIES:
            await learner_code.try_queries({name: pieces.charge_queries[name]}, FILENAME, databases.charge_url,
                                           _TRY_PARAMS[name], returning=[name])
        queries = charge_queries(pieces.charge_queries)
        async with await psycopg.AsyncConnection.connect(databases.charge_url) as conn:
            async with conn.transaction(force_rollback=True):
                await conn.execute("SET LOCAL statement_timeout = '5s'")
                for which, job in (("a first request", 1), ("another key's request", 2),
                                   ("a repeat of the first request's key", 1)):
                    answer = await _request(conn, queries, _charge(uuid.UUID(int=job), 1250))
                    if answer.failure or answer.status_code >= 300:
                        raise LearnerError(f"{FILENAME}: {which} was not answered with a charge: {answer.said()}")


@dataclass(frozen=True)
class Answer:
    """What the charge service answered one request: its status code and body, or why it failed."""
    status_code: int
    body: Mapping[str, Any]
    failure: str = ""  # the service could not answer (an HTTP 500): what went wrong
    sqlstate: str | None = None  # PostgreSQL's code for the failure, if it was PostgreSQL's

    def said(self) -> str:
        if self.failure:
            return f"HTTP 500, the service failed: {self.failure}"
        shown = {"charge_id": "charge", "amount_cents": "amount", "error": "error"}
        return ", ".join([f"HTTP {self.status_code}"] + [f"{label} {self.body[key]}" for key, label in shown.items()
                                                         if key in self.body])


async def _request(conn: psycopg.AsyncConnection, queries: Mapping[str, str], charge: dict[str, Any]) -> Answer:
    """One charge request through the service's own code, on `conn`; a failure is said, not raised."""
    try:
        status_code, body = await charge_once(conn, queries, charge, idempotency_key(charge["job_id"]))
    except psycopg.Error as error:
        said = "PostgreSQL said" if error.sqlstate else "psycopg said"
        return Answer(500, {}, f"{said}: {error.diag.message_primary or error}", error.sqlstate)
    except TypeError:  # the service read None: charge_get_by_key found no charge
        return Answer(500, {}, "charge_insert_once returned no row, and charge_get_by_key found no charge for the key")
    except KeyError as error:
        return Answer(500, {}, f"the row returned has no column {error} (return whole rows: RETURNING *)")
    return Answer(status_code, body)


def _charge(job_id: uuid.UUID, amount_cents: int) -> dict[str, Any]:
    """A request's body as the service parsed it (charge.service._parse_charge)."""
    return {"job_id": str(job_id), "amount_cents": amount_cents, "currency": "USD", "description": None}


async def _charges(conn: psycopg.AsyncConnection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every charge of the job, whatever its key (the starter stores none)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT id, amount_cents, idempotency_key FROM charges WHERE job_id = %s ORDER BY created_at",
                      (job_id,))
    return await cur.fetchall()


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """What the stage's scenario meets only by luck, forced on a scratch database through the service's
    own request code: the same key sent twice at once (the first request's transaction held open while
    the second arrives), a repeat whose body differs, and a plain repeat."""
    queries = charge_queries(pieces.charge_queries)
    rng = random.Random(seed)
    jobs = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(4)]
    with db.scratch_databases("rq_exercise") as databases:
        async with await psycopg.AsyncConnection.connect(databases.charge_url, autocommit=True) as conn:
            await conn.execute("SET statement_timeout = '5s'")
            overlap = await _overlapping(databases.charge_url, conn, queries, jobs[0])
            differing = await _differing_repeat(conn, queries, jobs[1])
            repeated = await _plain_repeat(conn, queries, jobs[2], jobs[3])
    return [Check("the same key sent twice at once (the first request not yet committed) makes one charge, and "
                  "both requests are answered with it", overlap),
            Check("a repeat of a key with a different body changes nothing: the original charge stays as it was, "
                  "and the repeat is refused (409) naming it", differing),
            Check("a repeat of a key is answered with the original charge (200: same id, same amount), and makes "
                  "no second charge", repeated)]


async def _overlapping(url: str, observer: psycopg.AsyncConnection, queries: Mapping[str, str],
                       job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The first request's insert made inside a transaction held open; the second request sent on another
    connection and let run until it finishes or waits for a lock; then the first commits."""
    charge = _charge(job_id, 1250)
    async with (await psycopg.AsyncConnection.connect(url, autocommit=True) as first,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as second):
        await second.execute("SET statement_timeout = '5s'")
        async with first.transaction():
            answer_1 = await _request(first, queries, charge)
            if answer_1.failure:  # its transaction is aborted: there is nothing to overlap with
                raise psycopg.Rollback()
            sent = asyncio.create_task(_request(second, queries, charge))

            async def blocked_or_done() -> bool:
                cur = await observer.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0",
                                             (second.info.backend_pid,))
                return sent.done() or (await cur.fetchone())[0]
            try:
                await wait_until(blocked_or_done, LOCK_WAIT_SECONDS,
                                 "the second request to finish or wait for the first")
            except TimeoutError:
                sent.cancel()  # not left running on a connection about to close
                raise
        if answer_1.failure:
            return [{"request": "the first", "answered": answer_1.said()}]
        answer_2 = await sent
    violations = [{"request": which, "answered": answer.said()}
                  for which, answer in (("the first", answer_1), ("the second, sent before the first committed",
                                                                    answer_2))
                  if answer.failure or answer.status_code >= 300]
    if answer_2.sqlstate == UNIQUE_VIOLATION:
        violations.append({"the second request": "found no charge for the key (the first had not committed), "
                                                 "inserted one, and failed on the UNIQUE constraint: only the "
                                                 "constraint stopped a second charge"})
    charges = await _charges(observer, job_id)
    if len(charges) != 1:
        violations.append({"charges made": len(charges), "ids": ", ".join(str(c["id"]) for c in charges)})
    ids = {answer.body.get("charge_id") for answer in (answer_1, answer_2) if not answer.failure}
    if not violations and len(ids) != 1:
        violations.append({"answered with charges": ", ".join(sorted(ids))})
    return violations


async def _differing_repeat(conn: psycopg.AsyncConnection, queries: Mapping[str, str],
                            job_id: uuid.UUID) -> list[dict[str, Any]]:
    original = await _request(conn, queries, _charge(job_id, 1250))
    repeat = await _request(conn, queries, _charge(job_id, 9999))
    violations = []
    if original.failure or original.status_code != 201:
        violations.append({"first request answered": original.said()})
    charges = await _charges(conn, job_id)
    if len(charges) != 1:
        violations.append({"charges made": len(charges), "amounts": ", ".join(str(c["amount_cents"]) for c in charges)})
    elif str(charges[0]["id"]) != original.body.get("charge_id") or charges[0]["amount_cents"] != 1250:
        violations.append({"original charge": f"amount 1250 became {charges[0]['amount_cents']}"})
    if repeat.status_code != 409 or repeat.body.get("charge_id") != original.body.get("charge_id"):
        violations.append({"repeat with amount 9999 answered": repeat.said(),
                           "expected": "409, naming the original charge"})
    return violations


async def _plain_repeat(conn: psycopg.AsyncConnection, queries: Mapping[str, str], job_id: uuid.UUID,
                        other_job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The repeat comes after another key's charge, so "the newest charge" is not the original."""
    original = await _request(conn, queries, _charge(job_id, 1250))
    await _request(conn, queries, _charge(other_job_id, 1250))
    repeat = await _request(conn, queries, _charge(job_id, 1250))
    violations = []
    if original.failure or original.status_code != 201:
        violations.append({"first request answered": original.said()})
    body = repeat.body
    if (repeat.status_code, body.get("charge_id"), body.get("amount_cents")) != (
            200, original.body.get("charge_id"), 1250):
        violations.append({"repeat answered": repeat.said(),
                           "expected": f"200 with charge {original.body.get('charge_id')}, amount 1250"})
    charges = await _charges(conn, job_id)
    if len(charges) != 1:
        violations.append({"charges made": len(charges)})
    return violations


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import stages
    await try_queries(pieces)
    result = await stages.get("idempotency").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    # SUCCEEDED too: a repeat answered with some other charge is refused (409), and its job ends DEAD.
    charged = [{"job": row["job"], "status": row["status"], "ran": row["H"], "charged": row["C"]}
               for row in result.rows() if (row["status"], row["C"]) != ("SUCCEEDED", 1)]
    return Check("stage 06's crashed worker: each job succeeds, charged once (C=1) however often it ran", charged,
                 note=f"{result.measurements['handler_runs']} handler runs"), result


EXERCISE = Exercise(name="idempotency", stage_number=6, filename=FILENAME,
                    summary="the charge service's insert: one charge per idempotency key (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
