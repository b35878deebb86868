-- Named queries over the queue's tables (sql/migrations/queue/), loaded by reliableq/sql.py.
-- Conventions: `%(now)s` is NULL in production and PostgreSQL's now() is used; tests may pass an
-- explicit time through the same query. `%(fenced)s` is the fencing switch: when true, an update
-- that changes ownership-sensitive state only applies for the current lease token.

-- name: job_insert
-- Store one submitted job; returns the job. Its row is its submission's record (job_events_of).
INSERT INTO jobs (id, kind, payload, max_attempts, tenant)
VALUES (%(job_id)s, %(kind)s, %(payload)s, %(max_attempts)s, %(tenant)s)
RETURNING *;

-- name: job_insert_batch
-- Store many submitted jobs in one statement (so one commit, and all or nothing), given as one JSON
-- document (the fragment submitted_jobs). Returns no rows: the caller drew the ids, and reading every row
-- back cost more than storing it (`reliableq bench`).
INSERT INTO jobs (id, kind, payload, max_attempts, tenant)
SELECT id, kind, payload, max_attempts, tenant
FROM
-- include: submitted_jobs
ORDER BY position;

-- fragment: submitted_jobs
-- A batch's jobs as rows `s`, `position` their place in it, from one JSON array of objects (id, kind,
-- payload, max_attempts, tenant; key and fingerprint for a job with an idempotency key): the client
-- encodes the whole batch in one call, where an array per field cost psycopg a Python call per element,
-- most of the client's CPU for a batch of 100 (reliableq/queue.py batch_document).
ROWS FROM (jsonb_to_recordset(%(jobs)s::jsonb) AS (id uuid, kind text, payload jsonb, max_attempts integer,
                                                   tenant text, key text, fingerprint text))
     WITH ORDINALITY AS s(id, kind, payload, max_attempts, tenant, key, fingerprint, position)

-- name: job_insert_keyed_batch
-- Store submitted jobs, some with a client's idempotency key, in one statement, from one JSON document
-- (the fragment submitted_jobs; key and fingerprint NULL for a job without a key). A key takes its job
-- only if no other job holds it within the window; a job whose key is held is not stored
-- (job_submission_keys_held then says whose it is). Concurrent statements with one key store one job: the second waits for the first's
-- commit and finds the key held. Returns, per input position, whether its job was stored.
WITH submitted AS (
    SELECT * FROM
-- include: submitted_jobs
), keyed AS (
    INSERT INTO job_submission_keys AS held (key, job_id, fingerprint)
    -- In key order: two statements holding the same keys lock them in one order, so neither deadlocks.
    SELECT key, id, fingerprint FROM submitted WHERE key IS NOT NULL ORDER BY key
    ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, fingerprint = EXCLUDED.fingerprint,
                                    created_at = now()
        WHERE held.created_at < now() - make_interval(secs => %(window_seconds)s)
    RETURNING job_id
), inserted AS (
    INSERT INTO jobs (id, kind, payload, max_attempts, tenant)
    SELECT id, kind, payload, max_attempts, tenant FROM submitted
    WHERE key IS NULL OR id IN (SELECT job_id FROM keyed)
    ORDER BY position
    RETURNING id
), event AS (
    -- A keyed job's submission is an event too: its key outlives the window only here.
    INSERT INTO job_events (job_id, event, detail)
    SELECT id, 'submitted', 'idempotency key ' || key
    FROM submitted WHERE key IS NOT NULL AND id IN (SELECT id FROM inserted)
)
SELECT id, id IN (SELECT id FROM inserted) AS stored FROM submitted ORDER BY position;

-- name: job_submission_keys_held
-- The job each of these keys names, what its first request asked for, and the job's status now.
SELECT held.key, held.job_id, held.fingerprint, jobs.status
FROM job_submission_keys AS held JOIN jobs ON jobs.id = held.job_id
WHERE held.key = ANY(%(keys)s::text[]);

