-- Migration 1 of the charge service's own database: the effect the worker must not duplicate, as a fresh
-- database gets it. Applied once per database (reliableq/db.py apply_schema), by `reliableq migrate` and
-- on the service's start-up; change the schema in a new numbered file, never here. Its statements stay
-- idempotent (IF NOT EXISTS) because it also runs on databases the unnumbered script made (see 0002).

CREATE TABLE IF NOT EXISTS charges (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- NULL when the caller sends no key (stage `idempotency` off): NULLs never conflict,
    -- so every such request creates a charge.
    idempotency_key  text UNIQUE,
    job_id           uuid NOT NULL,
    amount_cents     bigint NOT NULL CHECK (amount_cents > 0),
    currency         text NOT NULL,
    -- What "the same request" means for a repeated key: a digest of the canonical payload.
    payload_sha256   text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS charges_job ON charges (job_id);

-- Every request the service received, whatever became of it: H (handler runs) is counted here.
CREATE TABLE IF NOT EXISTS charge_requests (
    id               bigserial PRIMARY KEY,
    received_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    job_id           uuid,
    idempotency_key  text,
    -- created | replayed | conflict | declined | invalid | overloaded
    -- | injected_503 | injected_422 | injected_timeout | injected_outage (a lost response logs `created`: the charge exists)
    outcome          text NOT NULL,
    status_code      integer NOT NULL,
    charge_id        uuid
);
CREATE INDEX IF NOT EXISTS charge_requests_job ON charge_requests (job_id);
