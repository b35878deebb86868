"""Exercise 06 (idempotency) graded by the real checker on real PostgreSQL, the learner's SQL in the real
charge service: the reference and right answers spelt differently pass, the starter fails on the stage's
double charge (C=2), and the wrong answers a learner would plausibly write fail on the invariant each
breaks. SQL PostgreSQL refuses, or a request the service cannot answer with it, is said before any
system runs."""

from __future__ import annotations

import asyncio

import pytest

from reliableq.lab.exercises import idempotency
from reliableq.lab.exercises.checker import Outcome, check
from reliableq.lab.exercises.learner_code import LearnerError
from reliableq.lab.invariants import Check

ON_CONFLICT = "ON CONFLICT (idempotency_key) DO NOTHING"
VALUES = "    VALUES (%(idempotency_key)s, %(job_id)s, %(amount_cents)s, %(currency)s, %(payload_sha256)s)\n"


def answer(conflict: str) -> str:
    """The reference with its ON CONFLICT clause spelt `conflict`."""
    return idempotency.REFERENCE.replace(ON_CONFLICT, conflict)


# Right, and spelt differently: the constraint by name; any conflict at all (the key's is the only one a
# new charge can meet, its id being fresh).
ON_CONSTRAINT = answer("ON CONFLICT ON CONSTRAINT charges_idempotency_key_key DO NOTHING")
NO_TARGET = answer("ON CONFLICT DO NOTHING")
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
# A repeat answered by overwriting the original with what the repeat said.
OVERWRITES = answer("ON CONFLICT (idempotency_key) DO UPDATE SET amount_cents = EXCLUDED.amount_cents, "
                    "payload_sha256 = EXCLUDED.payload_sha256")
# Look the key up, insert if it is not there: right one request at a time, not when two overlap.
CHECK_THEN_INSERT = idempotency.REFERENCE.replace(
    VALUES + f"    {ON_CONFLICT}",
    VALUES.replace("VALUES (", "SELECT ").replace(")\n", "\n")
    + "    WHERE NOT EXISTS (SELECT 1 FROM charges WHERE idempotency_key = %(idempotency_key)s)")
# The conflict clause added where the starter marks it, but the key never stored: nothing ever conflicts.
KEY_NOT_STORED = idempotency.STARTER.replace(idempotency.MARK, ON_CONFLICT)


def test_the_starter_and_reference_come_from_the_shipped_queries():
    """The starter is the shipped insert without its key (NULL, as with idempotency off) and without its
    conflict clause, marked where it goes; the variants below really differ from the reference."""
    assert idempotency.STARTER.count(idempotency.MARK) == 1
    assert "ON CONFLICT" not in idempotency.STARTER and "%(idempotency_key)s, %(job_id)s" not in idempotency.STARTER
    assert ON_CONFLICT in idempotency.REFERENCE
    assert "WHERE NOT EXISTS" in CHECK_THEN_INSERT and ON_CONFLICT not in CHECK_THEN_INSERT
    assert len({idempotency.REFERENCE, ON_CONSTRAINT, NO_TARGET, CTE_SHAPE, OVERWRITES, KEY_NOT_STORED}) == 6


def test_the_learners_queries_reach_the_charge_service_beside_earlier_exercises_pieces():
    """Pieces carry them beside another exercise's queue queries; the service refuses a name it lacks."""
    from reliableq.charge.service import create_charge_app
    from reliableq.lab.exercises import fencing
    pieces = idempotency.load(ON_CONSTRAINT).beside(fencing.load(fencing.REFERENCE))
    assert set(pieces.charge_queries) == set(idempotency.QUERIES) and set(pieces.queue_queries) == set(fencing.QUERIES)
    with pytest.raises(ValueError, match="no query named charge_insert in charge.sql"):
        create_charge_app("postgresql://unused", replaced_queries={"charge_insert": "SELECT 1"})


async def test_the_reference_passes():
    result = await check(idempotency.EXERCISE, idempotency.REFERENCE, seed=1, seeds=1)
    assert result.outcome is Outcome.PASSED, result.text()
    assert result.checked == ["stage 06's scenario (seed 1)", "direct checks", "chaos seed 1"]


def broken(text: str) -> list[Check]:
    """The direct checks `text` breaks (the stage's scenario and chaos are left to the whole checks
    above and below, which take seconds each)."""
    return [c for c in asyncio.run(idempotency.direct(idempotency.load(text), 1)) if not c.held]