-- name: job_select_due
-- Due jobs, read without a lock (stage `skip-locked` off): two claimers can read the same rows.
SELECT id FROM jobs
WHERE (status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now()))
   OR (%(reclaim_expired)s AND status = 'RUNNING'
       AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
       AND (NOT %(enforce_budget)s OR attempts < max_attempts))
ORDER BY run_at, id
LIMIT %(limit)s;

-- name: job_mark_claimed
-- Take the given jobs: RUNNING, one more attempt, a fresh lease token and an expiry from
-- PostgreSQL's clock (NULL without leases); closes the expired attempt and opens a new one.
WITH previous AS (
    SELECT id, lease_token FROM jobs WHERE id = ANY(%(ids)s::uuid[]) AND status = 'RUNNING'
), expired AS (
    UPDATE job_attempts AS a
    SET outcome = 'expired', finished_at = coalesce(%(now)s::timestamptz, now())
    FROM previous
    WHERE a.lease_token = previous.lease_token AND (a.outcome IS NULL OR a.outcome = 'lost_renew')
), claimed AS (
    UPDATE jobs
    SET status = 'RUNNING',
        attempts = attempts + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = coalesce(%(now)s::timestamptz, now())
                           + make_interval(secs => %(lease_seconds)s::float8),
        worker_id = %(worker_id)s,
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = ANY(%(ids)s::uuid[])
    RETURNING *
), opened AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, lease_expires_at)
    SELECT id, attempts, worker_id, lease_token, updated_at, lease_expires_at FROM claimed
)
SELECT * FROM claimed ORDER BY run_at, id;

-- name: job_claim_due_skip_locked
-- Due jobs, locked for this statement's transaction (jobs other claimers hold are skipped, not waited
-- for), taken as job_mark_claimed takes them: one round trip, one commit. Compare job_select_due.
WITH due AS (
    SELECT id, status, lease_token FROM jobs
    WHERE (status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now()))
       OR (%(reclaim_expired)s AND status = 'RUNNING'
           AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
           AND (NOT %(enforce_budget)s OR attempts < max_attempts))
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
-- include: take_the_due_jobs

-- fragment: take_the_due_jobs
-- What a claim does with the jobs it locked (`due`: id, status, lease_token): closes the attempt of each
-- whose lease ran out, takes each (RUNNING, one more attempt, a fresh lease token, an expiry from
-- PostgreSQL's clock) and opens its attempt. The end of job_claim_due_skip_locked and job_claim_due_fair.
), expired AS (
    UPDATE job_attempts AS a
    SET outcome = 'expired', finished_at = coalesce(%(now)s::timestamptz, now())
    FROM due
    WHERE due.status = 'RUNNING' AND a.lease_token = due.lease_token
      AND (a.outcome IS NULL OR a.outcome = 'lost_renew')
), claimed AS (
    UPDATE jobs
    SET status = 'RUNNING',
        attempts = jobs.attempts + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = coalesce(%(now)s::timestamptz, now())
                           + make_interval(secs => %(lease_seconds)s::float8),
        worker_id = %(worker_id)s,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM due
    WHERE jobs.id = due.id
    RETURNING jobs.*
), opened AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, lease_token, claimed_at, lease_expires_at)
    SELECT id, attempts, worker_id, lease_token, updated_at, lease_expires_at FROM claimed
)
SELECT * FROM claimed ORDER BY run_at, id;

