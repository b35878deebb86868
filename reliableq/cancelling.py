"""Waiting and cancelling that stay right when a task is cancelled, on every Python this package supports.

On Python 3.11, `asyncio.wait_for` loses a cancellation that arrives in the same loop iteration as the
thing it waits for completes: it returns the result, and the cancelled task runs on. A worker whose
poll wait swallowed a Stop went on claiming, and the run waiting for it never ended. `asyncio.timeout`
counts cancellations and has no such window, so every wait here is built on it; and a task told to
stop at once is cancelled again until it has ended, whatever library code it is inside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

RECANCEL_SECONDS = 0.5  # far longer than a cancelled task's own clean-up, which a second cancel would cut short


async def event_set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; whether it was set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again every RECANCEL_SECONDS any
    that swallowed its cancellation."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)


async def to_thread_to_its_end(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a thread, waited for to its end even when the caller is cancelled meanwhile: a
    thread cannot be cancelled, and a server it went on to start would serve on with nobody to stop it."""
    running = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait({running})
        raise
