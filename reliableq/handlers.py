"""Job kinds as registered handlers: what a worker runs for a job, chosen by the job's `kind`.

A handler is an async function from a `JobContext` (id, payload, attempt, idempotency key) to a
classified `Outcome`; the worker decides retries, backoff and DEAD from the outcome, never the handler.
A kind also registers its payload check, which the API runs at submission (reliableq/payload.py): a job
of a kind the API does not know is refused there. What this does not guarantee: that a handler runs
once. A crash between its effect and the finalize runs it again with the same idempotency key, so a
handler with a side effect must hand that key to whatever performs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from reliableq.payload import Validator, accept_any_payload
from reliableq.queue import Job


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | transient (try again later) | permanent (never retry) | ambiguous (may have happened)
    detail: str
    # A transient refusal's own word on when to come back (HTTP Retry-After): the retry is not due sooner.
    retry_after_seconds: float | None = None


@dataclass(frozen=True)
class JobContext:
    """What a handler may know of its job: enough to do the work once, not the queue's bookkeeping."""
    id: uuid.UUID
    payload: dict[str, Any]
    attempt: int  # 1 on the first try
    idempotency_key: str  # the same on every attempt and after a replay


Handler = Callable[[JobContext], Awaitable[Outcome]]


class HandlerRegistry:
    """The job kinds one worker (or API) knows: each kind's handler and its payload check."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._validators: dict[str, Validator] = {}

    def register(self, kind: str, handler: Handler, validate: Validator = accept_any_payload) -> None:
        # Refused rather than replaced: two modules claiming one kind is a wiring mistake to hear about.
        if kind in self._handlers:
            raise ValueError(f"a handler for job kind {kind!r} is already registered")
        self._handlers[kind] = handler
        self._validators[kind] = validate

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def validators(self) -> dict[str, Validator]:
        """Each kind's payload check, for the API that accepts these kinds (JobKinds' `checks`)."""
        return dict(self._validators)

    async def handle(self, job: Job) -> Outcome:
        """Run the job's handler. A kind with no handler (a row inserted past the API) cannot succeed
        on any retry, so it is a permanent failure."""
        handler = self._handlers.get(job.kind)
        if handler is None:
            return Outcome("permanent", f"no handler for job kind {job.kind!r}")
        return await handler(JobContext(job.id, job.payload, job.attempts, job.idempotency_key))


async def noop(job: JobContext) -> Outcome:
    """Does nothing: how `reliableq bench` measures the queue's own cost, as it measures the peers."""
    return Outcome("ok", "no-op")
