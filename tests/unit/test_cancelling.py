"""A Stop is never lost: a cancellation that arrives as a wait completes still ends the task, a task that
swallows one is cancelled again, and a thread started for a run is waited for before the run is gone."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from reliableq.cancelling import cancel_and_wait, event_set_within, to_thread_to_its_end
from reliableq.lab.waiting import wait_until


async def test_says_whether_the_event_was_set_in_time():
    event = asyncio.Event()
    assert not await event_set_within(event, 0.01)
    event.set()
    assert await event_set_within(event, 10)


async def _poll_forever(wake: asyncio.Event, wait) -> None:
    """A worker's loop in miniature: wait for a wake-up or the poll interval, then go round again."""
    while True:
        await wait(wake)
        wake.clear()


async def _stopped_within(wait, seconds: float) -> asyncio.Task:
    """The loop cancelled in the very iteration something wakes it; whether it ended within `seconds`."""
    wake = asyncio.Event()
    task = asyncio.create_task(_poll_forever(wake, wait))
    await asyncio.sleep(0)  # it is waiting now
    wake.set()
    task.cancel()
    await asyncio.wait({task}, timeout=seconds)
    return task


async def test_a_cancellation_arriving_as_the_wait_ends_stops_the_loop():
    task = await _stopped_within(lambda wake: event_set_within(wake, 10), 1)
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for loses cancellations on 3.11 only")
async def test_the_wait_it_replaces_loses_that_cancellation_on_python_3_11():
    task = await _stopped_within(lambda wake: asyncio.wait_for(wake.wait(), 10), 0.3)
    assert not task.done(), "wait_for kept the cancellation: this module's reason is gone"
    await cancel_and_wait([task])


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again_until_it_ends():
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait([task])
    assert task.cancelled() and swallowed == 3


async def test_a_thread_is_waited_for_to_its_end_when_its_caller_is_cancelled():
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def start_a_server() -> str:
        started.set()
        release.wait(10)
        finished.set()
        return "http://127.0.0.1:1"

    caller = asyncio.create_task(to_thread_to_its_end(start_a_server))
    await wait_until(started.is_set, 10, "the thread to start the server")
    caller.cancel()
    # A caller still waiting gives no sign; one that left its thread behind ends a loop step after the
    # cancellation. So wait for its end, far longer than that step: the end must not come.
    ended, _ = await asyncio.wait({caller}, timeout=0.1)
    assert not ended, "the caller returned while its thread was still starting the server"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert finished.is_set()


async def test_a_thread_returns_its_value_when_nobody_cancels():
    assert await to_thread_to_its_end(sum, [1, 2]) == 3
