-- The queue's database: jobs, one row per claim (attempt), and lifecycle events.
-- Applied by `reliableq migrate` and on start-up; every statement is idempotent.

CREATE TABLE IF NOT EXISTS jobs (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    kind             text NOT NULL DEFAULT 'charge',
    payload          jsonb NOT NULL,
    -- PENDING -> RUNNING -> SUCCEEDED | PENDING (retry) | DEAD; replay moves DEAD -> PENDING.
    status           text NOT NULL DEFAULT 'PENDING'
                     CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'DEAD')),
    -- A: how many times the job was claimed (every claim is an attempt, crashed ones included).
    attempts         integer NOT NULL DEFAULT 0,
    -- Budget (stage `dead`): a claim past this becomes DEAD. Replay raises it by a fresh budget.
    max_attempts     integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    -- Eligibility, always compared with PostgreSQL's clock (stage `backoff` moves it forward).
    run_at           timestamptz NOT NULL DEFAULT now(),
    -- The lease (stage `leases`): who holds the job, until when, and the token that fences it
    -- (stage `fencing`). A claim always writes a fresh token; only fencing makes updates check it.
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    last_error       text,
    -- Stable across retries and replays: the charge service deduplicates on it (stage `idempotency`).
    idempotency_key  text GENERATED ALWAYS AS ('reliableq:charge:' || id::text) STORED,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finalized_at     timestamptz
);

-- The two ways a job becomes due: a pending job whose time has come, a running one whose lease ran out.
CREATE INDEX IF NOT EXISTS jobs_pending_run_at ON jobs (run_at) WHERE status = 'PENDING';
CREATE INDEX IF NOT EXISTS jobs_running_lease ON jobs (lease_expires_at) WHERE status = 'RUNNING';
CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created_at);

-- One row per claim. Finalize outcomes are written here by lease token, including the ones a
-- fenced update lost, so a stale owner's defeat is on record rather than silently dropped.
CREATE TABLE IF NOT EXISTS job_attempts (
    id               bigserial PRIMARY KEY,
    job_id           uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt          integer NOT NULL,
    worker_id        text NOT NULL,
    lease_token      uuid NOT NULL UNIQUE,
    claimed_at       timestamptz NOT NULL,
    lease_expires_at timestamptz,
    finished_at      timestamptz,
    -- succeeded | retried | dead: the finalize this attempt won;
    -- lost_<operation>: a fenced update that affected zero rows (a stale owner).
    outcome          text,
    error            text
);
CREATE INDEX IF NOT EXISTS job_attempts_job ON job_attempts (job_id, attempt);

-- Lifecycle events that are not a claim: submission and operator replays.
CREATE TABLE IF NOT EXISTS job_events (
    id      bigserial PRIMARY KEY,
    job_id  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    event   text NOT NULL,
    detail  text
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job_id, at);
