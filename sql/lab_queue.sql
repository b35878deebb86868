-- Named queries of the lab (reliableq/lab/) over the queue's tables (sql/migrations/queue/), loaded by
-- reliableq/sql.py: the ledger's counts, timelines and the invariant checks. Read-only, run after (or
-- beside) an experiment; the queue itself never runs them. An invariant query returns one row per
-- offending job or claim: empty means the invariant held.

-- name: job_ledger
-- Per job: status, attempts (A) and successful finalizations (F), for the lab's counts.
SELECT j.id AS job_id, j.status, j.attempts, j.max_attempts,
       (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id AND a.outcome = 'succeeded') AS finalizations
FROM jobs j ORDER BY j.created_at, j.id;

-- name: job_attempts_all
-- Every claim of every job, for timelines: who held it, from when, until when, and how it ended.
-- From when: recorded_at, the moment the claim's statement wrote the row. claimed_at is its transaction's
-- start, which for a claim committed with the success before it (queue.succeed_and_claim) precedes
-- that success's finished_at: drawn from it, a worker would seem to hold one job more than it did.
SELECT job_id, attempt, worker_id, recorded_at, lease_expires_at, finished_at, outcome, error
FROM job_attempts ORDER BY recorded_at, id;

-- name: job_invariant_unfinished
-- Jobs neither SUCCEEDED nor DEAD (after the system settled, each one is a violation).
SELECT id AS job_id, status, attempts FROM jobs WHERE status NOT IN ('SUCCEEDED', 'DEAD') ORDER BY id;

-- name: job_invariant_over_budget
-- Jobs that were attempted more often than their budget allows.
SELECT id AS job_id, attempts, max_attempts FROM jobs WHERE attempts > max_attempts ORDER BY id;

-- name: job_invariant_stale_finalize
-- Jobs finalized more than once, or finalized by an attempt that was no longer the latest owner.
-- A replay reopens a DEAD job: only the finalizes since the last replay count.
SELECT j.id AS job_id, count(*) AS terminal_finalizes, max(a.attempt) AS last_finalizing_attempt, j.attempts
FROM jobs j JOIN job_attempts a ON a.job_id = j.id AND a.outcome IN ('succeeded', 'dead')
WHERE a.finished_at > coalesce((SELECT max(e.at) FROM job_events e
                                WHERE e.job_id = j.id AND e.event = 'replayed'), '-infinity')
GROUP BY j.id, j.attempts
HAVING count(*) > 1 OR min(a.attempt) < j.attempts
ORDER BY j.id;

