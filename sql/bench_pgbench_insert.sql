-- pgbench script (reliableq bench): one job row inserted and committed per transaction, into the
-- queue's own table with its indexes; the floor under any durable submission. Run with -M prepared.
INSERT INTO jobs (payload, max_attempts) VALUES ('{"amount_cents": 1250, "currency": "USD"}', 5);