-- name: job_claim_due_fair
-- Due jobs taken tenant by tenant in turn (the fairness mechanism): every tenant with due work is offered
-- its oldest due job before any is offered a second, and each claim starts its round one tenant further
-- on (a sequence numbers the claims, so none waits for another to take its turn). So a tenant's backlog
-- cannot hold back another tenant's job: a claim of L jobs reaches any waiting tenant within K claims
-- (K tenants with due work), however long the queues, while the tenants waiting stay the same. Each one
-- arriving or running out moves every place in the round, and may cost a waiting tenant one round more
-- (tenants coming and going in step with the turns could pass one over for as long as they keep it up). Work-conserving: slots no other tenant can fill
-- go to the tenants with more due, and slots racing claims leave empty to the oldest due jobs. Leases that ran out are taken first, as in job_claim_due_skip_locked;
-- still one statement, locked rows skipped, leased and fenced alike.
WITH RECURSIVE tenant_steps AS (
    -- Stepping from one tenant with a due job to the next in jobs_pending_tenant_run_at: one probe per
    -- tenant, never a scan of anyone's backlog. The last step finds none (NULL).
    (SELECT tenant FROM jobs
     WHERE status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now())
     ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT later.tenant FROM jobs AS later
            WHERE later.status = 'PENDING' AND later.run_at <= coalesce(%(now)s::timestamptz, now())
              AND later.tenant > tenant_steps.tenant
            ORDER BY later.tenant LIMIT 1)
    FROM tenant_steps WHERE tenant_steps.tenant IS NOT NULL
), waiting AS (
    -- The tenants with a due job, one row each.
    SELECT tenant FROM tenant_steps WHERE tenant IS NOT NULL
), turn AS MATERIALIZED (
    -- This claim's number: one more than the claim before it, whichever worker made that one.
    SELECT nextval('job_claim_turns') AS number
), lined_up AS (
    SELECT tenant, row_number() OVER (ORDER BY tenant) - 1 AS position, count(*) OVER () AS tenants
    FROM waiting
), served AS (
    -- This claim's round: from the turn's place among the waiting tenants, once round, as far as it fits.
    SELECT tenant, (position - turn.number %% tenants + tenants) %% tenants AS place
    FROM lined_up, turn
    ORDER BY place
    LIMIT %(limit)s
), offered AS (
    -- Each served tenant's oldest due jobs, locked, locked ones skipped: a claim racing this one takes the
    -- next of the same tenant's. Those past this claim's share stay locked only until it commits.
    SELECT pick.id, pick.status, pick.lease_token, served.place,
           row_number() OVER (PARTITION BY served.tenant ORDER BY pick.run_at, pick.id) AS nth
    FROM served CROSS JOIN LATERAL (
        SELECT id, status, lease_token, run_at FROM jobs
        WHERE jobs.tenant = served.tenant AND jobs.status = 'PENDING'
          AND jobs.run_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS pick
), lapsed AS (
    -- Leases that ran out, owed first (as in job_claim_due_skip_locked).
    SELECT id, status, lease_token FROM jobs
    WHERE %(reclaim_expired)s AND status = 'RUNNING'
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
      AND (NOT %(enforce_budget)s OR attempts < max_attempts)
    ORDER BY lease_expires_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), spare AS (
    -- The slots the round leaves empty, given to the oldest due jobs of anyone. The round leaves one empty
    -- only when racing claims hold the served tenants' due jobs; without this a claim could come back
    -- empty while another tenant's jobs wait. Nothing is read or locked when no slot is empty.
    SELECT id, status, lease_token FROM jobs
    WHERE status = 'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND id NOT IN (SELECT id FROM offered)
    ORDER BY run_at, id
    LIMIT (SELECT greatest(%(limit)s - count(*), 0)
           FROM (SELECT id FROM lapsed UNION ALL SELECT id FROM offered) AS offered_first)
    FOR UPDATE SKIP LOCKED
), due AS (
    -- Each tenant's first before anyone's second, in the round's order; then the spare.
    SELECT id, status, lease_token FROM (
        SELECT id, status, lease_token, 0 AS nth, 0 AS place FROM lapsed
        UNION ALL
        SELECT id, status, lease_token, nth, place FROM offered
        UNION ALL
        SELECT id, status, lease_token, %(limit)s + 1 AS nth, 0 AS place FROM spare
    ) AS candidates
    ORDER BY nth, place
    LIMIT %(limit)s
-- include: take_the_due_jobs

-- name: job_dead_expired_exhausted
-- Jobs whose lease ran out on their final attempt become DEAD instead of being claimed again.
WITH exhausted AS (
    UPDATE jobs
    SET status = 'DEAD', finalized_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now()),
        last_error = 'lease expired on attempt ' || attempts || ' of ' || max_attempts
    WHERE id IN (
        SELECT id FROM jobs
        WHERE status = 'RUNNING' AND attempts >= max_attempts
          AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, lease_token
)
UPDATE job_attempts AS a
SET outcome = 'expired', finished_at = coalesce(%(now)s::timestamptz, now())
FROM exhausted
WHERE a.lease_token = exhausted.lease_token AND (a.outcome IS NULL OR a.outcome = 'lost_renew');

-- name: job_renew_lease
-- Push a live lease's expiry forward; returns whether this owner still holds it. A lease that ran out is
-- never revived, even when nobody has reclaimed the job yet: a fleet claim may already have counted its
-- slot as free. clock_timestamp(), not now(): a renewal may have waited for the fleet gate (see
-- job_fleet_renewal_gate) since its transaction began.
WITH renewed AS (
    UPDATE jobs
    SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s::float8),
        updated_at = clock_timestamp()
    WHERE id = %(job_id)s AND lease_expires_at > clock_timestamp()
      AND (NOT %(fenced)s OR (status = 'RUNNING' AND lease_token = %(lease_token)s))
    RETURNING lease_expires_at
), recorded AS (
    UPDATE job_attempts
    SET lease_expires_at = coalesce((SELECT lease_expires_at FROM renewed), lease_expires_at),
        outcome = CASE WHEN EXISTS (SELECT 1 FROM renewed) THEN outcome
                       ELSE coalesce(outcome, 'lost_renew') END
    WHERE lease_token = %(lease_token)s
)
SELECT EXISTS (SELECT 1 FROM renewed) AS won;

-- name: job_succeed
-- Finalize claims as SUCCEEDED, many in one statement (the worker groups the successes that finish
-- together into one commit); each attempt records `succeeded`, or `lost_succeed` when fenced out.
-- Returns, in the order given, whether each claim won. Wins are attributed per claim (job and lease
-- token), never per job: a stale owner's success in the same group as the current owner's must lose,
-- though the job it names was finalized. Without fencing every claim's blind write lands.
WITH owned AS (
    -- claims_given: the arrays as rows (sql/migrations/queue/0008 says why not unnest).
    SELECT job_id, lease_token, given_order AS position
    FROM claims_given(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[])
), locked AS (
    -- The group's rows locked in id order first: two groups sharing jobs (two owners with fencing off,
    -- a stale and a current owner with it on) then wait for each other instead of deadlocking.
    SELECT id FROM jobs WHERE id IN (SELECT job_id FROM owned) ORDER BY id FOR UPDATE
), finalized AS (
    UPDATE jobs
    SET status = 'SUCCEEDED', finalized_at = now(), updated_at = now(), lease_expires_at = NULL,
        last_error = NULL
    FROM owned
    WHERE jobs.id = owned.job_id AND jobs.id IN (SELECT id FROM locked)
      AND (NOT %(fenced)s OR (jobs.status = 'RUNNING' AND jobs.lease_token = owned.lease_token))
    RETURNING jobs.id, jobs.lease_token
), won AS (
    SELECT owned.position, owned.lease_token,
           EXISTS (SELECT 1 FROM finalized f
                   WHERE f.id = owned.job_id AND (NOT %(fenced)s OR f.lease_token = owned.lease_token)) AS won
    FROM owned
), recorded AS (
    UPDATE job_attempts AS a
    SET finished_at = clock_timestamp(), outcome = CASE WHEN won.won THEN 'succeeded' ELSE 'lost_succeed' END
    FROM won
    WHERE a.lease_token = won.lease_token AND a.outcome IS DISTINCT FROM 'succeeded'
      AND a.outcome IS DISTINCT FROM 'retried' AND a.outcome IS DISTINCT FROM 'dead'
)
SELECT won FROM won ORDER BY position;

