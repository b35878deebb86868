-- Named queries of the charge service (sql/charge_schema.sql), loaded by reliableq/sql.py.

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

-- name: charge_counts_by_job
-- Per job: requests received (H) and charges committed (C).
SELECT job_id,
       count(*) AS requests,
       (SELECT count(*) FROM charges c WHERE c.job_id = r.job_id) AS charges
FROM charge_requests r
WHERE job_id IS NOT NULL
GROUP BY job_id;

-- name: charge_keys_with_duplicates
-- Idempotency keys holding more than one charge (must be empty: the UNIQUE constraint forbids it).
SELECT idempotency_key, count(*) AS charges FROM charges
WHERE idempotency_key IS NOT NULL GROUP BY idempotency_key HAVING count(*) > 1;

-- name: charge_requests_all
-- Every request the service received, for timelines.
SELECT job_id, received_at, idempotency_key, outcome, status_code FROM charge_requests ORDER BY received_at, id;

-- name: charge_jobs_with_duplicates
-- Jobs holding more than one committed charge, whatever their keys (NULL keys never conflict).
SELECT job_id, count(*) AS charges FROM charges GROUP BY job_id HAVING count(*) > 1 ORDER BY job_id;

-- name: charge_outage_requests
-- Requests refused by an outage, and how many distinct jobs made them.
SELECT count(*) AS requests, count(DISTINCT job_id) AS jobs FROM charge_requests WHERE outcome = 'injected_outage';
