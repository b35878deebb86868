-- Migration 5 of the queue's database: one row the API's readiness check updates (sql/queue.sql
-- database_commit). A check that only reads, or only takes a transaction id, commits without writing
-- WAL and so without waiting for a synchronous standby: it answered while every submission's commit
-- was blocked. An update is a write, and its commit waits as a submission's does.
CREATE TABLE readiness_probe (
    single    boolean PRIMARY KEY DEFAULT true CHECK (single),
    probed_at timestamptz NOT NULL
);
INSERT INTO readiness_probe (probed_at) VALUES (now());