-- name: job_retry
-- Back to PENDING, due `delay_seconds` after PostgreSQL's now(); fenced like every finalize. The attempt
-- records the delay when its retry won: the wait it put before the next attempt.
WITH finalized AS (
    UPDATE jobs
    SET status = 'PENDING', run_at = now() + make_interval(secs => %(delay_seconds)s::float8),
        updated_at = now(), lease_expires_at = NULL, last_error = %(error)s
    WHERE id = %(job_id)s
      AND (NOT %(fenced)s OR (status = 'RUNNING' AND lease_token = %(lease_token)s))
    RETURNING id
), recorded AS (
    UPDATE job_attempts
    SET finished_at = clock_timestamp(), error = %(error)s,
        outcome = CASE WHEN EXISTS (SELECT 1 FROM finalized) THEN 'retried' ELSE 'lost_retry' END,
        retry_delay_seconds = CASE WHEN EXISTS (SELECT 1 FROM finalized) THEN %(delay_seconds)s::float8 END
    WHERE lease_token = %(lease_token)s AND outcome IS DISTINCT FROM 'succeeded'
      AND outcome IS DISTINCT FROM 'retried' AND outcome IS DISTINCT FROM 'dead'
)
SELECT EXISTS (SELECT 1 FROM finalized) AS won;

