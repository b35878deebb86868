"""When a submission is acknowledged: the order of its commit and its 202.

A submission order is one small function, `accept(store, acknowledge)` (a `SubmissionOrder`), awaiting
both in its own order: `store()` inserts and commits the job (or batch); `acknowledge()` sends the client
its 202. With commit_before_ack on (the real system) the order is `store_then_acknowledge`: an
acknowledged job survives any crash that follows. With it off, `acknowledge_then_store`: the 202 goes out
first and the insert runs after the response, so a crash in between loses an acknowledged job. The lab's
exercise runs a learner's own order in their place.

`acknowledge_in_order` runs an order for one request and returns once it has acknowledged (the rest of
the order, a store still to come, runs on after the 202: `finish`), or raises what kept it from
acknowledging. The fault points of the lab's crashes are here, between the two steps:
`after_ack_before_commit` and `after_commit_before_ack`. This module knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from reliableq.config import Mechanisms
from reliableq.hooks import FaultHook, SimulatedCrash

log = logging.getLogger("reliableq.api")

Store = Callable[[], Awaitable[object]]
Acknowledge = Callable[[], Awaitable[None]]
SubmissionOrder = Callable[[Store, Acknowledge], Awaitable[None]]
# What a submission's fault points and log lines name: the job's id, or a batch's ids (a tuple, so the
# fault hook's job filters see one hashable value for the whole batch).
Submitted = uuid.UUID | tuple[uuid.UUID, ...]


async def store_then_acknowledge(store: Store, acknowledge: Acknowledge) -> None:
    """commit_before_ack: the 202 goes out only once the insert has committed."""
    await store()
    await acknowledge()


async def acknowledge_then_store(store: Store, acknowledge: Acknowledge) -> None:
    """The naive order (commit_before_ack off): the 202 first, the insert after it. The window is real."""
    await acknowledge()
    await store()


def shipped_order(mechanisms: Mechanisms) -> SubmissionOrder:
    return store_then_acknowledge if mechanisms.commit_before_ack else acknowledge_then_store


@dataclass(frozen=True)
class Acknowledged:
    """A submission its order acknowledged. `stored`: what its store returned, if the store ran first
    (None otherwise); `rest`: the order, still running on after the acknowledgement."""
    stored: object | None
    rest: asyncio.Task


class NotAcknowledged(Exception):
    """The order failed, or ended, before acknowledging; what it stored stays stored."""


async def acknowledge_in_order(order: SubmissionOrder, store: Store, submitted: Submitted, faults: FaultHook,
                               raised_as_they_are: tuple[type[Exception], ...] = ()) -> Acknowledged:
    """Run `order` with `store` until it acknowledges. A store that comes after the acknowledgement first
    passes the fault point after_ack_before_commit; one before it, after_commit_before_ack once stored.
    An order that ends unacknowledged raises NotAcknowledged, or its failure itself when that is one of
    `raised_as_they_are` (the caller's own answers: an outage, a reused key)."""
    # Resolved by the acknowledgement, or by the order's end if it never comes: one future and one
    # callback where asyncio.wait on both cost a waiter and four callbacks a request.
    answered = asyncio.get_running_loop().create_future()
    acknowledged = False
    stored: list[object] = []

    def answer() -> None:
        if not answered.done():  # cancelled with the request, or already answered
            answered.set_result(None)

    async def acknowledge() -> None:
        nonlocal acknowledged
        if acknowledged:
            raise RuntimeError("acknowledge() called again: a request has one answer, already sent")
        acknowledged = True
        answer()

    async def store_in_order() -> object:
        if acknowledged:
            try:
                await faults.reach("after_ack_before_commit", submitted, "api")
            except SimulatedCrash:
                _say_lost(submitted)
                if asyncio.current_task() is not running:
                    return None  # a store left to a task nobody awaits: the crash ends that task, quietly
                raise
        stored.append(await store())
        if not acknowledged:
            await faults.reach("after_commit_before_ack", submitted, "api")
        return stored[0]

    running = asyncio.create_task(order(store_in_order, acknowledge))
    running.add_done_callback(lambda _: answer())
    try:
        await answered
    except asyncio.CancelledError:  # the request is gone (server shutdown): so is what it was doing
        running.cancel()
        raise
    if acknowledged:
        return Acknowledged(stored[0] if stored else None, running)
    failure = asyncio.CancelledError() if running.cancelled() else running.exception()
    if failure is None:
        raise NotAcknowledged("the submission was not acknowledged: the API's order ended without answering")
    if isinstance(failure, raised_as_they_are):
        raise failure
    raise NotAcknowledged(f"the submission failed before it was acknowledged: {type(failure).__name__}") \
        from failure


async def finish(acknowledged: Acknowledged) -> None:
    """The rest of an acknowledged submission's order, after its 202 went out."""
    try:
        await acknowledged.rest
    except SimulatedCrash:
        pass  # said where it happened
    except Exception as error:  # the client has its 202; all that is left to do is to say what went wrong
        log.error("a submission failed after it was acknowledged: %s: %s", type(error).__name__, error)


def _say_lost(submitted: Submitted) -> None:
    if isinstance(submitted, uuid.UUID):
        log.warning("simulated API crash after acknowledging job %s: the job is lost", submitted)
    else:
        log.warning("simulated API crash after acknowledging a batch of %d jobs: all of them are lost",
                    len(submitted))
