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
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from reliableq import sql
from reliableq.charge.service import charge_once, charge_queries
from reliableq.lab.exercises import learner_code
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.lab.waiting import wait_until
from reliableq.payload import json_sha256
from reliableq.queue import idempotency_key
from reliableq.scratch import scratch_databases

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
-- sql/migrations/charge/0001_schema.sql: charges.idempotency_key is UNIQUE. Where a line is marked ✎, write your part;
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
LOCK_WAIT_SECONDS = 5.0  # each request sent while the first is held open must block or finish within this
AT_ONCE = (2, 4)  # how many requests with one key are in flight together, in turn
OLD = "400 days"  # how old the original charge of a repeat far apart in time is: beyond any plausible window
CHARGES_BETWEEN = 5  # other keys' charges made between that original and its repeat


def load(text: str) -> Pieces:
    return Pieces(charge_queries=load_queries(text, FILENAME, QUERIES))


async def try_queries(pieces: Pieces, charge_url: str) -> None:
    """Each of the learner's queries run once on the (scratch) charge database at `charge_url`, rolled
    back: SQL PostgreSQL refuses, or an insert that returns no rows at all, is said at the learner's line
    before any request is sent."""
    for name in QUERIES:
        await learner_code.try_queries({name: pieces.charge_queries[name]}, FILENAME, charge_url, _TRY_PARAMS[name],
                                       returning=[name])


@dataclass(frozen=True)
class Answer:
    """What the charge service answered one request: its status code and body, or why it failed."""
    status_code: int
    body: Mapping[str, Any]
    failure: str = ""  # the service could not answer (an HTTP 500): what went wrong
    sqlstate: str | None = None  # PostgreSQL's code for the failure, if it was PostgreSQL's
    found_none: bool = False  # the failure: charge_get_by_key found no charge for the key

    def said(self) -> str:
        if self.failure:
            return f"HTTP 500, the service failed: {self.failure}"
        shown = {"charge_id": "charge", "amount_cents": "amount", "error": "error"}
        return ", ".join([f"HTTP {self.status_code}"] + [f"{label} {self.body[key]}" for key, label in shown.items()
                                                         if key in self.body])


async def _request(conn: psycopg.AsyncConnection, queries: Mapping[str, str], charge: dict[str, Any],
                   key: str | None) -> Answer:
    """One charge request with Idempotency-Key `key` through the service's own code, on `conn`; a failure
    is said, not raised."""
    try:
        status_code, body = await charge_once(conn, queries, charge, key)
    except psycopg.Error as error:
        said = "PostgreSQL said" if error.sqlstate else "psycopg said"
        return Answer(500, {}, f"{said}: {error.diag.message_primary or error}", error.sqlstate)
    except TypeError:  # the service read None: charge_get_by_key found no charge
        return Answer(500, {}, "charge_insert_once returned no row, and charge_get_by_key found no charge for the key",
                      found_none=True)
    except KeyError as error:
        return Answer(500, {}, f"the row returned has no column {error} (return whole rows: RETURNING *)")
    return Answer(status_code, body)


class Requests:
    """The requests of the forced schedules, each a new job (and so a new key) drawn from the seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def charge(self, description: str | None = None) -> dict[str, Any]:
        """A request's body as the service parsed it (charge.service._parse_charge)."""
        return {"job_id": str(uuid.UUID(int=self.rng.getrandbits(128))), "amount_cents": self.rng.randint(100, 99_999),
                "currency": "USD", "description": description}


