-- Named queries of the migration (reliableq/db.py apply_schema), the same for both databases. A
-- schema is applied only when its text changed since it was last applied here: applying it again
-- would take locks on the tables (CREATE INDEX IF NOT EXISTS takes one before it looks), and a
-- worker starting beside a stalled one would wait behind that worker's open transaction.

-- name: migrate_lock
-- Serialise concurrent migrations (several processes starting at once).
SELECT pg_advisory_lock(hashtext('reliableq migrate'));

-- name: migrate_unlock
-- Release the migration lock.
SELECT pg_advisory_unlock(hashtext('reliableq migrate'));

-- name: schema_applied_create
-- The record of which schema text each database last had applied (touches no other table).
CREATE TABLE IF NOT EXISTS reliableq_schema (
    name       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_applied_read
-- The digest of the schema text last applied as `name`, if any.
SELECT sha256 FROM reliableq_schema WHERE name = %(name)s;

-- name: schema_applied_write
-- Record that the schema text with this digest was applied as `name`.
INSERT INTO reliableq_schema (name, sha256) VALUES (%(name)s, %(sha256)s)
ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now();
