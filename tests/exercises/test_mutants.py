"""The checker's mutation score (reliableq/lab/exercises/mutants.py): the operators make the mutants they
claim (no database), a seeded sample of mutants is rejected by the real checker, and the harness fails
when the checker is weakened or the equivalence table misses an entry. The whole run is
`reliableq exercise mutants`."""

from __future__ import annotations

import ast

import pytest
from pglast import parse_sql

from reliableq import sql
from reliableq.lab.exercises import EXERCISES, mutants_python, mutants_sql
from reliableq.lab.exercises.checker import CheckResult, Outcome
from reliableq.lab.exercises.mutants import Fate, failed, judge, mutants_of, report, sample, score

SQL_FILE = """-- A header a learner keeps.

-- name: job_take
-- What it does.
WITH due AS (
    SELECT id FROM jobs WHERE status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET worker_id = %(worker_id)s FROM due WHERE jobs.id = due.id AND jobs.lease_token = %(token)s
RETURNING jobs.*;

-- name: charge_insert
INSERT INTO charges (idempotency_key, amount_cents) VALUES (%(key)s, %(amount)s)
ON CONFLICT (idempotency_key) DO NOTHING RETURNING *;
"""

PYTHON_FILE = '''"""A module docstring."""


async def accept(store, acknowledge):
    """A docstring."""
    await store()
    await acknowledge()


def decide(kind, attempts, budget):
    if kind == "ok" and attempts > 0:
        return "succeed"
    return "dead" if attempts >= budget else "retry"


def delay(attempt, base):
    return base * 2 ** (attempt - 1)
'''


def _by_description(made: list) -> dict[str, str]:
    return {mutant.description: mutant.text for mutant in made}


def _query(text: str, name: str) -> str:
    return " ".join(sql.parse_named(text, "mutant")[name].split())


def test_placeholders_round_trip_through_numbers():
    """%(name)s -> $n in order of first use and back; %% and a % in a string literal survive."""
    text = "SELECT %(b)s, %(a)s, %(b)s, '50%%' WHERE x LIKE 'a%%'"
    numbered, names = mutants_sql.to_numbered(text)
    assert (numbered, names) == ("SELECT $1, $2, $1, '50%' WHERE x LIKE 'a%'", ["b", "a"])
    assert mutants_sql.to_named(numbered, names) == text


def test_sql_mutants_are_whole_files_that_parse_each_one_edit_from_the_baseline():
    baseline, made = mutants_sql.mutants(SQL_FILE)
    assert baseline.startswith("-- A header a learner keeps.\n\n-- name: job_take\n-- What it does.\n")
    assert "\n-- name: charge_insert\n" in baseline
    assert len({m.description for m in made}) == len(made)
    for mutant in made:
        queries = sql.parse_named(mutant.text, "mutant")
        assert list(queries) == ["job_take", "charge_insert"]
        for body in queries.values():
            parse_sql(mutants_sql.to_numbered(body)[0])
        assert mutant.text != baseline


@pytest.mark.parametrize("description, query, expected", [
    ("job_take: due: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED", "job_take",
     "FOR NO KEY UPDATE SKIP LOCKED"),
    ("job_take: due: lock FOR UPDATE SKIP LOCKED -> FOR SHARE NOWAIT", "job_take", "FOR SHARE NOWAIT )"),
    ("job_take: due: lock FOR UPDATE SKIP LOCKED -> FOR KEY SHARE", "job_take", "FOR KEY SHARE )"),
    ("job_take: due: lock FOR UPDATE SKIP LOCKED removed", "job_take", "LIMIT %(limit)s )"),
    ("job_take: due: `run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> >", "job_take",
     "AND run_at > COALESCE"),
    ("job_take: due: `status = 'PENDING'` removed", "job_take", "WHERE run_at <= COALESCE"),
    ("job_take: due: `status = 'PENDING'` negated", "job_take", "WHERE NOT status = 'PENDING' AND"),
    ("job_take: `jobs.lease_token = %(token)s`: `jobs.lease_token` -> `jobs.id`", "job_take",
     "AND jobs.id = %(token)s"),
    ("job_take: `jobs.lease_token = %(token)s`: %(token)s -> %(worker_id)s", "job_take",
     "AND jobs.lease_token = %(worker_id)s"),
    ("job_take: due: `now()` -> clock_timestamp()", "job_take", "%(now)s AS timestamptz) , clock_timestamp())"),
    ("job_take: due: LIMIT `%(limit)s` removed", "job_take", "ORDER BY id FOR UPDATE"),
    ("charge_insert: ON CONFLICT removed", "charge_insert", "%(amount)s) RETURNING *"),
    ("charge_insert: ON CONFLICT DO NOTHING: conflict target removed", "charge_insert", "ON CONFLICT DO NOTHING"),
    ("charge_insert: DO NOTHING -> DO UPDATE SET every column = excluded's", "charge_insert",
     "ON CONFLICT (idempotency_key) DO UPDATE SET idempotency_key = excluded.idempotency_key , "
     "amount_cents = excluded.amount_cents"),
])
def test_each_sql_operator_makes_the_edit_it_names(description, query, expected):
    _, made = mutants_sql.mutants(SQL_FILE)
    assert expected in _query(_by_description(made)[description], query)


