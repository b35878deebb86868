"""Wake on submit: a worker hears of a new job when its insert commits, instead of at its next poll.

Every insert into `jobs` notifies the channel below in the inserting transaction (a trigger in
sql/queue_schema.sql), and PostgreSQL delivers a notification only once that transaction commits: a
notification always means a committed job, never one a rollback took back. A worker listens on a
connection of its own and, on each notification, claims at once. Notifications coalesce: the worker
wakes once however many arrived while it was busy. They can also be missed (while the listener
reconnects, or for a retry whose time comes later), so the poll stays as the fallback; after each
(re)connect the worker claims once, to find whatever was submitted while nobody listened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("reliableq.wake")
CHANNEL = "reliableq_jobs_submitted"
# A lost listener connection is tried again this often; meanwhile the poll finds every job.
RECONNECT_SECONDS = 1.0


async def listen_for_submissions(pool: AsyncConnectionPool, wake: Callable[[], None], worker_id: str = "") -> None:
    """Call `wake()` for each batch of submission notifications, on a connection of its own made like the
    pool's; reconnect after it is lost. Runs until cancelled."""
    lost_since_said = False
    while True:
        try:
            # The pool's connection settings, not its connections: LISTEN holds a session for as long as
            # it listens, and a pool connection is lent for one statement's while.
            async with await psycopg.AsyncConnection.connect(pool.conninfo, **pool.kwargs) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                if lost_since_said:
                    log.info("worker %s listening for submissions again", worker_id, extra={"worker_id": worker_id})
                    lost_since_said = False
                wake()  # whatever was submitted while nobody listened
                async for _ in conn.notifies():
                    wake()
        except psycopg.OperationalError as error:
            if not lost_since_said:
                log.warning("worker %s stopped hearing of submissions (%s); polling until it hears again",
                            worker_id, " ".join(str(error).split()) or type(error).__name__,
                            extra={"worker_id": worker_id})
                lost_since_said = True
            await asyncio.sleep(RECONNECT_SECONDS)
