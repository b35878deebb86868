-- Migration 3 of the queue's database: a job's idempotency key names the job's kind,
-- 'reliableq:<kind>:<id>', where it said 'reliableq:charge:' of every job (a noop job's too). The core
-- knows no kind; a kind's handler sends the key to whatever service makes its effect.
-- Existing keys need no migrating: a charge job's key is the same, character for character, so a charge
-- made before the upgrade is still found by that job's next attempt; only other kinds' keys change, and
-- no stock kind but charge sends its key anywhere. Dropped and added rather than SET EXPRESSION, which
-- needs PostgreSQL 17: the column is generated, so its values are computed again for every row.
ALTER TABLE jobs DROP COLUMN idempotency_key;
ALTER TABLE jobs ADD COLUMN idempotency_key text GENERATED ALWAYS AS ('reliableq:' || kind || ':' || id::text) STORED;
