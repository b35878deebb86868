"""ReliableQ: a PostgreSQL-backed job queue, built to show why each reliability mechanism exists.

Layout (one noun per module):
    config    the mechanism switches (`Mechanisms`) and worker settings
    sql       loads schemas and named queries from `sql/`; the only place SQL comes from
    db        where the databases are (embedded PostgreSQL or DATABASE_URL), pools, migrations
    payload   what a client may submit, validated before anything is stored
    queue     the repository: submit, claim, renew, succeed, retry, dead, replay (fenced by lease token)
    backoff   capped exponential backoff with full jitter, seedable
    charge    the charge service (its own database, idempotency keys) and the worker's client
    api       the HTTP API: submit (202 after commit), inspect, replay
    worker    the asyncio worker: permits, leases, classification, graceful shutdown
    group_commit  callers that arrive during a commit share the next one (the worker's successes)
    lease_keeper  renews a claim's lease from its effect until its finalize is recorded
    faults    named crash and pause points the harness arms
    servers   ASGI apps on loopback in a background thread
    harness   a whole system for one experiment on scratch databases
    ledger    A/H/C/F per job, read from PostgreSQL
    timeline  an experiment's events (claims, expiries, finalizes, charges, crashes) for charts
    invariants the safety invariants, checked directly in PostgreSQL
    lab       what the stages share: scenario parameters and results, compare off/on
    chaos     the seeded chaos suite and its invariant report
    demo      `reliableq demo`: crash after the charge (in-process, kill9, pause), recover, count
    processes real `reliableq` processes on loopback: spawn, wait for readiness, signal, stop
    bench     `reliableq bench`: scenarios against real processes, gated by the invariants, beside pgbench
    bench_report the benchmark's files: JSON, CSV, charts and the markdown report
    peers     the benchmark's peers, pgqueuer and procrastinate, each run in its own process
    cli       the `reliableq` command

The stages live beside the package in `stages/` (s01_naive … s09_semaphore), one per mechanism.

What the full system guarantees: an acknowledged job is durable; it may run more than once, but it
commits one charge and is finalized once. What it does not: that a handler runs exactly once.
"""

__version__ = "0.1.0"
