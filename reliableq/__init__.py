"""ReliableQ: a PostgreSQL-backed job queue, built to show why each reliability mechanism exists.

Layout: layers, each a folder, one noun per module. The core, at the package root:
    config    the mechanism switches (`Mechanisms`) and worker settings
    sql       loads schemas and named queries from `sql/`; the only place SQL comes from
    db        where the databases are (embedded PostgreSQL or DATABASE_URL), pools, migrations
    payload   what a client may submit: the envelope (kind, attempt budget), each kind's check run on the rest
    queue     the repository: submit, claim, renew, succeed, retry, dead, replay (fenced by lease token)
    position  a place in the jobs' (created_at, id) order: the listing's page cursor, the pruner's walk
    backoff   capped exponential backoff with full jitter, seedable
    retention  finished jobs deleted in small batches beside running workers (`reliableq prune`)
    finalize_decision  succeed, retry or DEAD, from the handler's outcome and the attempt budget
    permits   how many more jobs a worker may claim (the semaphore): taken at claim, released when done
    api       the HTTP API: submit (202 after commit), inspect, replay
    api_contract  what the API's OpenAPI document says each route takes and answers (documentation only)
    worker    the asyncio worker: permits, leases, classification, graceful shutdown
    handlers  job kinds as registered handlers: each kind's handler and payload check; `noop`
    group_commit  callers that arrive during a commit share the next one (the worker's successes)
    lease_keeper  renews a claim's lease from its effect until its finalize is recorded
    hooks     the named fault points the core passes, and the no-op hook production runs with
    servers   ASGI apps on loopback in a background thread
    metrics   Prometheus metrics: the API's and a worker's, each in its own registry; a worker's /metrics server
    tokens    whether a request carries the bearer token a server requires
charge/     the charge service (service), its client (client), the charge payload (payload), the `charge` kind (handler)
lab/        harness (the one harness), experiment (a stage's run over it), scenario (its params and result),
            panels, resave, processes, faults (the FaultPlan),
            ledger, timeline, invariants, chaos, demo, notebook
bench/      `reliableq bench`: run, runner, scenarios, ingest, retention, stack, gate, results, profiles, progress,
            baselines (pgbench), peers, peer_runners, report (its tables, charts and markdown)
cli/        the `reliableq` command: main (the parser), arguments, database, services, operators, lab, bench

The rule (tests/unit/test_layers.py checks it, imports inside functions included): the core imports only
itself (it knows no job kind: the charge is one, in charge/), charge/ only the core; lab/ imports only
those (never stages, lab/exercises/, bench/ or cli/); stages/ may import the lab, and lab/exercises/ the
stages; bench/ imports the core and charge/, and from the lab
only harness, invariants, ledger, processes, waiting and demo; cli/ imports everything. No cycles.

The stages live beside the package in `stages/` (s01_naive … s09_semaphore), one per mechanism; they install
as `reliableq_stages` (pyproject.toml says why), the name every import uses.

What the full system guarantees: an acknowledged job is durable; it may run more than once, but it
commits one charge and is finalized once. What it does not: that a handler runs exactly once.
"""

__version__ = "0.1.0"
