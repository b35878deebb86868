"""`reliableq bench`: the queue measured as released processes, every run gated by the lab's invariants.

    run         run_bench: the named scenarios, then the result files
    runner      Bench: each point measured, gated and kept apart when failed; then the baselines
    scenarios   the scenarios by name (execution, latency, kill -9, retry, idempotency, DEAD, semaphore)
    ingest      the ingest scenario: over HTTP, in batches, straight into PostgreSQL
    retention   the retention scenario: no-op jobs over a large finished history, kept or pruned first
    standby     the standby scenario: a synchronous, an asynchronous and no standby; a failover's gap
    fairness    the fairness scenarios: one claim's cost, FIFO and fair; a quiet tenant's pickup beside a flood
    stack       one run over the lab's harness, every part a real process; seeded workers, preloads
    gate        the correctness gate, from reliableq.lab.invariants
    results     samples, windows, run and bench results, the summary, the workers' time metrics
    profiles    how big each scenario is (tiny, quick, full)
    progress    the progress bar
    baselines   what bounds our figures: pgbench on the queue's own statements, and the peers
    peers       pgqueuer and procrastinate doing the same work, each in its own process: run, checked, timed
    peer_runners  each queue's adapter for those runs (pgqueuer, procrastinate, ours for pickup)
    report      the result files: results.json, CSV, charts and report.md; the reference notebook 13 ships
    tables      the report's rows: like beside like only (KINDS), pickup latency, what each mechanism costs
    charts      the report's charts (PNG)
    markdown    report.md's text

The bench uses the core, the charge service, and from the lab its one harness (every part a real
process), its invariants (the gate), its ledger (A/H/C/F of a scenario's jobs), its process and wait
helpers and the kill -9 story the demo tells; nothing below it imports the bench.
"""
