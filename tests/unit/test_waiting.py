"""The one wait helper: returns what the condition found, takes plain or async conditions, and says what
it waited for when the deadline passes."""

from __future__ import annotations

import pytest

from reliableq.lab.waiting import wait_until


async def test_returns_the_first_truthy_value_of_a_plain_or_async_condition():
    calls = iter([0, None, "found"])
    assert await wait_until(lambda: next(calls), 5, "a value", interval=0) == "found"

    async def ready() -> int:
        return 7
    assert await wait_until(ready, 5, "seven") == 7


async def test_a_deadline_names_what_was_awaited_and_for_how_long():
    with pytest.raises(TimeoutError, match=r"timed out after 0.05s waiting for the moon"):
        await wait_until(lambda: False, 0.05, "the moon", interval=0.01)


async def test_an_error_in_the_condition_ends_the_wait():
    def broken() -> bool:
        raise RuntimeError("worker exited")
    with pytest.raises(RuntimeError, match="worker exited"):
        await wait_until(broken, 5, "anything")
