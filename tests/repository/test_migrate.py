"""Migrations (reliableq/db.py apply_schema): a schema already applied is not applied again, so a
process starting beside a stalled one never waits behind that one's open transaction; a changed schema
is applied."""

from __future__ import annotations

import asyncio

import psycopg

from reliableq import db, sql


async def test_starting_beside_an_open_transaction_does_not_wait_for_it(databases):
    """A session sits in a transaction that wrote to `jobs` (a worker stopped mid-claim): migrating
    again returns at once. Applying the schema text anyway would wait for that session to end, since
    CREATE INDEX IF NOT EXISTS locks the table before it looks."""
    with psycopg.connect(databases.queue_url) as stalled:
        stalled.execute("UPDATE jobs SET last_error = NULL")  # RowExclusiveLock until the transaction ends
        await asyncio.wait_for(asyncio.to_thread(db.migrate, databases), timeout=10)


def test_a_changed_schema_is_applied(databases, monkeypatch):
    """The record is of the schema's text: a new text (a new column, a new index) is applied once."""
    original = sql.schema
    changed = original("queue") + "\nCOMMENT ON TABLE jobs IS 'migrated again';\n"
    monkeypatch.setattr(sql, "schema", lambda database: changed if database == "queue" else original(database))
    db.apply_schema(databases.queue_url, "queue")
    with psycopg.connect(databases.queue_url) as conn:
        assert conn.execute("SELECT obj_description('jobs'::regclass)").fetchone() == ("migrated again",)

