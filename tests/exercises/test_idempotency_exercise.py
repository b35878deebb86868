"""Exercise 06 (idempotency) graded by the real checker on real PostgreSQL, the learner's SQL in the real
charge service: the reference and right answers spelt differently pass the forced schedules (new keys and
none, repeats right after and 400 days later, repeats differing in each field, one key sent by 2 and 4
requests at once), and the wrong answers a learner would plausibly write fail first on the invariant each
breaks, saying what their SQL did there. SQL PostgreSQL refuses is said at the learner's line before any
request; the starter still charges twice in the stage's own crash."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import psycopg
import pytest

from reliableq import scratch
from reliableq.charge.service import charge_queries
from reliableq.lab.exercises import idempotency
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.invariants import Check

ON_CONFLICT = "ON CONFLICT (idempotency_key) DO NOTHING"
VALUES = "    VALUES (%(idempotency_key)s, %(job_id)s, %(amount_cents)s, %(currency)s, %(payload_sha256)s)\n"
GET = "SELECT * FROM charges WHERE idempotency_key = %(idempotency_key)s;"


def answer(conflict: str) -> str:
    """The reference with its ON CONFLICT clause spelt `conflict`."""
    return idempotency.REFERENCE.replace(ON_CONFLICT, conflict)


# Right, and spelt differently: the constraint by name; any conflict at all (the key's is the only one a
# new charge can meet, its id being fresh); a look-up before the insert, with the conflict clause still
# deciding; the key's charge read with a LIMIT.
ON_CONSTRAINT = answer("ON CONFLICT ON CONSTRAINT charges_idempotency_key_key DO NOTHING")
NO_TARGET = answer("ON CONFLICT DO NOTHING")
LOOKS_FIRST_TOO = idempotency.REFERENCE.replace(
    VALUES + f"    {ON_CONFLICT}", VALUES.replace("VALUES (", "SELECT ").replace(")\n", "\n")
    + "    WHERE NOT EXISTS (SELECT 1 FROM charges WHERE idempotency_key = %(idempotency_key)s)\n"
    + f"    {ON_CONFLICT}")
LIMITED = idempotency.REFERENCE.replace(GET, GET.replace(";", " LIMIT 1;"))
# The request's row named first, then inserted from it: another CTE shape, the same statement underneath.
CTE_SHAPE = idempotency._file({"charge_insert_once": """WITH incoming (idempotency_key, job_id, amount_cents, currency,
                                   payload_sha256) AS (
    VALUES (%(idempotency_key)s::text, %(job_id)s::uuid, %(amount_cents)s::bigint, %(currency)s::text,
            %(payload_sha256)s::text)
), created AS (
    INSERT INTO charges (idempotency_key, job_id, amount_cents, currency, payload_sha256)
    SELECT * FROM incoming
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
), logged AS (
    INSERT INTO charge_requests (job_id, idempotency_key, outcome, status_code, charge_id)
    SELECT job_id, idempotency_key, 'created', 201, id FROM created
)
SELECT * FROM created;""", "charge_get_by_key": idempotency._shipped("charge_get_by_key")})
RIGHT = {"on-constraint": ON_CONSTRAINT, "no-target": NO_TARGET, "looks-first-too": LOOKS_FIRST_TOO,
         "limited": LIMITED, "cte-shape": CTE_SHAPE}


def guarded_by(condition: str, conflict: str = "") -> str:
    """The reference's insert made only WHERE NOT EXISTS a charge meeting `condition`, with `conflict`."""
    return idempotency.REFERENCE.replace(
        VALUES + f"    {ON_CONFLICT}", VALUES.replace("VALUES (", "SELECT ").replace(")\n", "\n")
        + f"    WHERE NOT EXISTS (SELECT 1 FROM charges WHERE {condition})" + (f"\n    {conflict}" if conflict else ""))


def updating(assignments: str, where: str = "") -> str:
    return answer(f"ON CONFLICT (idempotency_key) DO UPDATE SET {assignments}" + (f" WHERE {where}" if where else ""))


