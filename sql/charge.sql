-- Named queries of the charge service (sql/migrations/charge/), loaded by reliableq/sql.py.

-- name: charge_insert_once
-- Create the charge unless its key exists, and log the request as `created` when it did: the common
-- case is one statement and one commit. Concurrent requests with one key create one row.
WITH created AS (
    INSERT INTO charges (idempotency_key, job_id, amount_cents, currency, payload_sha256)
    VALUES (%(idempotency_key)s, %(job_id)s, %(amount_cents)s, %(currency)s, %(payload_sha256)s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
), logged AS (
    INSERT INTO charge_requests (job_id, idempotency_key, outcome, status_code, charge_id)
    SELECT job_id, idempotency_key, 'created', 201, id FROM created
)
SELECT * FROM created;

-- name: charge_get_by_key
-- The charge an idempotency key already created.
SELECT * FROM charges WHERE idempotency_key = %(idempotency_key)s;

-- name: charge_request_log
-- Record one received request and what the service answered.
INSERT INTO charge_requests (job_id, idempotency_key, outcome, status_code, charge_id)
VALUES (%(job_id)s, %(idempotency_key)s, %(outcome)s, %(status_code)s, %(charge_id)s);
