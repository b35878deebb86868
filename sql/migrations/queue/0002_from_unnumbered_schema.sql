-- Migration 2 of the queue's database: what a database made before numbered migrations needs to equal a
-- fresh one. Until then one idempotent script (sql/queue_schema.sql) was applied whenever its text changed,
-- so such a database may have been made by any of its versions (no release was tagged); migration 1 runs
-- there too and creates what it lacks, and these statements change what it cannot: a table or column an
-- older version made differently. Each does nothing on a fresh database.
-- tests/repository/test_migrations.py upgrades the first and the last unnumbered schema, with jobs in them,
-- and compares each with a fresh database.

-- The first idle_workers had no expiry: a `since` column instead of `until`. The script's upgrade added
-- `until` with a default (an old mark counts as run out), which a fresh table does not have.
ALTER TABLE idle_workers DROP COLUMN IF EXISTS since,
    ADD COLUMN IF NOT EXISTS until timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE idle_workers ALTER COLUMN until DROP DEFAULT;

-- job_attempts.recorded_at came later; the attempts already recorded get the time of this migration.
ALTER TABLE job_attempts ADD COLUMN IF NOT EXISTS recorded_at timestamptz NOT NULL DEFAULT clock_timestamp();

-- The unnumbered script's record of the text it last applied (reliableq_migrations replaces it).
DROP TABLE IF EXISTS reliableq_schema;