DIFFERS = "charges.payload_sha256 <> EXCLUDED.payload_sha256"
# Look the key up, insert if it is not there: right one request at a time, not when two overlap.
CHECK_THEN_INSERT = guarded_by("idempotency_key = %(idempotency_key)s")
# The conflict clause added where the starter marks it, but the key never stored: nothing ever conflicts.
KEY_NOT_STORED = idempotency.STARTER.replace(idempotency.MARK, ON_CONFLICT)
# Each wrong answer, the check it breaks first, and words of what that check says it did.
WRONG = {
    "starter": (idempotency.STARTER, idempotency.NEW, "the key not stored"),
    "key-not-stored": (KEY_NOT_STORED, idempotency.NEW, "the key not stored"),
    "swapped-parameters": (idempotency.REFERENCE.replace("%(currency)s, %(payload_sha256)s",
                                                          "%(payload_sha256)s, %(currency)s"),
                           idempotency.NEW, "'column': 'currency'"),
    "not-whole-rows": (idempotency.REFERENCE.replace("SELECT * FROM created;", "SELECT id FROM created;"),
                       idempotency.NEW, "the row returned has no column 'job_id' (return whole rows: RETURNING *)"),
    "keyed-by-job": (guarded_by("job_id = %(job_id)s", "ON CONFLICT DO NOTHING"), idempotency.NEW,
                     "another key for the same job"),
    "keyless-requests-deduplicated": (
        guarded_by("idempotency_key IS NOT DISTINCT FROM %(idempotency_key)s", "ON CONFLICT DO NOTHING").replace(
            GET, GET.replace("= %(idempotency_key)s", "IS NOT DISTINCT FROM %(idempotency_key)s LIMIT 1")),
        idempotency.NEW, "no key, again"),
    "no-conflict-clause": (answer(""), idempotency.REPEATED, "the UNIQUE constraint refused it"),
    "overwrites": (updating("amount_cents = EXCLUDED.amount_cents, payload_sha256 = EXCLUDED.payload_sha256"),
                   idempotency.REPEATED, "DO UPDATE returns the row it updated"),
    "updates-nothing-to-return-the-row": (updating("idempotency_key = EXCLUDED.idempotency_key"),
                                          idempotency.REPEATED, "DO UPDATE returns the row it updated"),
    "newest-charge": (idempotency.REFERENCE.replace(GET, "SELECT * FROM charges ORDER BY created_at DESC LIMIT 1;"),
                      idempotency.REPEATED, "not this key's own"),
    "oldest-charge": (idempotency.REFERENCE.replace(GET, "SELECT * FROM charges ORDER BY created_at LIMIT 1;"),
                      idempotency.REPEATED, "not this key's own"),
    "recent-keys-only": (idempotency.REFERENCE.replace(GET, GET.replace(
        ";", " AND created_at > now() - interval '30 days';")), idempotency.REPEATED, "found no charge for a key"),
    "recent-keys-only-at-insert": (guarded_by("idempotency_key = %(idempotency_key)s AND created_at > now() - "
                                              "interval '30 days'"), idempotency.REPEATED,
                                   "the UNIQUE constraint refused it"),
    "overwrites-the-amount-of-a-differing-repeat": (updating("amount_cents = EXCLUDED.amount_cents", DIFFERS),
                                                    idempotency.DIFFERING, "amount_cents"),
    "overwrites-the-currency-of-a-differing-repeat": (updating("currency = EXCLUDED.currency", DIFFERS),
                                                      idempotency.DIFFERING, "currency USD became EUR"),
    "overwrites-the-job-of-a-differing-repeat": (updating("job_id = EXCLUDED.job_id", DIFFERS),
                                                 idempotency.DIFFERING, "'job_id', 'answered'"),
    "overwrites-the-fingerprint-of-a-differing-repeat": (updating("payload_sha256 = EXCLUDED.payload_sha256", DIFFERS),
                                                         idempotency.DIFFERING, "'description', 'answered'"),
    "check-then-insert": (CHECK_THEN_INSERT, idempotency.AT_ONCE_NAME, "(check-then-insert)"),
}


def test_the_starter_and_reference_come_from_the_shipped_queries():
    """The starter is the shipped insert without its key (NULL, as with idempotency off) and without its
    conflict clause, marked where it goes; the variants below really differ from the reference."""
    assert idempotency.STARTER.count(idempotency.MARK) == 1
    assert "ON CONFLICT" not in idempotency.STARTER and "%(idempotency_key)s, %(job_id)s" not in idempotency.STARTER
    assert ON_CONFLICT in idempotency.REFERENCE and GET in idempotency.REFERENCE
    texts = [idempotency.REFERENCE, *RIGHT.values(), *(text for text, _, _ in WRONG.values())]
    assert len(set(texts)) == len(texts)


def test_the_learners_queries_reach_the_charge_service_beside_earlier_exercises_pieces():
    """Pieces carry them beside another exercise's queue queries; the service refuses a name it lacks."""
    from reliableq.charge.service import create_charge_app
    from reliableq.lab.exercises import fencing
    pieces = idempotency.load(ON_CONSTRAINT).beside(fencing.load(fencing.REFERENCE))
    assert set(pieces.charge_queries) == set(idempotency.QUERIES) and set(pieces.queue_queries) == set(fencing.QUERIES)
    with pytest.raises(ValueError, match="no query named charge_insert in charge.sql"):
        create_charge_app("postgresql://unused", replaced_queries={"charge_insert": "SELECT 1"})


