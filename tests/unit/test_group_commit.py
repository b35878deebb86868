"""Group commit alone, on plain asyncio: callers group only behind a running commit, each learns its own
result, and no caller is ever left waiting without a committer, whatever order the loop wakes them in."""

from __future__ import annotations

import asyncio
import random

import pytest

from reliableq.group_commit import GroupCommitter


async def test_group_commit_groups_waiting_callers_and_fails_only_their_group():
    """The first caller commits alone; the ones that queue behind it share groups of at most
    `max_group`, each getting its own result; a failed commit fails its group and no other."""
    groups: list[list[int]] = []
    first_commit_started = asyncio.Event()
    release_first = asyncio.Event()

    async def commit(items: list[int]) -> list[int]:
        groups.append(items)
        if len(groups) == 1:
            first_commit_started.set()
            await release_first.wait()
        if 13 in items:
            raise RuntimeError("disk full")
        return [item * 10 for item in items]

    committer = GroupCommitter(commit, max_group=3)
    first = asyncio.ensure_future(committer.submit(1))
    await first_commit_started.wait()
    rest = [asyncio.ensure_future(committer.submit(n)) for n in (11, 12, 13, 21, 22)]
    await asyncio.sleep(0)  # let every caller queue up behind the running commit
    release_first.set()
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert groups == [[1], [11, 12, 13], [21, 22]]
    assert results[0] == 10 and results[4:] == [210, 220]
    assert all(isinstance(r, RuntimeError) for r in results[1:4])


async def test_a_caller_a_task_hop_behind_the_first_shares_its_commit():
    """A committer takes its group a loop turn after it was started: a caller that queues in that turn (in
    the API, a request read beside the first, whose order runs in a task of its own) joins the first commit."""
    groups: list[list[str]] = []

    async def commit(items: list[str]) -> list[str]:
        groups.append(items)
        return [item.upper() for item in items]

    committer = GroupCommitter(commit, max_group=10)

    async def in_a_task_of_its_own(item: str) -> str:
        return await asyncio.create_task(committer.submit(item))

    assert await asyncio.gather(committer.submit("a"), in_a_task_of_its_own("b")) == ["A", "B"]
    assert groups == [["a", "b"]]


async def test_group_commit_runs_up_to_in_flight_commits_side_by_side():
    """With in_flight=2 the first two callers commit at once, alone; later callers group behind them."""
    groups: list[list[str]] = []
    started = [asyncio.Event(), asyncio.Event()]
    release = asyncio.Event()

    async def commit(items: list[str]) -> list[str]:
        groups.append(items)
        if len(groups) <= 2:
            started[len(groups) - 1].set()
            await release.wait()
        return [item.upper() for item in items]

    committer = GroupCommitter(commit, max_group=10, in_flight=2)
    first = asyncio.ensure_future(committer.submit("a"))
    await started[0].wait()
    second = asyncio.ensure_future(committer.submit("b"))
    await started[1].wait()  # a second commit runs beside the first instead of waiting for it
    later = [asyncio.ensure_future(committer.submit(item)) for item in ("c", "d", "e")]
    await asyncio.sleep(0)  # let the later callers queue behind the two running commits
    release.set()
    assert await asyncio.gather(first, second, *later) == ["A", "B", "C", "D", "E"]
    assert groups[:2] == [["a"], ["b"]]
    assert sorted(item for group in groups[2:] for item in group) == ["c", "d", "e"]
    assert len(groups) == 3  # c, d and e shared one commit


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_a_caller_queuing_as_the_last_committers_finish_is_committed(in_flight):
    """The running commits' answers and a new caller wake in one loop iteration, answers first: each
    committer finds nothing waiting and ends, and the caller that queues right then is still committed
    (it used to see the ending committers as running, start none, and wait for a stranger)."""
    loop = asyncio.get_running_loop()
    started = [asyncio.Event() for _ in range(in_flight)]
    answers = [loop.create_future() for _ in range(in_flight)]
    commits: list[list[str]] = []

    async def commit(items: list[str]) -> list[str]:
        n = len(commits)
        commits.append(items)
        if n < in_flight:
            started[n].set()
            await answers[n]
        return [f"committed {item}" for item in items]

    committer = GroupCommitter(commit, max_group=8, in_flight=in_flight)
    early = []
    for n in range(in_flight):
        early.append(asyncio.create_task(committer.submit(f"early-{n}")))
        await started[n].wait()
    caller_wakes = loop.create_future()

    async def late_caller() -> str:
        await caller_wakes
        return await committer.submit("late")

    late = asyncio.create_task(late_caller())
    await asyncio.sleep(0)  # the late caller now waits to be woken
    for answer in answers:
        answer.set_result(None)
    caller_wakes.set_result(None)
    assert await asyncio.gather(*early) == [f"committed early-{n}" for n in range(in_flight)]
    assert await asyncio.wait_for(late, 2) == "committed late"


@pytest.mark.parametrize("seed", range(40))
async def test_every_caller_is_committed_once_whatever_the_interleaving(seed):
    """Seeded interleavings of callers arriving and commits taking a few loop iterations each: every
    item is committed exactly once and every caller gets its own result, promptly."""
    rng = random.Random(seed)
    in_flight = rng.randint(1, 3)
    committed: list[int] = []

    async def commit(items: list[int]) -> list[int]:
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        committed.extend(items)
        return [item * 2 for item in items]

    committer = GroupCommitter(commit, max_group=rng.randint(1, 5), in_flight=in_flight)

    async def caller(item: int) -> int:
        for _ in range(rng.randint(0, 6)):
            await asyncio.sleep(0)
        return await committer.submit(item)

    items = list(range(30))
    results = await asyncio.wait_for(asyncio.gather(*(caller(item) for item in items)), 2)
    assert results == [item * 2 for item in items]
    assert sorted(committed) == items
