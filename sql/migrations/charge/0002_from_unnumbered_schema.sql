-- Migration 2 of the charge service's database: what a database made before numbered migrations needs to
-- equal a fresh one. Until then one idempotent script (sql/charge_schema.sql) was applied whenever its
-- text changed; its tables never changed shape, so only the script's own record remains. Does nothing on a
-- fresh database. tests/repository/test_migrations.py upgrades such a database and compares it.

-- The unnumbered script's record of the text it last applied (reliableq_migrations replaces it).
DROP TABLE IF EXISTS reliableq_schema;
