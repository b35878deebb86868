-- Named queries of the migrations (reliableq/db.py apply_schema), the same for both databases. Each
-- migration runs in a transaction of its own together with the row that records it, under a lock held
-- to that transaction's end; a database whose migrations are all recorded runs none, so a process
-- starting beside a stalled one never waits behind that one's open transaction (applying a schema takes
-- locks on its tables: CREATE INDEX IF NOT EXISTS takes one before it looks).

-- name: migration_lock
-- Serialise concurrent migrators (several processes starting at once) until this transaction ends. The
-- key is the one the unnumbered script's migrator took, so it also waits for an older release's.
SELECT pg_advisory_xact_lock(hashtext('reliableq migrate'));

-- name: migrations_create
-- The record of the migrations applied to this database, one row each (`database`: 'queue' or 'charge',
-- so that both schemas may share one database).
CREATE TABLE IF NOT EXISTS reliableq_migrations (
    database   text NOT NULL,
    number     integer NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (database, number)
);

-- name: migrations_applied
-- The numbers of the migrations of `database` applied here.
SELECT number FROM reliableq_migrations WHERE database = %(database)s ORDER BY number;

-- name: migration_record
-- Record that migration `number` of `database` was applied (in the migration's own transaction).
INSERT INTO reliableq_migrations (database, number, name) VALUES (%(database)s, %(number)s, %(name)s);
