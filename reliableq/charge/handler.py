"""The `charge` job kind: a handler that charges a job's payload through the charge service.

The client classifies every answer; this only adapts its outcome to the queue's. The service's own
status code and charge id stay with the client: the worker needs the class and a detail, nothing more.
"""

from __future__ import annotations

from reliableq.charge.client import ChargeClient
from reliableq.charge.payload import check_charge
from reliableq.handlers import Handler, HandlerRegistry, JobContext, Outcome, noop
from reliableq.payload import JobKinds, accept_any_payload

# The stock kinds' payload checks: all an API needs of them (it never runs a job). A submission that
# names no kind is a charge, as it was before kinds existed.
STANDARD_KINDS = JobKinds({"charge": check_charge, "noop": accept_any_payload}, default="charge")


def charge_handler(client: ChargeClient) -> Handler:
    async def charge(job: JobContext) -> Outcome:
        answer = await client.charge(job.id, job.payload, job.idempotency_key)
        return Outcome(answer.kind, answer.detail, answer.retry_after_seconds)
    return charge


def standard_handlers(client: ChargeClient) -> HandlerRegistry:
    """The job kinds a stock worker runs: `charge` through `client`, and `noop`."""
    registry = HandlerRegistry()
    registry.register("charge", charge_handler(client), STANDARD_KINDS.checks["charge"])
    registry.register("noop", noop, STANDARD_KINDS.checks["noop"])
    return registry
