"""One way to wait for something that offers no event to wait on: poll a condition until it holds or a
deadline passes, and say in the error what was awaited and for how long. Every poll loop of the lab, the
benchmark and the tests goes through here; none sleeps a fixed time as synchronisation.

A caller that wants to show what a long run is waiting on (a notebook panel's live status line) runs
the work under `watching(watch)`: every wait inside it then writes what it waits for, and since when,
into that `Watch`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

Value = TypeVar("Value")


@dataclass
class Watch:
    """The wait under way in a watched run: what it waits for, since when (time.monotonic()), how long
    it will wait; `what` is None between waits."""
    what: str | None = None
    since: float = 0.0
    timeout: float = 0.0
    step: str | None = None  # the step of a run made of several ("step 4/9: chaos seed 1")


_watch: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("reliableq_watch", default=None)


def watching(watch: Watch) -> contextvars.Context:
    """A context to run work in (`asyncio.create_task(work, context=...)`) whose waits report to `watch`."""
    context = contextvars.copy_context()
    context.run(_watch.set, watch)
    return context


def report_step(step: str) -> None:
    """Say, to a watched run's Watch if there is one, which step of a longer run has begun."""
    watch = _watch.get()
    if watch is not None:
        watch.step = step


async def wait_until(condition: Callable[[], Value | Awaitable[Value]], timeout: float, what: str,
                     interval: float = 0.02) -> Value:
    """Call `condition` (plain or async) until it returns something truthy, and return that; TimeoutError
    naming `what` once `timeout` seconds have passed. An exception from `condition` ends the wait."""
    started = time.monotonic()
    deadline = started + timeout
    watch = _watch.get()
    if watch is not None:
        watch.what, watch.since, watch.timeout = what, started, timeout
    try:
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(interval)
    finally:
        if watch is not None and watch.what == what:
            watch.what = None
