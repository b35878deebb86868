-- Migration 4 of the queue's database: an attempt that ended in a retry records the delay the worker chose
-- before the job's next attempt (0 when backoff is off), so an operator reading a job's history, and the
-- backoff stage, see the schedule the worker drew rather than inferring it from the gaps between claims
-- (which add the poll interval and however long a loaded machine takes to claim).
-- Attempts recorded before the upgrade keep NULL: their delay was never written down.
ALTER TABLE job_attempts ADD COLUMN retry_delay_seconds double precision;
