-- Named queries over the peers' own tables (reliableq/bench/peers.py), read after a run on its fresh database.
-- The tables are the peers' defaults (pgqueuer: pgqueuer, pgqueuer_log; procrastinate: procrastinate_jobs,
-- procrastinate_events), installed by each peer's own API. Read-only.

-- name: server_clock_now
-- The server's clock, the one the peers stamp their completions with: a run's start on the same clock.
SELECT clock_timestamp() AS now;

-- name: pgqueuer_outcome
-- For the job ids a run enqueued: how many wait in the queue, how many were logged successful exactly once
-- (with no failure or cancellation, and gone from the queue), and when the last success was logged.
SELECT count(*) FILTER (WHERE q.status = 'queued') AS waiting,
       count(*) FILTER (WHERE q.id IS NULL AND l.successes = 1 AND l.others = 0) AS completed_once,
       max(l.succeeded_at) AS last_completed_at
FROM unnest(%(ids)s::bigint[]) AS ids(id)
LEFT JOIN pgqueuer q ON q.id = ids.id
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE status = 'successful') AS successes,
           count(*) FILTER (WHERE status NOT IN ('queued', 'picked', 'successful')) AS others,
           max(created) FILTER (WHERE status = 'successful') AS succeeded_at
    FROM pgqueuer_log
    WHERE job_id = ids.id
) l;

-- name: procrastinate_outcome
-- For the job ids a run deferred: how many wait in the queue, how many succeeded after exactly one start,
-- and when the last success was recorded.
SELECT count(*) FILTER (WHERE j.status = 'todo') AS waiting,
       count(*) FILTER (WHERE j.status = 'succeeded' AND e.starts = 1) AS completed_once,
       max(e.succeeded_at) AS last_completed_at
FROM unnest(%(ids)s::bigint[]) AS ids(id)
LEFT JOIN procrastinate_jobs j ON j.id = ids.id
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE type = 'started') AS starts,
           max(at) FILTER (WHERE type = 'succeeded') AS succeeded_at
    FROM procrastinate_events
    WHERE job_id = ids.id
) e;