@pytest.mark.parametrize("text", [ON_CONSTRAINT, NO_TARGET, CTE_SHAPE], ids=["on-constraint", "no-target", "cte-shape"])
def test_right_answers_spelt_differently_are_tried_and_pass_the_direct_checks(text):
    asyncio.run(idempotency.try_queries(idempotency.load(text)))  # no LearnerError
    assert broken(text) == []


async def test_the_starter_fails_with_the_stages_double_charge():
    result = await check(idempotency.EXERCISE, idempotency.STARTER, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED
    assert result.lines[0].startswith("✗ Broken: stage 06's crashed worker: each job succeeds, charged once (C=1)")
    assert "job job-1, status SUCCEEDED, ran 2, charged 2" in result.text()
    assert "Replay it: reliableq exercise check idempotency --seed 1 --seeds 1" in result.text()


def test_a_conflict_clause_on_a_key_never_stored_still_charges_twice():
    """It fails the stage's scenario as the starter does (C=2); forced, the overlap shows it at once."""
    first = broken(KEY_NOT_STORED)[0]
    assert first.name.startswith("the same key sent twice at once") and first.violations[-1]["charges made"] == 2


def test_overwriting_the_original_fails_on_the_differing_repeat():
    """DO UPDATE would pass the stage's scenario (its repeats say the same thing); a repeat that says
    something else shows it rewrites the charge the customer was already told of."""
    first = broken(OVERWRITES)[0]
    assert first.name.startswith("a repeat of a key with a different body changes nothing")
    assert {"original charge": "amount 1250 became 9999"} in first.violations


async def test_check_then_insert_fails_when_two_requests_overlap_and_says_what_happened():
    """One request at a time (the stage's scenario) it is right; with the first request's transaction
    held open, the second finds no charge, inserts, and the UNIQUE constraint fails it."""
    result = await check(idempotency.EXERCISE, CHECK_THEN_INSERT, seed=1, seeds=1)
    assert result.outcome is Outcome.FAILED and result.checked == ["stage 06's scenario (seed 1)"]
    assert result.lines[0].startswith("✗ Broken: the same key sent twice at once")
    assert ('request the second, sent before the first committed, answered HTTP 500, the service failed: '
            'PostgreSQL said: duplicate key value violates unique constraint "charges_idempotency_key_key"'
            in result.text())
    assert "inserted one, and failed on the UNIQUE constraint" in result.text()


@pytest.mark.parametrize("text, said", [
    (answer("ON CONFLICT (job_id) DO NOTHING"),
     "idempotency.sql, query charge_insert_once: there is no unique or exclusion constraint matching the "
     "ON CONFLICT specification"),
    (answer("ON CONFLICT (idempotency_key) DO NOTHIN"),
     "idempotency.sql, query charge_insert_once, at `ON CONFLICT (idempotency_key) DO NOTHIN`: syntax error at "
     "or near \"NOTHIN\""),
    (answer(""), "idempotency.sql: a repeat of the first request's key was not answered with a charge: HTTP 500, "
                 "the service failed: PostgreSQL said: duplicate key value violates unique constraint "
                 "\"charges_idempotency_key_key\""),
    (idempotency.REFERENCE.replace("SELECT * FROM created;", "SELECT id FROM created;"),
     "idempotency.sql: a first request was not answered with a charge: HTTP 500, the service failed: the row "
     "returned has no column 'job_id' (return whole rows: RETURNING *)"),
    (idempotency.REFERENCE.replace("WHERE idempotency_key = %(idempotency_key)s;", "ORDER BY created_at DESC LIMIT 1;"),
     "idempotency.sql: a repeat of the first request's key was not answered with a charge: HTTP 409, charge "),
    (idempotency._file({"charge_insert_once": "INSERT INTO charges (idempotency_key, job_id, amount_cents, currency, "
                        "payload_sha256)\n" + VALUES + ON_CONFLICT,
                        "charge_get_by_key": idempotency._shipped("charge_get_by_key")}),
     "idempotency.sql, query charge_insert_once: it must return rows (end it with a SELECT, or RETURNING), and it "
     "returns none"),
    (idempotency.REFERENCE.replace("idempotency_key = %(idempotency_key)s", "job_id = %(job_id)s"),
     "idempotency.sql, query charge_get_by_key: query parameter missing: job_id"),
], ids=["wrong-column", "syntax", "no-conflict-clause", "not-whole-rows", "newest-charge", "no-rows", "get-by-job"])
async def test_sql_the_service_cannot_run_is_said_before_any_system_runs(text, said):
    with pytest.raises(LearnerError) as raised:
        await idempotency.try_queries(idempotency.load(text))
    assert str(raised.value).startswith(said), str(raised.value)