def test_a_column_is_swapped_only_for_one_of_its_type_in_its_own_cte():
    """jobs.lease_token (uuid) may become jobs.id (uuid), never status (text, and in the CTE `due`)."""
    _, made = mutants_sql.mutants(SQL_FILE)
    swaps = [m.description for m in made if m.operator == "column" and "`jobs.lease_token` ->" in m.description]
    assert swaps == ["job_take: `jobs.lease_token = %(token)s`: `jobs.lease_token` -> `due.id`",
                     "job_take: `jobs.lease_token = %(token)s`: `jobs.lease_token` -> `jobs.id`"]


@pytest.mark.parametrize("description, expected", [
    ("accept, line 6: `await store()` without await", "    store()\n    await acknowledge()"),
    ("accept, lines 6 and 7: `await store()` and `await acknowledge()` swapped",
     "    await acknowledge()\n    await store()"),
    ("accept, line 7: `await acknowledge()` removed", "    await store()\n\ndef"),
    ("decide, line 11: `kind == 'ok'`: == -> !=", "if kind != 'ok' and"),
    ("decide, line 11: `kind == 'ok' and attempts > 0`: and -> or", "if kind == 'ok' or attempts > 0:"),
    ("decide, line 11: 0 -> 1", "attempts > 1:"),
    ("decide, line 11: `kind == 'ok' and attempts > 0` negated", "if not (kind == 'ok' and attempts > 0):"),
    ("decide, line 13: `attempts >= budget` negated", "return 'dead' if not attempts >= budget else 'retry'"),
    ("decide, line 12: return 'succeed' -> 'retry'", "        return 'retry'\n    return 'dead'"),
    ("delay, line 17: `base * 2 ** (attempt - 1)`: * -> /", "return base / 2 ** (attempt - 1)"),
    ("delay, line 17: `attempt - 1`: - -> +", "return base * 2 ** (attempt + 1)"),
])
def test_each_python_operator_makes_the_edit_it_names(description, expected):
    baseline, made = mutants_python.mutants(PYTHON_FILE, ("succeed", "retry", "dead"))
    assert expected in _by_description(made)[description]
    assert baseline == ast.unparse(ast.parse(PYTHON_FILE)) + "\n"


def test_python_mutants_leave_docstrings_alone_and_are_never_the_reference():
    baseline, made = mutants_python.mutants(PYTHON_FILE, ("succeed", "retry", "dead"))
    assert not [m for m in made if "docstring" in m.description.lower() or "A docstring" not in m.text]
    assert all(ast.dump(ast.parse(m.text)) != ast.dump(ast.parse(baseline)) for m in made)


def test_a_sample_is_seeded():
    _, made = mutants_of(EXERCISES["dead"])
    assert sample(made, 5, 7, "dead") == sample(made, 5, 7, "dead") != sample(made, 5, 8, "dead")
    assert len(sample(made, 5, 7, "dead")) == 5 and sample(made, None, 7, "dead") == made


# One operator per exercise whose every mutant the checker must reject: a seeded pick among them.
SAMPLED = [("commit-before-ack", "await"), ("skip-locked", "limit"), ("idempotency", "predicate"),
           ("backoff", "arithmetic"), ("dead", "answer"), ("semaphore", "arithmetic"),
           ("fairness", "limit")]


@pytest.mark.slow
@pytest.mark.parametrize("name, operator", SAMPLED, ids=[name for name, _ in SAMPLED])
async def test_a_seeded_sample_of_mutants_is_rejected_by_the_real_checker(name, operator):
    exercise = EXERCISES[name]
    baseline, made = mutants_of(exercise, {operator})
    (mutant,) = sample(made, 1, 0, name)
    judged = await judge(exercise, mutant, baseline)
    assert judged.fate in (Fate.REJECTED, Fate.REFUSED), (mutant.description, judged.said)


async def _passes_everything(exercise, text, **_) -> CheckResult:
    return CheckResult(exercise.name, Outcome.PASSED, [f"✓ {exercise.name} passed"])


async def test_a_weakened_checker_leaves_survivors_and_the_run_fails():
    scored = await score(EXERCISES["dead"], sample_size=3, seed=0, checker=_passes_everything, equivalent={})
    assert [j.fate for j in scored.judged] == [Fate.SURVIVED] * 3 and failed([scored])
    text = "\n".join(report([scored], 0.0))
    assert text.count("SURVIVED dead: ") == 3 and "--- reference\n+++ mutant" in text


SWAPPED = "decide, lines 21 and 23: `if outcome_kind == 'ok':` and `if outcome_kind == 'permanent':` swapped"
RETRY_NOT_DEAD = "decide, line 26: return 'dead' -> 'retry'"


@pytest.mark.slow
async def test_a_survivor_is_equivalent_only_when_listed_and_the_differential_agrees():
    """Two early returns on disjoint conditions, swapped: the real checker passes it. Unlisted, it is a
    survivor; listed, the differential over every outcome, attempt and budget the API accepts confirms
    it; a wrong entry (a mutant that answers differently) is caught by the differential."""
    exercise = EXERCISES["dead"]
    baseline, made = mutants_of(exercise)
    mutant = {m.description: m for m in made}
    reason = {"dead": {SWAPPED: "the two conditions never hold together", RETRY_NOT_DEAD: "(wrong)"}}
    assert (await judge(exercise, mutant[SWAPPED], baseline, equivalent={})).fate is Fate.SURVIVED
    assert (await judge(exercise, mutant[SWAPPED], baseline, equivalent=reason)).fate is Fate.EQUIVALENT
    wrong = await judge(exercise, mutant[RETRY_NOT_DEAD], baseline, checker=_passes_everything, equivalent=reason)
    assert wrong.fate is Fate.SURVIVED and "differs from the reference" in wrong.said
