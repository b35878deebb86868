-- Named queries of the lab (reliableq/lab/) over the charge service's tables (sql/migrations/charge/),
-- loaded by reliableq/sql.py: handler runs and charges per job, timelines and the invariant checks.
-- Read-only; the charge service itself never runs them.

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

-- name: charge_outage_requests_by_job
-- Per job that met an outage: how many of its requests the outage refused, most first.
SELECT job_id, count(*) AS requests FROM charge_requests
WHERE outcome = 'injected_outage' GROUP BY job_id ORDER BY requests DESC, job_id;
