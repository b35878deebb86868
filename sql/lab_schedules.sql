-- Named queries of the exercises' forced schedules (reliableq/lab/exercises/schedules.py) over the queue's
-- tables (sql/queue_schema.sql), loaded by reliableq/sql.py. They run only on a check's scratch database:
-- they put jobs in the states a schedule needs, on the database's own clock, and hold or release the
-- statements under test at the moment the schedule chooses. The queue never runs them.

-- name: lab_barrier_install
-- A barrier in front of every update of a job row: the update waits, its row already locked, until the
-- check that holds the barrier (lab_barrier_close) lets go. Statements that read the jobs before any of
-- them updates one are thereby held at the same moment. Shared in the trigger, so released they all pass.
CREATE OR REPLACE FUNCTION reliableq_lab_barrier() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('reliableq lab barrier'));
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER jobs_lab_barrier BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION reliableq_lab_barrier();

-- name: lab_barrier_remove
-- The barrier taken out again: later schedules on the same database update jobs freely.
DROP TRIGGER IF EXISTS jobs_lab_barrier ON jobs;

-- name: lab_barrier_close
-- Hold the barrier (for this session, until lab_barrier_open): every job update waits at it.
SELECT pg_advisory_lock(hashtext('reliableq lab barrier'));

-- name: lab_barrier_open
-- Let every update waiting at the barrier go on.
SELECT pg_advisory_unlock(hashtext('reliableq lab barrier'));

-- name: lab_session_blockers
-- The backend pids the session with backend pid %(pid)s is waiting for (empty: it is not waiting).
SELECT pg_blocking_pids(%(pid)s) AS blockers;

-- name: lab_jobs_clear
-- Every job, its claims and events gone (ON DELETE CASCADE): the next schedule starts from nothing.
DELETE FROM jobs;

-- name: lab_job_put
-- Put one job in the state a schedule needs, times measured from PostgreSQL's now() (the check's clock):
-- status, attempts of a budget, due `run_in_seconds` from now, a lease running out `lease_in_seconds`
-- from now (NULL: none; negative: ran out that long ago), with a fresh token and the open claim of it on
-- record, as a claim would have left them. Returns the job.
WITH put AS (
    UPDATE jobs
    SET status = %(status)s, attempts = %(attempts)s, max_attempts = %(max_attempts)s,
        run_at = now() + make_interval(secs => %(run_in_seconds)s::float8),
        lease_token = CASE WHEN %(status)s = 'PENDING' THEN NULL ELSE gen_random_uuid() END,
        lease_expires_at = now() + make_interval(secs => %(lease_in_seconds)s::float8),
        worker_id = CASE WHEN %(status)s = 'PENDING' THEN NULL ELSE %(worker_id)s END,
        finalized_at = CASE WHEN %(status)s IN ('SUCCEEDED', 'DEAD') THEN now() END
    WHERE id = %(job_id)s
    RETURNING *
), opened AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, lease_expires_at)
    SELECT id, attempts, worker_id, lease_token, now(), lease_expires_at FROM put WHERE lease_token IS NOT NULL
)
SELECT * FROM put;

-- name: lab_job_lease_run_out
-- The lease of the claim with %(lease_token)s ran out %(ago_seconds)s ago, on the check's clock: written
-- into the job and the claim's record, so that no schedule waits for a lease to expire.
WITH job AS (
    UPDATE jobs SET lease_expires_at = now() - make_interval(secs => %(ago_seconds)s::float8)
    WHERE lease_token = %(lease_token)s
    RETURNING lease_expires_at
)
UPDATE job_attempts SET lease_expires_at = (SELECT lease_expires_at FROM job)
WHERE lease_token = %(lease_token)s;