-- name: job_dead
-- Finalize as DEAD with a sanitised error, for an operator to inspect and replay.
WITH finalized AS (
    UPDATE jobs
    SET status = 'DEAD', finalized_at = now(), updated_at = now(), lease_expires_at = NULL,
        last_error = %(error)s
    WHERE id = %(job_id)s
      AND (NOT %(fenced)s OR (status = 'RUNNING' AND lease_token = %(lease_token)s))
    RETURNING id
), recorded AS (
    UPDATE job_attempts
    SET finished_at = clock_timestamp(), error = %(error)s,
        outcome = CASE WHEN EXISTS (SELECT 1 FROM finalized) THEN 'dead' ELSE 'lost_dead' END
    WHERE lease_token = %(lease_token)s AND outcome IS DISTINCT FROM 'succeeded'
      AND outcome IS DISTINCT FROM 'retried' AND outcome IS DISTINCT FROM 'dead'
)
SELECT EXISTS (SELECT 1 FROM finalized) AS won;

-- name: job_replay
-- DEAD -> PENDING, same id and idempotency key, a fresh budget of attempts; recorded as an event.
WITH replayed AS (
    UPDATE jobs
    SET status = 'PENDING', run_at = now(), updated_at = now(), finalized_at = NULL,
        max_attempts = attempts + %(budget)s, last_error = NULL
    WHERE id = %(job_id)s AND status = 'DEAD'
    RETURNING *
), event AS (
    INSERT INTO job_events (job_id, event, detail)
    SELECT id, 'replayed', (SELECT last_error FROM jobs WHERE id = %(job_id)s) FROM replayed
)
SELECT * FROM replayed;

-- name: job_get
-- One job by id.
SELECT * FROM jobs WHERE id = %(job_id)s;

-- name: job_attempts_of
-- The claims of one job, oldest first.
SELECT attempt, worker_id, lease_token, claimed_at, lease_expires_at, finished_at, outcome, error,
       retry_delay_seconds
FROM job_attempts WHERE job_id = %(job_id)s ORDER BY attempt, id;

-- name: job_events_of
-- The submission and replays of one job, oldest first. A submission without a key writes no event: the
-- job's row records it (created_at), and the 100 event rows of a batch were half its server time. One
-- with a key has its event (the key in its detail), as have older jobs, whatever their key.
SELECT at, event, detail FROM (
    SELECT created_at AS at, 'submitted' AS event, NULL AS detail, 0 AS id FROM jobs
    WHERE id = %(job_id)s
      AND NOT EXISTS (SELECT 1 FROM job_events WHERE job_id = %(job_id)s AND event = 'submitted')
    UNION ALL
    SELECT at, event, detail, id FROM job_events WHERE job_id = %(job_id)s
) AS history
ORDER BY at, id;

