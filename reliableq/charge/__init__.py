"""The charge: the side effect a charge job performs, kept apart from the queue that runs it.

    service   the charge service: its own database, one charge per idempotency key, injected faults
    client    the worker's client: the job's stable key, every answer classified
    payload   what a charge job's payload holds: one check, run by the API and by the service
    handler   the `charge` kind's handler, and the stock kinds (`charge`, `noop`) a worker and an API know

The charge layer uses the core's database helpers, SQL loader, submission envelope and handler registry;
it never imports the lab, the bench or the CLI.
"""
