"""What a LeaseKeeper says of a lost lease: whether it ran out before a renewal could land (this process
too slow for its lease), or was taken while the worker still held it (no slowness explains that). The
lab's lease-loss invariant excuses only the first (reliableq/lab/invariants.py lease_loss_check)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from reliableq.lab.waiting import wait_until
from reliableq.lease_keeper import LeaseKeeper
from reliableq.queue import Queue

LEASE_SECONDS = 0.6
# Long enough that the refusal (a renewal a third of it later) comes well inside it on a loaded machine.
HELD_LEASE_SECONDS = 3.0


ClaimWithKeeper = tuple[Queue, LeaseKeeper, asyncio.Event]


@pytest.fixture
def claimed_with_keeper(make_queue, submission) -> Callable[..., Awaitable[ClaimWithKeeper]]:
    """Submit one job, claim it as `worker_id` for `lease_seconds`, and give the claim a LeaseKeeper, not
    yet started, as a worker does: counting the lease from just before the claim was sent, and setting
    the returned event when it hears the lease was lost. `keeper_options` override its arguments."""
    async def claim(worker_id: str, lease_seconds: float, **keeper_options: Any) -> ClaimWithKeeper:
        queue = make_queue()
        await queue.submit(submission())
        sent_at = asyncio.get_running_loop().time()
        (job,) = await queue.claim(1, worker_id, lease_seconds)
        lost = asyncio.Event()
        options = {"claim_sent_at": sent_at, "on_lost": lost.set} | keeper_options
        return queue, LeaseKeeper(queue, job, lease_seconds, **options), lost
    return claim


async def test_a_process_stalled_past_its_lease_says_its_lease_ran_out_unrenewed(claimed_with_keeper):
    """The event loop blocked longer than the lease (as a starved process is): no renewal could be sent,
    and the one sent after it is refused. The keeper says the lease ran out unrenewed, and reports the loss."""
    _, keeper, lost = await claimed_with_keeper("starved-worker", LEASE_SECONDS)
    async with keeper:
        time.sleep(LEASE_SECONDS * 2)  # the stall itself: nothing on this loop runs meanwhile
        await wait_until(lost.is_set, 10, "the keeper to hear of the lost lease")
    assert keeper.ran_out_unrenewed


async def test_a_lease_taken_while_still_held_is_not_put_down_to_slowness(claimed_with_keeper):
    """Another claim takes the job while this worker's lease still runs by its own clock (here the
    database's clock moved on for that claim): the refusal comes before the keeper's estimate of the
    expiry, so the keeper does not say the lease ran out unrenewed."""
    queue, keeper, lost = await claimed_with_keeper("held-worker", HELD_LEASE_SECONDS)
    async with keeper:
        later = await queue.database_now() + timedelta(seconds=60)
        assert await queue.claim(1, "rescuer", 30.0, now=later)
        await wait_until(lost.is_set, 10, "the keeper to hear of the lost lease")
    assert not keeper.ran_out_unrenewed


async def test_a_worker_that_does_not_renew_never_says_its_lease_ran_out_unrenewed(claimed_with_keeper):
    """Leases off: nothing was renewed, so nothing came late. A loss then is the mechanism's absence."""
    # Granted at time 0.0, the lease ran out long ago by the keeper's clock: only renewing=False keeps
    # the refusal from being put down to a late renewal.
    _, keeper, _ = await claimed_with_keeper("worker", LEASE_SECONDS, renewing=False, claim_sent_at=0.0)
    async with keeper:
        keeper.refused()
    assert not keeper.ran_out_unrenewed
