"""One way to wait for something that offers no event to wait on: poll a condition until it holds or a
deadline passes, and say in the error what was awaited and for how long. Every poll loop of the lab, the
benchmark and the tests goes through here; none sleeps a fixed time as synchronisation.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

Value = TypeVar("Value")


async def wait_until(condition: Callable[[], Value | Awaitable[Value]], timeout: float, what: str,
                     interval: float = 0.02) -> Value:
    """Call `condition` (plain or async) until it returns something truthy, and return that; TimeoutError
    naming `what` once `timeout` seconds have passed. An exception from `condition` ends the wait."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
