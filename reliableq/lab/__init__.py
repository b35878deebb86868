"""The lab: the harness that runs the core under faults, and what it reads back and judges.

    experiment  what the stages share: scenario parameters and results, compare off/on
    harness     a whole system for one experiment on scratch databases (in-process workers)
    processes   real `reliableq` processes on loopback: spawn, wait for readiness, signal, stop
    faults      the FaultPlan: crashes, pauses and lost answers armed at the core's fault points
    ledger      A/H/C/F per job, read from PostgreSQL
    timeline    an experiment's events (claims, expiries, finalizes, charges, crashes) for charts
    invariants  the safety invariants, checked directly in PostgreSQL
    chaos       the seeded chaos suite and its invariant report
    demo        `reliableq demo`: crash after the charge (in-process, kill9, pause), recover, count
    notebook    the notebooks' tables, charts and widgets

The lab drives the core and the charge service; neither of them imports it.
"""