async def _charges_of(conn: psycopg.AsyncConnection, key: str, *job_ids: str) -> list[dict[str, Any]]:
    """Every charge of the key or of the jobs, whichever key it was stored with (the starter stores none)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT * FROM charges WHERE idempotency_key = %s OR job_id = ANY(%s::uuid[]) "
                      "ORDER BY created_at", (key, list(job_ids)))
    return await cur.fetchall()


async def _by_id(conn: psycopg.AsyncConnection, charge_id: Any) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT * FROM charges WHERE id = %s", (charge_id,))
    return await cur.fetchone()


NEW = ("a request with a new key creates its charge (201), stored with that key and the request's every field; "
       "another key is another charge, even for the same job; a request without a key always creates one")
REPEATED = ("a repeat of a key, right after or long after (its charge 400 days old, other keys' charges made "
            "since), is answered with the key's own charge (200, same id) and creates nothing")
DIFFERING = ("a repeat of a key whose body differs in any field (amount, currency, description, job) changes "
             "nothing: the original charge stays as it was, and the repeat is refused (409) naming it")
AT_ONCE_NAME = ("requests with one key in flight at once (the first not yet committed when 1, then 3, more "
                "arrive) make one charge, and every one of them is answered with it")


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """The forced schedules, on a scratch database through the service's own request code: new keys (and
    none), repeats right after and 400 days later, repeats differing in each field of the body, and the
    same key sent by 2 and then 4 requests at once (the first request's transaction held open while the
    others arrive). Each check's violations say what the learner's queries did in it."""
    with scratch_databases("rq_exercise") as databases:
        return await forced_schedules(pieces, seed, databases.charge_url)


async def forced_schedules(pieces: Pieces, seed: int, charge_url: str) -> list[Check]:
    """`direct`'s checks on the charge database at `charge_url`, whose charges they leave behind: every
    key they send is drawn from `seed`, so a database is used once per seed (tests share one, emptied)."""
    queries = charge_queries(pieces.charge_queries)
    requests = Requests(seed)
    await try_queries(pieces, charge_url)
    async with await psycopg.AsyncConnection.connect(charge_url, autocommit=True) as conn:
        await conn.execute("SET statement_timeout = '5s'")
        new = await _new_keys(conn, queries, requests)
        repeated = await _repeats(conn, queries, requests)
        differing = await _differing_repeats(conn, queries, requests)
        at_once = [row for n in AT_ONCE for row in await _at_once(charge_url, conn, queries, requests.charge(), n)]
    return [Check(NEW, new), Check(REPEATED, repeated), Check(DIFFERING, differing), Check(AT_ONCE_NAME, at_once)]


async def _new_keys(conn: psycopg.AsyncConnection, queries: Mapping[str, str],
                    requests: Requests) -> list[dict[str, Any]]:
    charge = requests.charge("order 1")
    other_key = {**charge, "amount_cents": charge["amount_cents"] + 1}
    keyless = requests.charge()
    sent = [("a new key", charge, idempotency_key("charge", charge["job_id"])),
            ("another key for the same job", other_key, idempotency_key("charge", charge["job_id"]) + ":other"),
            ("no key", keyless, None), ("no key, again", keyless, None)]
    violations = []
    for which, body, key in sent:
        answer = await _request(conn, queries, body, key)
        if answer.failure or answer.status_code != 201:
            violations.append({"request": which, "answered": answer.said(), "expected": "201, a new charge"})
            continue
        row = await _by_id(conn, answer.body.get("charge_id"))
        stored = {"idempotency_key": key, "job_id": uuid.UUID(body["job_id"]), "amount_cents": body["amount_cents"],
                  "currency": body["currency"], "payload_sha256": json_sha256(body)}
        for column, value in stored.items():
            if row is None or row[column] != value:
                why = (" (the key not stored: a repeat can never be recognised)"
                       if column == "idempotency_key" and key else "")
                violations.append({"request": which, "column": column, "stored": row and row[column], "sent": value,
                                   "so": f"the charge does not say what was asked{why}"})
    return violations


def _repeat_mistake(answer: Answer, original: Mapping[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """What the learner's queries did wrong with a repeat of `original`'s key (`rows`: the key's charges
    after it), or None."""
    if answer.sqlstate == UNIQUE_VIOLATION:
        return ("your insert did not stop at a key that already has its charge: the UNIQUE constraint refused it "
                "and the service failed (500); a repeat must insert nothing and return no row")
    if answer.found_none:
        return "charge_get_by_key found no charge for a key that has one"
    if answer.failure:
        return "the service failed"
    if answer.status_code == 201:
        return ("charge_insert_once returned a row for a key that already has its charge, so the service said "
                "'created' (201) as for a new charge; it must return no row (DO UPDATE returns the row it updated)")
    if answer.body.get("charge_id") != str(original["id"]):
        return (f"charge_get_by_key answered with charge {answer.body.get('charge_id')}, not this key's own "
                f"({original['id']})")
    if len(rows) != 1:
        return f"the key has {len(rows)} charges"
    return None


async def _repeats(conn: psycopg.AsyncConnection, queries: Mapping[str, str],
                   requests: Requests) -> list[dict[str, Any]]:
    """A repeat right after its original; and one whose original is OLD, made after an older charge and
    followed by CHARGES_BETWEEN others, so neither the newest nor the oldest charge is the key's."""
    violations = []
    for when in ("right after", f"{OLD} later, {CHARGES_BETWEEN} other keys' charges since"):
        charge = requests.charge()
        key = idempotency_key("charge", charge["job_id"])
        later = when != "right after"
        if later:
            older = requests.charge()
            await _request(conn, queries, older, idempotency_key("charge", older["job_id"]))
        first = await _request(conn, queries, charge, key)
        if first.failure or first.status_code != 201:
            violations.append({"repeat": when, "first request answered": first.said()})
            continue
        if later:
            await conn.execute("UPDATE charges SET created_at = created_at - %s::interval * "
                               "(CASE WHEN idempotency_key = %s THEN 1 ELSE 2 END) WHERE idempotency_key IN (%s, %s)",
                               (OLD, key, key, idempotency_key("charge", older["job_id"])))
            for _ in range(CHARGES_BETWEEN):
                between = requests.charge()
                await _request(conn, queries, between, idempotency_key("charge", between["job_id"]))
        original = await _by_id(conn, first.body["charge_id"])
        repeat = await _request(conn, queries, charge, key)
        mistake = _repeat_mistake(repeat, original, await _charges_of(conn, key, charge["job_id"]))
        if mistake is None and repeat.status_code != 200:
            mistake = "a repeat of the same body must be answered 200"
        if mistake:
            violations.append({"repeat": when, "answered": repeat.said(), "so": mistake})
    return violations


