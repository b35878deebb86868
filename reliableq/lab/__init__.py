"""The lab: the harness that runs the core under faults, and what it reads back and judges.

    harness     the one harness: a whole system for one run on scratch databases, its servers and
                workers in this process or as real processes; "settled" defined once
    experiment  a stage's run over the harness: the Stage protocol, predictions, compare off/on
    scenario    what a scenario takes and records (ScenarioParams, ScenarioResult) and its verdict
    processes   real `reliableq` processes on loopback: spawn, wait for readiness, signal, stop
    faults      the FaultPlan: crashes, pauses and lost answers armed at the core's fault points
    ledger      A/H/C/F per job, read from PostgreSQL
    timeline    an experiment's events (claims, expiries, finalizes, charges, crashes) for charts
    invariants  the safety invariants, checked directly in PostgreSQL
    chaos       the seeded chaos suite and its invariant report
    demo        `reliableq demo`: crash after the charge (in-process, kill9, pause), recover, count;
                the kill -9 story told once, for the demo and the benchmark
    notebook    the notebooks' tables, charts and banners
    panels      the notebooks' widgets: scenario and chaos panels, predictions, each with a static picture
    resave      re-saves notebooks as the repository keeps them (pictures, no widget state)

The lab drives the core and the charge service; neither of them imports it.
"""