@pytest.mark.slow
async def test_the_reference_passes():
    result = await check(idempotency.EXERCISE, idempotency.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["forced schedules", "stage 06's scenario (seed 1)", "chaos seed 1"]


@pytest.fixture(scope="module")
def charge_url():
    """One scratch charge database for this file's forced schedules (making one costs seconds on a loaded
    machine), emptied before each use."""
    with scratch.scratch_databases("rq_test") as databases:
        yield databases.charge_url


def broken(text: str, charge_url: str) -> list[Check]:
    """The forced schedules' checks `text` breaks (the stage's scenario and chaos are left to the whole
    checks, which take seconds each)."""
    async def run() -> list[Check]:
        async with await psycopg.AsyncConnection.connect(charge_url, autocommit=True) as conn:
            await conn.execute("TRUNCATE charges, charge_requests")
        return await idempotency.forced_schedules(idempotency.load(text), 1, charge_url)
    return [c for c in asyncio.run(run()) if not c.held]


@pytest.mark.parametrize("text", RIGHT.values(), ids=RIGHT)
def test_right_answers_spelt_differently_pass_the_forced_schedules(text, charge_url):
    assert broken(text, charge_url) == []


@pytest.mark.parametrize("text, invariant, said", WRONG.values(), ids=WRONG)
def test_wrong_answers_break_first_the_invariant_they_miss_saying_what_they_did(text, invariant, said, charge_url):
    first = broken(text, charge_url)[0]
    assert first.name == invariant and said in str(first.violations), first.violations


@pytest.mark.slow
def test_the_reference_and_check_then_insert_meet_the_same_overlap_every_time_beside_cpu_burners(charge_url):
    """The overlap is forced (the first request's transaction held open until every other request waits
    for it, or finished), so the machine's load changes no verdict."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]

    async def ten_overlaps(text: str, seed: int) -> set[str]:
        queries = charge_queries(idempotency.load(text).charge_queries)
        requests = idempotency.Requests(seed)  # keys of their own in the shared database
        async with await psycopg.AsyncConnection.connect(charge_url, autocommit=True) as observer:
            return {repr([{k: v for k, v in row.items() if k not in ("answered", "ids")} for row in
                          await idempotency._at_once(charge_url, observer, queries, requests.charge(), 4)])
                    for _ in range(10)}
    try:
        assert asyncio.run(ten_overlaps(idempotency.REFERENCE, 2)) == {"[]"}
        [said] = asyncio.run(ten_overlaps(CHECK_THEN_INSERT, 3))
        assert said.count("(check-then-insert)") == 3
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


async def test_the_starter_charges_twice_in_the_stages_crash():
    """The stage's own demonstration, with the learner's SQL in the real charge service (in the check, the
    forced schedules say the starter's mistake before this runs)."""
    held, _ = await idempotency.scenario(idempotency.load(idempotency.STARTER), seed=1)
    assert not held.held and {"job": "job-1", "status": "SUCCEEDED", "ran": 2, "charged": 2} in held.violations


async def test_check_then_insert_is_told_its_mistake_first_in_the_overlap_that_shows_it():
    """One request at a time (the stage's scenario) it is right; with the first request's transaction held
    open, the second finds no charge, inserts, and the UNIQUE constraint fails it: said before any system
    runs."""
    result = await check(idempotency.EXERCISE, CHECK_THEN_INSERT, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == []
    assert result.lines[0].startswith("✗ Broken: requests with one key in flight at once")
    assert result.lines[1] == (
        "  requests at once 2, request request 2, sent before the first committed, answered HTTP 500, the service "
        "failed: PostgreSQL said: duplicate key value violates unique constraint \"charges_idempotency_key_key\", so "
        "it found no charge for the key (the first had not committed), inserted one, and failed on the UNIQUE "
        "constraint: only the constraint stopped a second charge (check-then-insert); the insert itself must wait "
        "and do nothing")
    assert "Replay it: reliableq exercise check idempotency --seed 1 --seeds 1" in result.text()


@pytest.mark.parametrize("text, said", [
    (answer("ON CONFLICT (job_id) DO NOTHING"),
     "idempotency.sql, query charge_insert_once: there is no unique or exclusion constraint matching the "
     "ON CONFLICT specification"),
    (answer("ON CONFLICT (idempotency_key) DO NOTHIN"),
     "idempotency.sql, query charge_insert_once, at `ON CONFLICT (idempotency_key) DO NOTHIN`: syntax error at "
     "or near \"NOTHIN\""),
    (idempotency._file({"charge_insert_once": "INSERT INTO charges (idempotency_key, job_id, amount_cents, currency, "
                        "payload_sha256)\n" + VALUES + ON_CONFLICT,
                        "charge_get_by_key": idempotency._shipped("charge_get_by_key")}),
     "idempotency.sql, query charge_insert_once: it must return rows (end it with a SELECT, or RETURNING), and it "
     "returns none"),
    (idempotency.REFERENCE.replace("idempotency_key = %(idempotency_key)s", "job_id = %(job_id)s"),
     "idempotency.sql, query charge_get_by_key: query parameter missing: job_id"),
], ids=["wrong-column", "syntax", "no-rows", "get-by-job"])
def test_sql_postgresql_refuses_is_said_at_the_learners_line_before_any_request(text, said, charge_url):
    with pytest.raises(LearnerError) as raised:
        broken(text, charge_url)
    assert str(raised.value).startswith(said), str(raised.value)
