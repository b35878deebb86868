"""Group commit: callers that arrive while a commit is in flight share the next one.

A commit costs a round trip, a WAL flush and (in Python) a good deal of driver CPU whatever it holds;
grouping pays that once for many rows. Nobody waits for a group to fill: a lone caller is committed at
once, and a group forms only from the callers that queued up behind a commit already running. Each
caller still learns its own result, and a failed commit fails every caller in its group, none of which
was acknowledged. Used by the worker for successes and by the API for single submissions.

The one rule that keeps nobody waiting forever: a committer leaves the set of running committers in the
same step (no await in between) as it finds nothing waiting, so every caller that queued finds either a
committer that will still look at the waiting list, or room to start one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommitter(Generic[Item, Result]):
    """`commit(items)` stores a group and returns one result per item, in order. Up to `in_flight`
    commits run at once (on separate connections); callers queue, and group, only behind those."""

    def __init__(self, commit: Callable[[list[Item]], Awaitable[Sequence[Result]]], max_group: int,
                 in_flight: int = 1) -> None:
        if max_group < 1 or in_flight < 1:
            raise ValueError("a group holds at least one item, and at least one commit may run")
        self._commit, self.max_group, self.in_flight = commit, max_group, in_flight
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._committers: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        """Items queued behind the commits running, for the next group."""
        return len(self._waiting)

    async def submit(self, item: Item) -> Result:
        """Commit `item` with whichever others are waiting; its result once the group committed."""
        result = asyncio.get_running_loop().create_future()
        self._waiting.append((item, result))
        if len(self._committers) < self.in_flight:
            self._committers.add(asyncio.create_task(self._commit_waiting()))
        return await result

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting[:self.max_group], self._waiting[self.max_group:]
                try:
                    results = await self._commit([item for item, _ in group])
                except asyncio.CancelledError:
                    _settle(group, cancel=True)
                    raise
                except BaseException as error:
                    # Each caller reacts as to its own commit failing. BaseException, not Exception: a fault
                    # hook's SimulatedCrash (reliableq.hooks) must reach every caller of the group too.
                    _settle(group, error=error)
                    continue
                _settle(group, results=results)
        finally:
            # Not in a done-callback: that runs a loop iteration later, and a caller queuing in between
            # would count this committer as running and start none (its item then waits for a stranger).
            self._committers.discard(asyncio.current_task())

    def abandon(self) -> None:
        """As a crash would: whatever is not committed yet stays uncommitted, and its callers are cancelled."""
        for committer in self._committers:
            committer.cancel()
        self._committers.clear()  # cancelled committers look at nothing more
        _settle(self._waiting, cancel=True)
        self._waiting = []


def _settle(group: list[tuple[Item, asyncio.Future]], results: Sequence | None = None,
            error: BaseException | None = None, cancel: bool = False) -> None:
    for index, (_, future) in enumerate(group):
        if future.done():  # its caller was cancelled while it waited
            continue
        if cancel:
            future.cancel()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(results[index])
