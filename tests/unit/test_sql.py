"""The SQL loader (reliableq/sql.py): every named block found, none empty; the lab's queries apart."""

from __future__ import annotations

import re

import psycopg._queries
import pytest

from reliableq import sql


def test_every_named_query_is_loaded_and_nonempty():
    """The loader finds each `-- name:` block; the core's queries exist."""
    queue, charge = sql.queries("queue"), sql.queries("charge")
    for name in ("job_insert", "job_claim_due_skip_locked", "job_select_due", "job_mark_claimed",
                 "job_renew_lease", "job_succeed", "job_retry", "job_dead", "job_replay"):
        assert queue[name].strip()
    assert "ON CONFLICT (idempotency_key) DO NOTHING" in charge["charge_insert_once"]
    assert all(not text.lstrip().startswith("--") for text in {**queue, **charge}.values())


def test_the_statements_sent_are_the_queries_without_their_comment_lines():
    """Learners read the queries with their comments; the server gets them without, each short enough for
    psycopg to keep its parse (the fair claim's comments alone took it past that)."""
    cached_up_to = psycopg._queries.MAX_CACHED_STATEMENT_LENGTH
    queries, statements = sql.queries("queue"), sql.statements("queue")
    assert statements.keys() == queries.keys()
    for name, text in queries.items():
        code = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
        assert statements[name].splitlines() == code
        assert len(statements[name].encode()) <= cached_up_to, name
    assert len(queries["job_claim_due_fair"].encode()) > cached_up_to


def test_the_labs_queries_are_apart_from_the_cores():
    """lab_queue.sql and lab_charge.sql load through the same loader and share no name with the core's."""
    for database in ("queue", "charge"):
        core, lab = sql.queries(database), sql.queries(f"lab_{database}")
        assert lab and not set(core) & set(lab)
        assert all(text.strip() and not text.lstrip().startswith("--") for text in lab.values())


def test_the_shipped_migrations_load_in_order():
    """Each database's migrations are numbered 1, 2, ... and its schema is their text in that order."""
    for database in ("queue", "charge"):
        migrations = sql.migrations(database)
        assert [m.number for m in migrations] == list(range(1, len(migrations) + 1))
        assert migrations[0].name == "0001_schema"
        schema = sql.schema(database)
        assert all(m.text in schema for m in migrations)
        assert [schema.index(m.text) for m in migrations] == sorted(schema.index(m.text) for m in migrations)


def test_a_misnamed_or_missing_migration_is_refused(tmp_path):
    """A file not named NNNN_<what>.sql, or a gap in the numbers, stops the loader instead of being
    skipped; hidden files (an editor's) are passed over."""
    (tmp_path / "0001_first.sql").write_text("SELECT 1;")
    (tmp_path / ".0002_first.sql.swp").write_text("")
    assert [m.name for m in sql.migrations_in(tmp_path)] == ["0001_first"]
    (tmp_path / "0003_third.sql").write_text("SELECT 3;")
    with pytest.raises(ValueError, match="without a gap"):
        sql.migrations_in(tmp_path)
    (tmp_path / "0003_third.sql").rename(tmp_path / "2_second.sql")
    with pytest.raises(ValueError, match="2_second.sql is not named NNNN_<what>.sql"):
        sql.migrations_in(tmp_path)


def test_a_fragment_stands_where_a_query_includes_it_and_is_no_query_itself():
    text = ("-- name: first\n-- one\nWITH a AS (\n    SELECT 1\n-- include: tail\n\n"
            "-- fragment: tail\n-- what both end with\n)\nSELECT * FROM a;\n\n"
            "-- name: second\nWITH a AS (\n    SELECT 2\n-- include: tail\n")
    assert sql.parse_named(text, "t.sql") == {"first": "WITH a AS (\n    SELECT 1\n)\nSELECT * FROM a;",
                                              "second": "WITH a AS (\n    SELECT 2\n)\nSELECT * FROM a;"}


@pytest.mark.parametrize("text, said", [
    ("-- name: q\nSELECT 1\n-- include: missing\n", "t.sql: no fragment named 'missing' to include"),
    ("-- name: q\n-- include: loop\n-- fragment: loop\n-- include: loop\n", "t.sql: fragment 'loop' includes itself"),
    ("-- fragment: f\nSELECT 1\n-- fragment: f\nSELECT 2\n", "fragment 'f' is defined twice in t.sql"),
])
def test_a_fragment_that_cannot_be_included_is_named(text, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        sql.parse_named(text, "t.sql")


def test_both_claims_end_with_the_one_taking_of_the_due_jobs():
    queue = sql.queries("queue")
    tail = queue["job_claim_due_skip_locked"][queue["job_claim_due_skip_locked"].index("), expired AS ("):]
    assert queue["job_claim_due_fair"].endswith(tail)
