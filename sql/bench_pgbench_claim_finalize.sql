-- pgbench script (reliableq bench): claim one due job (SKIP LOCKED, with a lease token) and finalize
-- it with a fenced update: two statements, two commits, the floor under one job's claim+finalize
-- on the queue's table. Needs preloaded PENDING jobs; run with -M prepared (variables as parameters).
WITH due AS (
    SELECT id FROM jobs
    WHERE status = 'PENDING' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs
SET status = 'RUNNING', attempts = jobs.attempts + 1, lease_token = gen_random_uuid(),
    lease_expires_at = now() + interval '30 seconds', updated_at = now()
FROM due WHERE jobs.id = due.id
RETURNING jobs.id AS job_id, jobs.lease_token AS token \gset
UPDATE jobs
SET status = 'SUCCEEDED', finalized_at = now(), updated_at = now(), lease_expires_at = NULL
WHERE id = :job_id AND status = 'RUNNING' AND lease_token = :token;
