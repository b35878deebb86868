"""What a LeaseKeeper says of a lost lease: whether it ran out before a renewal could land (this process
too slow for its lease), or was taken while the worker still held it (no slowness explains that). The
lab's lease-loss invariant excuses only the first (reliableq/lab/invariants.py lease_loss_check)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from reliableq.lab.waiting import wait_until
from reliableq.lease_keeper import LeaseKeeper

LEASE_SECONDS = 0.6
# Long enough that the refusal (a renewal a third of it later) comes well inside it on a loaded machine.
HELD_LEASE_SECONDS = 3.0


async def test_a_process_stalled_past_its_lease_says_its_lease_ran_out_unrenewed(make_queue, submission):
    """The event loop blocked longer than the lease (as a starved process is): no renewal could be sent,
    and the one sent after it is refused. The keeper says the lease ran out unrenewed, and reports the loss."""
    queue = make_queue()
    await queue.submit(submission())
    sent_at = asyncio.get_running_loop().time()
    (job,) = await queue.claim(1, "starved-worker", LEASE_SECONDS)
    lost = asyncio.Event()
    async with LeaseKeeper(queue, job, LEASE_SECONDS, claim_sent_at=sent_at, on_lost=lost.set) as keeper:
        time.sleep(LEASE_SECONDS * 2)  # the stall itself: nothing on this loop runs meanwhile
        await wait_until(lost.is_set, 10, "the keeper to hear of the lost lease")
    assert keeper.ran_out_unrenewed


async def test_a_lease_taken_while_still_held_is_not_put_down_to_slowness(make_queue, submission):
    """Another claim takes the job while this worker's lease still runs by its own clock (here the
    database's clock moved on for that claim): the refusal comes before the keeper's estimate of the
    expiry, so the keeper does not say the lease ran out unrenewed."""
    queue = make_queue()
    await queue.submit(submission())
    sent_at = asyncio.get_running_loop().time()
    (job,) = await queue.claim(1, "held-worker", HELD_LEASE_SECONDS)
    lost = asyncio.Event()
    async with LeaseKeeper(queue, job, HELD_LEASE_SECONDS, claim_sent_at=sent_at, on_lost=lost.set) as keeper:
        later = await queue.database_now() + timedelta(seconds=60)
        assert await queue.claim(1, "rescuer", 30.0, now=later)
        await wait_until(lost.is_set, 10, "the keeper to hear of the lost lease")
    assert not keeper.ran_out_unrenewed


async def test_a_worker_that_does_not_renew_never_says_its_lease_ran_out_unrenewed(make_queue, submission):
    """Leases off: nothing was renewed, so nothing came late. A loss then is the mechanism's absence."""
    queue = make_queue()
    await queue.submit(submission())
    (job,) = await queue.claim(1, "worker", LEASE_SECONDS)
    async with LeaseKeeper(queue, job, LEASE_SECONDS, renewing=False, claim_sent_at=0.0) as keeper:
        keeper.refused()
    assert not keeper.ran_out_unrenewed
