"""Wake on submit: a worker hears of a new job when its insert commits, instead of at its next poll.

Every insert into `jobs` notifies the channel below in the inserting transaction (a trigger in
sql/migrations/queue/0001_schema.sql), and PostgreSQL delivers a notification only once that transaction
commits: a notification always means a committed job, never one a rollback took back. A worker listens on
a connection of its own and, on each notification, claims at once. Notifications coalesce: the worker
wakes once however many arrived while it was busy. They can also be missed (while the listener
reconnects, or for a retry whose time comes later), so the poll stays as the fallback; after each
(re)connect the worker claims once, to find whatever was submitted while nobody listened.

A notifying commit takes a lock that serialises every notifying commit on the server (it halved
single-row inserts from 16 clients here), so a submission notifies only while some worker is idle: a
worker says so (`IdleMark`) when a claim with free permits found nothing, renews it at each idle poll,
and takes it back when it claims again. Under load every worker is busy and nothing notifies. A mark runs
out a few polls after its last renewal, so a killed worker's mark does not keep every submission
notifying. Whenever a mark was not live before (new, or run out), the worker claims once more at once, for
a job submitted while nobody was marked; one whose insert checked while the mark was on its way and
committed after that claim waits for the poll (sql/migrations/queue/0001_schema.sql says why no gate
closes that window).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from reliableq.queue import Queue

log = logging.getLogger("reliableq.wake")
CHANNEL = "reliableq_jobs_submitted"
# A lost listener connection is tried again this often; meanwhile the poll finds every job.
RECONNECT_SECONDS = 1.0
# A listener only reads, so over TCP a peer that vanished (a host gone, a cut network) would never be
# noticed without keepalives: these find it within about 10 s. libpq ignores them on Unix sockets.
LISTENER_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
# A mark lasts this many polls past its last renewal.
MARK_POLLS = 3


async def listen_for_submissions(pool: AsyncConnectionPool, wake: Callable[[], None], worker_id: str = "") -> None:
    """Call `wake()` for each batch of submission notifications, on a connection of its own made like the
    pool's; reconnect after it is lost. Runs until cancelled."""
    lost_since_said = False
    while True:
        try:
            # The pool's connection settings, not its connections: LISTEN holds a session for as long as
            # it listens, and a pool connection is lent for one statement's while.
            async with await psycopg.AsyncConnection.connect(pool.conninfo,
                                                             **(LISTENER_KEEPALIVES | pool.kwargs)) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                if lost_since_said:
                    log.info("worker %s listening for submissions again", worker_id, extra={"worker_id": worker_id})
                    lost_since_said = False
                wake()  # whatever was submitted while nobody listened
                async for _ in conn.notifies():
                    wake()
        except psycopg.Error as error:
            if not lost_since_said:
                log.warning("worker %s stopped hearing of submissions (%s); polling until it hears again",
                            worker_id, " ".join(str(error).split()) or type(error).__name__,
                            extra={"worker_id": worker_id})
                lost_since_said = True
            await asyncio.sleep(RECONNECT_SECONDS)


class IdleMark:
    """Whether this worker has told the database it waits for work (the idle_workers table)."""

    def __init__(self, queue: Queue, worker_id: str, poll_seconds: float) -> None:
        self.queue, self.worker_id = queue, worker_id
        self.lasts_seconds = MARK_POLLS * poll_seconds
        self.marked = False

    async def after_claim(self, found_nothing: bool) -> bool:
        """Mark or renew after a claim with free permits that found nothing; unmark after one that found
        work. True when the mark was not live before (new, or run out): claim once more at once."""
        if not found_nothing:
            if self.marked:
                await self.unmark()
            return False
        try:
            was_live = await self.queue.mark_idle(self.worker_id, self.lasts_seconds)
        except (psycopg.Error, PoolTimeout):
            return False  # the database is out of reach: the claim says so; the next idle poll marks again
        self.marked = True
        return not was_live

    async def unmark(self) -> None:
        try:
            await self.queue.mark_busy(self.worker_id)
        except (psycopg.Error, PoolTimeout):
            return  # a mark left behind runs out by itself
        self.marked = False