-- name: job_invariant_reclaimed_early
-- Claims taken while the previous owner's lease was still running (two owners at once). The later claim is
-- placed at the latest moment its decision can have been made: its row's recorded_at (the server's clock
-- as it wrote the row) or its claimed_at, if later (a test's claim with an explicit %(now)s in the future).
-- Its claimed_at alone is the start of its transaction: a claim reading clock_timestamp() may rightly take
-- a lease that ran out after that start, and must not be judged by the earlier moment.
SELECT a.job_id, a.attempt AS earlier_attempt, b.attempt AS later_attempt
FROM job_attempts a
JOIN job_attempts b ON b.job_id = a.job_id AND b.attempt = a.attempt + 1
CROSS JOIN LATERAL (SELECT greatest(b.claimed_at, b.recorded_at) AS at) AS claimed
WHERE a.lease_expires_at IS NOT NULL AND claimed.at < a.lease_expires_at
  AND (a.finished_at IS NULL OR a.finished_at > claimed.at OR a.outcome = 'expired')
ORDER BY a.job_id;

-- name: job_ids
-- The id of every stored job.
SELECT id AS job_id FROM jobs;

-- name: job_invariant_fleet_over_limit
-- Claims taken while the fleet's live leases already filled the limit. A claim's lease runs from its
-- claim until it expired (as last renewed) or was finalized, whichever came first; at each claim, count
-- the leases live at that instant, its own included.
SELECT c.job_id, c.worker_id, c.claimed_at, count(*) AS live_leases
FROM job_attempts c
JOIN job_attempts l ON l.claimed_at <= c.claimed_at
                   AND least(l.lease_expires_at, coalesce(l.finished_at, 'infinity')) > c.claimed_at
GROUP BY c.id, c.job_id, c.worker_id, c.claimed_at
HAVING count(*) > %(fleet_limit)s
ORDER BY c.claimed_at;

-- name: job_attempts_lost
-- Claims that lost their lease: reclaimed after it ran out, or refused at a renewal or a finalize.
SELECT job_id, attempt, worker_id, outcome FROM job_attempts
WHERE outcome IN ('expired', 'lost_renew', 'lost_succeed', 'lost_retry', 'lost_dead')
ORDER BY job_id, attempt;

-- name: job_attempt_outcomes_by_worker
-- Per worker, how many of its claims ended in each outcome, to compare with what each worker reported.
SELECT worker_id, outcome, count(*) AS claims FROM job_attempts GROUP BY worker_id, outcome ORDER BY worker_id, outcome;

-- name: lab_unsettled_within_budget
-- The unsettled jobs, and those of them that can still settle as they should: not yet claimed more
-- times than their budget.
SELECT count(*) AS unsettled, count(*) FILTER (WHERE attempts <= max_attempts) AS within_budget
FROM jobs WHERE status NOT IN ('SUCCEEDED', 'DEAD');

-- name: lab_stuck_jobs
-- What a timed-out wait reports: the unsettled jobs, who holds each and how long its lease has left.
SELECT id AS job_id, status, worker_id, attempts,
       round(extract(epoch FROM lease_expires_at - clock_timestamp())::numeric, 1) AS lease_left_seconds
FROM jobs WHERE status NOT IN ('SUCCEEDED', 'DEAD') ORDER BY created_at, id LIMIT 5;

-- name: lab_busy_sessions
-- ...and what the queue database's other sessions are doing (a lock wait, an idle open transaction).
SELECT pid, state, wait_event_type, wait_event, left(query, 80) AS query,
       round(extract(epoch FROM clock_timestamp() - state_change)::numeric, 1) AS for_seconds
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'
ORDER BY state_change LIMIT 10;

-- name: lab_hold_jobs
-- Lock the given jobs' rows as a claim's transaction would (until the transaction that ran this ends), so
-- that a scenario can make claims meet them at a moment of its choosing.
SELECT id FROM jobs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE;

-- name: lab_lock_waiters
-- How many of the queue database's sessions are waiting for a lock right now.
SELECT count(*) AS waiting FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock';

-- name: lab_session_blocked
-- Whether the session with backend pid %(pid)s is waiting for a lock another session holds.
SELECT cardinality(pg_blocking_pids(%(pid)s)) > 0 AS blocked;

-- name: jobs_by_description
-- Each job description with the jobs that carry it: the retrying client marks each of its requests
-- with its own description, so this says how many jobs each request made.
SELECT payload->>'description' AS description, array_agg(id ORDER BY created_at, id) AS job_ids
FROM jobs GROUP BY 1;

-- name: submission_keys_count
-- How many client idempotency keys the queue holds.
SELECT count(*) AS keys_held FROM job_submission_keys;

-- name: job_first_claims
-- Each job's first claim, in the order the claims were taken: whose job it was, when it was stored, when
-- claimed and by which worker (the jobs one claim took share its claimed_at and worker).
SELECT jobs.id AS job_id, jobs.tenant, jobs.created_at, a.claimed_at, a.worker_id
FROM jobs JOIN job_attempts AS a ON a.job_id = jobs.id AND a.attempt = 1
ORDER BY a.claimed_at, a.id;

-- name: job_first_claim_after
-- The first claim (of any attempt) after %(after)s: when a promoted server first handed out work.
SELECT min(claimed_at) AS claimed_at FROM job_attempts WHERE claimed_at > %(after)s;

-- name: job_attempt_shares_by_tenant
-- Per tenant, what the claims gave it while every tenant had a due job waiting (the contested stretch: from
-- the first claim at which each had one due and not yet claimed, to the last such claim): how many claims
-- (and retries among them) it got then, the worker-seconds its attempts spent in that stretch (claimed_at
-- to finished_at, clipped to it), their share, and the jobs it had in flight on average; and over the whole
-- run its jobs, claims, retries and mean seconds per claim. An attempt is due from its job's creation (the
-- first; a job submitted without a delay), else from its previous attempt's retry (finished_at plus
-- retry_delay_seconds: a moment after the run_at the retry set, from its transaction's start) or from that
-- attempt's lease running out. Run after the run settled: an unfinished attempt has no worker-seconds.
WITH attempts AS (
    SELECT j.tenant, a.attempt, a.claimed_at, a.finished_at,
           CASE WHEN a.attempt = 1 THEN j.created_at
                ELSE lag(coalesce(a.finished_at + make_interval(secs => a.retry_delay_seconds), a.lease_expires_at))
                     OVER (PARTITION BY a.job_id ORDER BY a.attempt) END AS due_at
    FROM job_attempts AS a JOIN jobs AS j ON j.id = a.job_id
), contested AS (
    -- The claims at which every tenant had a job due and waiting (claimed by that claim or a later one).
    SELECT DISTINCT c.claimed_at FROM attempts AS c
    WHERE (SELECT count(DISTINCT w.tenant) FROM attempts AS w
           WHERE w.due_at <= c.claimed_at AND w.claimed_at >= c.claimed_at)
          = (SELECT count(DISTINCT tenant) FROM jobs)
), stretch AS (
    SELECT min(claimed_at) AS opened, max(claimed_at) AS closed,
           extract(epoch FROM max(claimed_at) - min(claimed_at))::float8 AS seconds
    FROM contested
), per_tenant AS (
    SELECT a.tenant,
           count(*) FILTER (WHERE a.attempt = 1) AS jobs,
           count(*) AS claims,
           count(*) FILTER (WHERE a.attempt > 1) AS retries,
           avg(extract(epoch FROM a.finished_at - a.claimed_at))::float8 AS seconds_per_claim,
           count(*) FILTER (WHERE a.claimed_at IN (SELECT claimed_at FROM contested)) AS claims_contested,
           count(*) FILTER (WHERE a.attempt > 1
                              AND a.claimed_at IN (SELECT claimed_at FROM contested)) AS retries_contested,
           coalesce(sum(greatest(extract(epoch FROM least(a.finished_at, s.closed)
                                                    - greatest(a.claimed_at, s.opened)), 0)), 0)::float8
               AS worker_seconds_contested,
           s.seconds AS contested_seconds
    FROM attempts AS a CROSS JOIN stretch AS s
    GROUP BY a.tenant, s.seconds
)
SELECT tenant, jobs, claims, retries, seconds_per_claim, claims_contested, retries_contested,
       worker_seconds_contested,
       worker_seconds_contested / nullif(sum(worker_seconds_contested) OVER (), 0) AS worker_share_contested,
       worker_seconds_contested / nullif(contested_seconds, 0) AS in_flight_contested,
       contested_seconds