async def _differing_repeats(conn: psycopg.AsyncConnection, queries: Mapping[str, str],
                             requests: Requests) -> list[dict[str, Any]]:
    violations = []
    for field_name, changed in (("amount_cents", lambda value: value + 1), ("currency", lambda value: "EUR"),
                                ("description", lambda value: "order 2"),
                                ("job_id", lambda value: requests.charge()["job_id"])):
        charge = requests.charge("order 1")
        key = idempotency_key("charge", charge["job_id"])
        repeat_body = {**charge, field_name: changed(charge[field_name])}
        first = await _request(conn, queries, charge, key)
        if first.failure or first.status_code != 201:
            violations.append({"repeat differing in": field_name, "first request answered": first.said()})
            continue
        before = await _by_id(conn, first.body["charge_id"])
        repeat = await _request(conn, queries, repeat_body, key)
        after = await _by_id(conn, first.body["charge_id"])
        changed_columns = [column for column in before if after is None or after[column] != before[column]]
        if changed_columns:
            violations.append({"repeat differing in": field_name, "answered": repeat.said(), "so": "the original "
                               "charge was changed: " + ", ".join(f"{c} {before[c]} became {after and after[c]}"
                                                                  for c in changed_columns)
                               + " (a repeat must leave it as it was: DO NOTHING, not DO UPDATE)"})
            continue
        mistake = _repeat_mistake(repeat, before, await _charges_of(conn, key, charge["job_id"], repeat_body["job_id"]))
        if mistake is None and repeat.status_code != 409:
            mistake = "a repeat whose body differs must be refused (409): its body is not the charge's"
        if mistake:
            violations.append({"repeat differing in": field_name, "answered": repeat.said(), "so": mistake})
    return violations


