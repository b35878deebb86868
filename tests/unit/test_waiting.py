"""The one wait helper: returns what the condition found, takes plain or async conditions, and says what
it waited for when the deadline passes."""

from __future__ import annotations

import asyncio

import pytest

from reliableq.lab.waiting import Watch, wait_until, watching


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


async def test_a_watched_run_reports_what_it_waits_for():
    """Work run under `watching` writes each wait into the watch while it lasts, and clears it after."""
    watch = Watch()
    release = asyncio.Event()

    async def work() -> None:
        await wait_until(release.is_set, 5, "the release", interval=0.01)
    task = asyncio.create_task(work(), context=watching(watch))
    await wait_until(lambda: watch.what == "the release", 5, "the watch to see the wait", interval=0.01)
    assert watch.timeout == 5
    release.set()
    await task
    assert watch.what is None
    await wait_until(lambda: True, 1, "an unwatched wait")
    assert watch.what is None  # a wait outside the watched work reports nowhere