-- name: job_list
-- A page of jobs, newest first, optionally of one status: those strictly after the position
-- (`before_created_at`, `before_id`) in (created_at, id) descending order; NULLs for the first page. A keyset, not an offset: a job inserted between pages sorts before
-- the position (newer), or after it if its transaction began earlier; either way it shifts no page, so
-- none repeats or skips a job that was there. The caller asks for one row more than a page to learn
-- whether another follows.
SELECT * FROM jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (created_at, id) < (coalesce(%(before_created_at)s::timestamptz, 'infinity'),
                          coalesce(%(before_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: job_count_by_status
-- How many jobs are in each status.
SELECT status, count(*) AS jobs FROM jobs GROUP BY status ORDER BY status;

-- name: transaction_statement_timeout
-- Bound the rest of this transaction's statements (a scrape's count), in milliseconds, as text.
SELECT set_config('statement_timeout', %(milliseconds)s, true);

-- name: worker_idle
-- This worker found nothing to claim: submissions notify again until `seconds` from now
-- (idle_workers in sql/migrations/queue/0001_schema.sql). Returns whether its mark was live before this
-- one: if not (a new mark, or one that ran out), a submission may have found nobody idle, and the worker
-- claims once more.
-- Marks that ran out an hour ago (their workers were killed) are cleared on the way.
WITH previous AS (
    SELECT until > clock_timestamp() AS live FROM idle_workers WHERE worker_id = %(worker_id)s
), ran_out AS (
    DELETE FROM idle_workers WHERE until < clock_timestamp() - interval '1 hour' AND worker_id <> %(worker_id)s
), marked AS (
    INSERT INTO idle_workers (worker_id, until)
    VALUES (%(worker_id)s, clock_timestamp() + make_interval(secs => %(seconds)s))
    ON CONFLICT (worker_id) DO UPDATE SET until = EXCLUDED.until
)
SELECT coalesce((SELECT live FROM previous), false) AS was_live;

-- name: worker_busy
-- This worker has work again, or stops: its submissions need not notify on its account.
DELETE FROM idle_workers WHERE worker_id = %(worker_id)s;

-- name: session_commits_wait_for_standby
-- What each of the API's sessions runs first with sync_standby on: a commit returns once a synchronous
-- standby (if the server names one) has flushed its WAL, so a 202 survives the primary's death. Set per
-- session, not left to the server's configuration, which may say `local` for speed.
SET synchronous_commit = on;

-- name: session_commits_local
-- ... and with sync_standby off: a commit returns once the primary alone has flushed it.
SET synchronous_commit = local;

-- name: database_now
-- PostgreSQL's clock, the only clock eligibility and leases are measured by.
SELECT now() AS now;

-- name: database_commit
-- The readiness check: a transaction that writes commits. Its commit waits for a synchronous standby as a
-- submission's does; a SELECT 1 would answer while every write is blocked.
UPDATE readiness_probe SET probed_at = now();

-- name: job_fleet_claim_gate
-- A fleet-wide limit (issue: many workers, one database): serialise claims for the rest of this
-- transaction, so that counting the jobs in flight and taking new ones cannot interleave between workers.
-- Tried, never waited for: PostgreSQL's lock queue is fair, so a claim queued behind a renewal holding
-- the gate (job_fleet_renewal_gate) would make every later renewal queue behind the claim, and healthy
-- workers' leases would run out meanwhile. `taken`: false when another claim or a renewal holds it.
SELECT pg_try_advisory_xact_lock(hashtext('reliableq fleet claim')) AS taken;

-- name: job_fleet_free_slots
-- How many more jobs the whole fleet may run: the limit minus the RUNNING jobs whose lease is live.
-- A crashed worker's jobs stop counting when their leases expire: its slots come back by themselves.
-- Measured at clock_timestamp(), the clock job_renew_lease checks leases by, rather than the
-- transaction's start. `at` is that time, for the claim that follows.
SELECT greatest(%(fleet_limit)s - count(*), 0) AS free,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS at
FROM jobs
WHERE status = 'RUNNING' AND lease_expires_at > coalesce(%(now)s::timestamptz, clock_timestamp());

-- name: job_fleet_renewal_gate
-- A renewal under a fleet limit: share the claim gate for the rest of this transaction, so that no fleet
-- claim counts live leases while a renewal is between its check of the lease and its commit (the claim
-- would read the lease as run out, and the renewal would then revive it: one job too many).
SELECT pg_advisory_xact_lock_shared(hashtext('reliableq fleet claim'));

-- name: job_attempt_finalize_recorded
-- The finalize this claim committed, if any: the operation (succeed, retry, dead) and whether it won.
-- `expired` and `lost_renew` are not finalizes: a finalize overwrites them.
SELECT CASE WHEN outcome IN ('succeeded', 'lost_succeed') THEN 'succeed'
            WHEN outcome IN ('retried', 'lost_retry') THEN 'retry'
            WHEN outcome IN ('dead', 'lost_dead') THEN 'dead' END AS operation,
       outcome IN ('succeeded', 'retried', 'dead') AS won
FROM job_attempts WHERE lease_token = %(lease_token)s;

-- name: job_claimed_with_success
-- The jobs still leased to `worker_id` that the commit which finalized the claim `lease_token` made (a
-- success and the next claim commit together: queue.succeed_and_claim). Rows one transaction wrote share
-- its xmin: the finalize writes its attempt's row whether it won or lost (the job's row only if it won),
-- and each claim opens an attempt's row; neither is written again before the worker that lost the answer
-- asks (nobody renews a claim nobody runs).
SELECT claimed.* FROM job_attempts AS finalized, job_attempts AS opened
JOIN jobs AS claimed ON claimed.lease_token = opened.lease_token
WHERE finalized.lease_token = %(lease_token)s
  AND opened.xmin = finalized.xmin AND opened.lease_token <> finalized.lease_token
  AND claimed.status = 'RUNNING' AND claimed.worker_id = %(worker_id)s;

-- name: job_prune_finalized
-- Retention: delete up to `batch` jobs of `statuses` (SUCCEEDED; DEAD only when an operator asks)
-- finalized more than `older_than_seconds` ago, oldest first; their attempts, events and submission keys
-- go with them (ON DELETE CASCADE). SKIP LOCKED: a row a worker, a replay or a finalize holds is left for
-- a later pass, never waited for, and the pruner's own short lock makes them wait at most one batch.
-- A job whose client key is still inside the API's idempotency window stays, so that a retry of its
-- submission finds it rather than making a second job. A pass walks (created_at, id) upwards from where
-- its last batch ended (`after_created_at`, `after_id`; NULLs for its first): starting each batch from
-- the oldest row again would re-read every entry the pass already deleted, not yet vacuumed, and a
-- pass over a million jobs would slow batch by batch. `created_at` bounds the scan of jobs_created_id
-- (a job is created before it is finalized), so no index on finalized_at is needed.
-- Returns how many went, per status, and where the batch ended (NULL when it took nothing).
WITH doomed AS (
    SELECT id, created_at FROM jobs
    WHERE status = ANY(%(statuses)s::text[])
      AND (created_at, id) > (coalesce(%(after_created_at)s::timestamptz, '-infinity'),
                              coalesce(%(after_id)s::uuid, '00000000-0000-0000-0000-000000000000'))
      AND created_at < now() - make_interval(secs => %(older_than_seconds)s)
      AND finalized_at < now() - make_interval(secs => %(older_than_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM job_submission_keys AS held
                      WHERE held.job_id = jobs.id
                        AND held.created_at >= now() - make_interval(secs => %(window_seconds)s))
    ORDER BY created_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING status
), last AS (
    SELECT created_at, id FROM doomed ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM deleted WHERE status = 'SUCCEEDED') AS succeeded,
       (SELECT count(*) FROM deleted WHERE status = 'DEAD') AS dead,
       (SELECT created_at FROM last) AS last_created_at, (SELECT id FROM last) AS last_id;