async def _at_once(url: str, observer: psycopg.AsyncConnection, queries: Mapping[str, str], charge: dict[str, Any],
                   n: int) -> list[dict[str, Any]]:
    """The first of `n` requests with one key made inside a transaction held open; the n - 1 others sent
    on connections of their own, and let run until each finishes or waits for a lock; then the first
    commits."""
    key = idempotency_key("charge", charge["job_id"])
    async with AsyncExitStack() as stack:
        first, *others = [await stack.enter_async_context(await psycopg.AsyncConnection.connect(url, autocommit=True))
                          for _ in range(n)]
        for conn in others:
            await conn.execute("SET statement_timeout = '5s'")
        async with first.transaction():
            answer_1 = await _request(first, queries, charge, key)
            if answer_1.failure:  # its transaction is aborted: there is nothing to overlap with
                raise psycopg.Rollback()
            sent = [asyncio.create_task(_request(conn, queries, charge, key)) for conn in others]
            pids = [conn.info.backend_pid for conn in others]

            async def blocked_or_done() -> bool:
                cur = await observer.execute("SELECT bool_and(cardinality(pg_blocking_pids(pid)) > 0) "
                                             "FROM unnest(%s::int[]) AS pid", (
                                                 [pid for pid, task in zip(pids, sent, strict=True)
                                                  if not task.done()] or [0],))
                return all(task.done() for task in sent) or (await cur.fetchone())[0]
            try:
                await wait_until(blocked_or_done, LOCK_WAIT_SECONDS,
                                 f"each of {n - 1} more requests to finish or wait for the first")
            except TimeoutError:
                for task in sent:
                    task.cancel()  # not left running on a connection about to close
                raise
        if answer_1.failure:
            return [{"requests at once": n, "the first answered": answer_1.said()}]
        answers = [answer_1, *await asyncio.gather(*sent)]
    rows = await _charges_of(observer, key, charge["job_id"])
    violations = []
    for number, answer in enumerate(answers, 1):
        which = "the first" if number == 1 else f"request {number}, sent before the first committed"
        if answer.sqlstate == UNIQUE_VIOLATION:
            violations.append({"requests at once": n, "request": which, "answered": answer.said(),
                               "so": "it found no charge for the key (the first had not committed), inserted one, "
                                     "and failed on the UNIQUE constraint: only the constraint stopped a second "
                                     "charge (check-then-insert); the insert itself must wait and do nothing"})
        elif answer.failure or answer.status_code >= 300:
            violations.append({"requests at once": n, "request": which, "answered": answer.said()})
    if len(rows) != 1:
        violations.append({"requests at once": n, "charges made": len(rows),
                           "ids": ", ".join(str(row["id"]) for row in rows)})
    ids = {answer.body.get("charge_id") for answer in answers if not answer.failure}
    if not violations and len(ids) != 1:
        violations.append({"requests at once": n, "answered with charges": ", ".join(sorted(ids))})
    return violations


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    """Stage 06's crashed worker with the learner's SQL in the charge service (the forced schedules ran
    before it, so SQL the service cannot run never reaches it, where its jobs would retry for ever)."""
    import reliableq_stages
    result = await reliableq_stages.get("idempotency").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    # SUCCEEDED too: a repeat answered with some other charge is refused (409), and its job ends DEAD.
    charged = [{"job": row["job"], "status": row["status"], "ran": row["H"], "charged": row["C"]}
               for row in result.rows() if (row["status"], row["C"]) != ("SUCCEEDED", 1)]
    return Check("stage 06's crashed worker: each job succeeds, charged once (C=1) however often it ran", charged,
                 note=f"{result.measurements['handler_runs']} handler runs"), result


EXERCISE = Exercise(name="idempotency", stage_number=6, filename=FILENAME,
                    summary="the charge service's insert: one charge per idempotency key (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
