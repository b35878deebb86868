-- Named queries of the benchmark (reliableq/bench/) over the queue's tables (sql/migrations/queue/).
-- Read-mostly: the only write is the preload, which stands in for a client that already submitted.

-- name: job_insert_many_tenants
-- Store `jobs` due no-op jobs shared round-robin among `tenants` tenants, run_at a microsecond apart (the
-- fairness scenario's backlog: no events, nothing else reads them).
INSERT INTO jobs (kind, payload, max_attempts, tenant, run_at)
SELECT 'noop', '{}', 5, 'tenant-' || (n %% %(tenants)s), now() - make_interval(secs => (%(jobs)s - n) / 1e6)
FROM generate_series(1, %(jobs)s) AS n;

-- name: job_insert_many
-- Store `jobs` identical jobs of `kind` for `tenant` in one statement, as submissions without a key
-- store them (no event: sql/queue.sql job_events_of); all are due at once. run_at steps back a
-- microsecond per job, as separate submissions would differ.
INSERT INTO jobs (kind, payload, max_attempts, tenant, run_at)
SELECT %(kind)s, %(payload)s, %(max_attempts)s, %(tenant)s, now() - make_interval(secs => (%(jobs)s - n) / 1e6)
FROM generate_series(1, %(jobs)s) AS n;

-- name: job_bench_span
-- A batch by PostgreSQL's clock: jobs per final status, attempts, and seconds from the first
-- submission to the last finalize (NULL while a job is unfinished).
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
       count(*) FILTER (WHERE status = 'DEAD') AS dead,
       coalesce(sum(attempts), 0) AS attempts,
       CASE WHEN bool_and(finalized_at IS NOT NULL)
            THEN extract(epoch FROM max(finalized_at) - min(created_at))::float8 END AS seconds
FROM jobs;

-- name: job_bench_reclaim_lag
-- For each reclaimed attempt: seconds between the previous lease's expiry and the reclaim (kill -9 runs).
SELECT b.job_id, b.attempt,
       extract(epoch FROM b.claimed_at - a.lease_expires_at)::float8 AS reclaim_lag_seconds
FROM job_attempts a
JOIN job_attempts b ON b.job_id = a.job_id AND b.attempt = a.attempt + 1
WHERE a.outcome = 'expired'
ORDER BY b.job_id, b.attempt;

-- name: job_insert_finished_history
-- A finished past: `jobs` no-op jobs SUCCEEDED two days ago, each with its attempt, as a queue that never
-- pruned would hold them; created a millisecond apart, oldest first.
WITH inserted AS (
    INSERT INTO jobs (kind, payload, status, attempts, created_at, updated_at, finalized_at)
    SELECT 'noop', '{}', 'SUCCEEDED', 1, now() - interval '3 days' + n * interval '1 millisecond',
           now() - interval '2 days', now() - interval '2 days'
    FROM generate_series(1, %(jobs)s) AS n
    RETURNING id, created_at
), attempt AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, finished_at, outcome)
    SELECT id, 1, 'history', gen_random_uuid(), created_at, created_at, 'succeeded' FROM inserted
)
SELECT count(*) AS jobs FROM inserted;

-- name: job_bench_middle_position
-- The listing's position halfway down: where a client paging through the history would be.
SELECT created_at, id FROM jobs ORDER BY created_at DESC, id DESC OFFSET %(offset)s LIMIT 1;
