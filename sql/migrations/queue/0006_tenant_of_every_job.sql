-- Migration 6 of the queue's database: whose work each job is. `tenant` names the customer (account,
-- team) a job is done for; the fair claim (sql/queue.sql job_claim_due_fair) takes due jobs tenant by
-- tenant in turn, so one tenant's backlog cannot hold back another's job. Jobs stored before this, and
-- jobs submitted without a tenant, share the tenant 'default' (a constant default: no table rewrite).
ALTER TABLE jobs ADD COLUMN tenant text NOT NULL DEFAULT 'default';
-- Each tenant's due jobs in order: the fair claim finds the tenants with due work by stepping from one
-- tenant to the next in this index, then takes each one's oldest.
CREATE INDEX jobs_pending_tenant_run_at ON jobs (tenant, run_at, id) WHERE status = 'PENDING';
-- Whose turn it is: each fair claim takes the next number and starts its round there among the tenants
-- with due work. A sequence, not a row: claims never wait for one another to take a turn.
CREATE SEQUENCE job_claim_turns;
