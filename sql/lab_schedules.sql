-- Named queries of the exercises' forced schedules (reliableq/lab/exercises/schedules.py) over the queue's
-- tables (sql/migrations/queue/), loaded by reliableq/sql.py. They run only on a check's scratch database:
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
-- record (its outcome %(outcome)s: NULL while open), as a claim would have left them. The token is
-- %(lease_token)s (a fresh one if NULL): a schedule orders its tokens so that a claim comparing tokens by
-- anything but `=` meets another job's claim. Returns the job.
WITH put AS (
    UPDATE jobs
    SET status = %(status)s, attempts = %(attempts)s, max_attempts = %(max_attempts)s,
        run_at = now() + make_interval(secs => %(run_in_seconds)s::float8),
        lease_token = CASE WHEN %(status)s = 'PENDING' THEN NULL
                           ELSE coalesce(%(lease_token)s::uuid, gen_random_uuid()) END,
        lease_expires_at = now() + make_interval(secs => %(lease_in_seconds)s::float8),
        worker_id = CASE WHEN %(status)s = 'PENDING' THEN NULL ELSE %(worker_id)s END,
        finalized_at = CASE WHEN %(status)s IN ('SUCCEEDED', 'DEAD') THEN now() END
    WHERE id = %(job_id)s
    RETURNING *
), opened AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, lease_expires_at, outcome)
    SELECT id, attempts, worker_id, lease_token, now(), lease_expires_at, %(outcome)s::text
    FROM put WHERE lease_token IS NOT NULL
)
SELECT * FROM put;

-- name: lab_clock
-- The transaction's now() and the moment of asking: a claim run in this transaction read its clock
-- between the two.
SELECT now() AS now, clock_timestamp() AS clock;

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

-- name: lab_jobs_hold_shared
-- Lock the jobs %(ids)s FOR SHARE until this transaction ends: what a claim whose lock claimers can share
-- holds once it has read them and before it writes them.
SELECT id FROM jobs WHERE id = ANY(%(ids)s::uuid[]) FOR SHARE;

-- name: lab_jobs_hold
-- Lock the jobs %(ids)s FOR UPDATE until this transaction ends: what a racing claim holds between reading
-- them and committing.
SELECT id FROM jobs WHERE id = ANY(%(ids)s::uuid[]) FOR UPDATE;

-- name: lab_bystanders
-- Two jobs another worker runs under live leases, beside a schedule's job: ids and tokens the lowest and
-- the highest a uuid can be, so that an owner's write matching its job or claim by `<`, `<=`, `>`, `>=`
-- or `<>` instead of `=` (or by nothing) reaches one of them, every time. Their claims are on record, open.
WITH put AS (
    INSERT INTO jobs (id, payload, status, attempts, lease_token, lease_expires_at, worker_id)
    SELECT id, '{"amount_cents": 1, "currency": "USD"}'::jsonb, 'RUNNING', 1, id, now() + interval '1 hour',
           'worker-2'
    FROM unnest(ARRAY['00000000-0000-0000-0000-000000000001',
                      'ffffffff-ffff-ffff-ffff-ffffffffffff']::uuid[]) AS b(id)
    RETURNING *
)
INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, lease_expires_at)
SELECT id, attempts, worker_id, lease_token, now(), lease_expires_at FROM put;

-- name: lab_bystanders_seen
-- The bystanders' jobs and claims as they are now, to compare before and after a write.
SELECT j.id, j.status, j.lease_token, j.lease_expires_at, j.run_at, j.last_error, j.finalized_at,
       a.outcome, a.error, a.finished_at, a.lease_expires_at AS claim_expires_at
FROM jobs AS j JOIN job_attempts AS a ON a.job_id = j.id
WHERE j.id IN ('00000000-0000-0000-0000-000000000001', 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY j.id;

-- name: lab_claim_retoken
-- The claim with %(old)s gets the token %(new)s, in the job and on record: a schedule orders a stale
-- claim's token below or above the current one's, so a token compared by anything but `=` is seen.
WITH job AS (
    UPDATE jobs SET lease_token = %(new)s WHERE lease_token = %(old)s
)
UPDATE job_attempts SET lease_token = %(new)s WHERE lease_token = %(old)s;

-- name: lab_jobs_in_flight
-- %(n)s jobs another worker runs under live leases (an hour long): a busy queue. With this many RUNNING,
-- PostgreSQL walks a group of claims in the order given, fetching each job by its key, rather than
-- reading the few RUNNING jobs by status (in the order they were made); so two groups given the same
-- jobs in opposite orders reach them in opposite orders. Run lab_jobs_analyze after it.
INSERT INTO jobs (payload, status, attempts, lease_token, lease_expires_at, worker_id)
SELECT jsonb_build_object('amount_cents', n, 'currency', 'USD'), 'RUNNING', 1, gen_random_uuid(),
       now() + interval '1 hour', 'worker-2'
FROM generate_series(1, %(n)s) AS n;

-- name: lab_jobs_analyze
-- The jobs table's statistics brought up to date, so the planner sees what a schedule laid out.
ANALYZE jobs;

-- name: lab_jobs_due_with_ids
-- New jobs with the ids %(ids)s, due now, as a submission makes them (without its event): a schedule
-- orders its jobs' ids as it needs them (a lock taken row by row in id order reaches them in that order).
INSERT INTO jobs (id, payload)
SELECT id, '{"amount_cents": 1000, "currency": "USD"}'::jsonb FROM unnest(%(ids)s::uuid[]) AS i (id);

-- name: lab_jobs_backlog
-- %(n)s due jobs of each tenant in %(tenants)s, in one statement, made %(ago_seconds)s ago a millisecond
-- apart (their run_at in that order): a backlog laid out at once, older than anything submitted after it.
-- Returned tenant by tenant, in that order.
INSERT INTO jobs (payload, tenant, run_at, created_at, updated_at)
SELECT jsonb_build_object('amount_cents', n, 'currency', 'USD'), owner.tenant, at, at, at
FROM unnest(%(tenants)s::text[]) WITH ORDINALITY AS owner (tenant, place),
     generate_series(1, %(n)s) AS n,
     LATERAL (SELECT now() - make_interval(secs => %(ago_seconds)s) + n * interval '1 millisecond' AS at) AS made
ORDER BY owner.place, n
RETURNING id;