FROM per_tenant ORDER BY tenant;

-- name: job_claims_with_bounds
-- Each claim (the jobs one worker's statement took, sharing its claimed_at) with the bounds on its timing
-- that the fairness check (reliableq/lab/invariants.py fairness_check) relies on; see the fragment.
WITH
-- include: claims_with_bounds
SELECT worker_id, claimed_at, decided_by, committed_by, took_lapsed, tenants FROM claim
ORDER BY claimed_at, worker_id;

-- name: job_waits_with_bounds
-- Each spell a job may have spent PENDING (so in a fair claim's `waiting`, once due): from its insert until
-- its first claim, and from each retry until the next claim after it. maybe_from..maybe_to: every moment a
-- claim's snapshot may have seen it waiting (the insert's created_at or the retry's finished_at, both before
-- their commit, until the taking claim's committed_by; NULL: never taken, or nothing bounds its commit).
-- surely_from..surely_to: the moments every snapshot surely saw it waiting and due, for the first spell of
-- a job created by %(visible_from)s (the caller knows every such submission had committed then): from then
-- until its first claim wrote its row, the claim committing after that (NULL: never claimed). surely_from
-- NULL: never sure, as for a retry's spell, whose commit nothing stored bounds.
WITH
-- include: claims_with_bounds
, taker AS (
    SELECT attempt.job_id, attempt.attempt, attempt.claimed_at, attempt.recorded_at, claim.committed_by
    FROM attempt JOIN claim USING (worker_id, claimed_at)
)
SELECT jobs.id AS job_id, jobs.tenant, jobs.created_at AS maybe_from, first.committed_by AS maybe_to,
       sure.surely_from, CASE WHEN sure.surely_from IS NOT NULL THEN first.recorded_at END AS surely_to
FROM jobs LEFT JOIN taker AS first ON first.job_id = jobs.id AND first.attempt = 1
CROSS JOIN LATERAL (SELECT CASE WHEN jobs.created_at <= %(visible_from)s::timestamptz
                                THEN %(visible_from)s::timestamptz END AS surely_from) AS sure
UNION ALL
-- After a retry, until the first claim after it (with fencing off a stale owner's retry may land after a
-- later claim of the job: the job is PENDING from it until the claim after that).
SELECT retried.job_id, retried.tenant, retried.finished_at,
       (SELECT next.committed_by FROM taker AS next
        WHERE next.job_id = retried.job_id AND next.claimed_at > retried.finished_at
        ORDER BY next.claimed_at LIMIT 1),
       NULL, NULL
FROM attempt AS retried WHERE retried.outcome = 'retried'
ORDER BY tenant, maybe_from;

-- fragment: claims_with_bounds
-- `attempt`: every claim of every job, with its tenant and the outcome of the job's attempt before.
-- `claim`: per claim (worker_id, claimed_at), what the fairness check may assume of its timing. It decided
-- (took its snapshot, its turn and its locks) between claimed_at, its transaction's start, and decided_by,
-- the last row it wrote (clock_timestamp(), written after every lock and the turn: job_claim_due_fair's
-- `due` is sorted before anything is taken). It had committed by committed_by, the first thing that
-- cannot come before its commit: its worker's next claim (a worker runs one claim at a time), a finalize
-- of one of its attempts, or a later claim of one of its jobs, which saw it committed (that claim's row,
-- not its claimed_at: a transaction's start may come before a commit its snapshot sees); NULL when nothing
-- came after. took_lapsed: it took a job whose lease had run out (the job's attempt before was not
-- retried), so it may have locked a tenant's due jobs and taken none of them (lapsed leases come first).
attempt AS (
    SELECT a.job_id, a.attempt, a.worker_id, a.claimed_at, a.recorded_at, a.finished_at, a.outcome, j.tenant,
           lag(a.outcome) OVER (PARTITION BY a.job_id ORDER BY a.attempt) AS previous_outcome
    FROM job_attempts AS a JOIN jobs AS j ON j.id = a.job_id
), claimed AS (
    SELECT worker_id, claimed_at, max(recorded_at) AS decided_by,
           bool_or(attempt > 1 AND previous_outcome IS DISTINCT FROM 'retried') AS took_lapsed,
           array_agg(DISTINCT tenant ORDER BY tenant) AS tenants
    FROM attempt GROUP BY worker_id, claimed_at
), claim AS (
    SELECT claimed.*, least(
               (SELECT min(next.claimed_at) FROM claimed AS next
                WHERE next.worker_id = claimed.worker_id AND next.claimed_at > claimed.claimed_at),
               (SELECT min(own.finished_at) FROM attempt AS own
                WHERE own.worker_id = claimed.worker_id AND own.claimed_at = claimed.claimed_at
                  AND own.outcome IN ('succeeded', 'retried', 'dead', 'lost_succeed', 'lost_retry', 'lost_dead')),
               (SELECT min(later.recorded_at) FROM attempt AS own
                JOIN attempt AS later ON later.job_id = own.job_id AND later.attempt > own.attempt
                WHERE own.worker_id = claimed.worker_id AND own.claimed_at = claimed.claimed_at)
           ) AS committed_by
    FROM claimed
)
