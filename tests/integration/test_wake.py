"""Wake on submit (reliableq/wake.py) against real PostgreSQL: a submission's commit wakes an idle
worker, which claims at once rather than at its next poll; a notification means a committed job; a
listener whose connection is lost hears again; and with wake off only the poll finds a job."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from reliableq import sql
from reliableq.handlers import HandlerRegistry, Outcome
from reliableq.lab.harness import fast_settings, local_system
from reliableq.lab.waiting import wait_until
from reliableq.payload import Submission
from reliableq.queue import Queue
from reliableq.wake import CHANNEL, RECONNECT_SECONDS

pytestmark = pytest.mark.anyio

# Long enough that a claim within WAKE_BOUND_SECONDS can only have come from a notification.
POLL_SECONDS = 60.0
# Generous, for a loaded CI machine: a notification is heard in milliseconds (the benchmark measures it).
WAKE_BOUND_SECONDS = 3.0
NOOP = Submission(payload={}, kind="noop")


async def idle_worker(system, wake_on_submit: bool):
    """A worker that has made its first claim (finding nothing) and now waits out its long poll; with wake
    on, once it is marked idle and its listener listens. A submission before then may wait for the poll,
    as reliableq/wake.py says (beside a loaded run one did, here)."""
    worker = system.worker(fast_settings(poll_seconds=POLL_SECONDS, wake_on_submit=wake_on_submit))
    system.start_worker(worker)
    await wait_until(lambda: worker.stats.claim_calls >= 1, 5, "the worker's first claim")
    if wake_on_submit:
        await wait_until(lambda: _marked_and_listening(system), 10, "the worker's idle mark and its LISTEN")
    return worker


async def _marked_and_listening(system) -> bool:
    async with system.queue.pool.connection() as conn:
        marked, listening = await (await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM idle_workers WHERE until > clock_timestamp()),"
            " EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            "         AND query LIKE 'LISTEN %%' AND state = 'idle')")).fetchone()
    return marked and listening


async def test_a_submission_wakes_an_idle_worker_long_before_its_poll(databases):
    async with local_system(databases=databases, api=False, charge=False) as system:
        worker = await idle_worker(system, wake_on_submit=True)
        for _ in range(3):  # each one wakes it: the listener keeps listening
            job = await system.submit_direct(NOOP)
            await system.wait_for_status(job.id, {"SUCCEEDED"}, timeout=WAKE_BOUND_SECONDS)
        assert worker.stats.succeeded == 3
        await system.stop_workers()


@pytest.mark.slow
async def test_without_wake_a_submission_waits_for_the_poll(databases):
    """The failure wake-on-submit removes: the job sits PENDING while the worker sleeps out its poll."""
    async with local_system(databases=databases, api=False, charge=False) as system:
        await idle_worker(system, wake_on_submit=False)
        job = await system.submit_direct(NOOP)
        with pytest.raises(TimeoutError):
            await system.wait_for_status(job.id, {"RUNNING", "SUCCEEDED"}, timeout=WAKE_BOUND_SECONDS)
        await system.stop_workers()


async def test_a_worker_whose_listener_is_cut_off_hears_again(databases):
    async with local_system(databases=databases, api=False, charge=False) as system:
        await idle_worker(system, wake_on_submit=True)
        async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as admin:
            async def listener_pid() -> int | None:
                row = await (await admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
                )).fetchone()
                return row and row[0]
            await wait_until(listener_pid, 5, "the worker's LISTEN session")
            await admin.execute("SELECT pg_terminate_backend(%s)", (await listener_pid(),))
            job = await system.submit_direct(NOOP)  # while the listener is gone: found on its reconnect
            await system.wait_for_status(job.id, {"SUCCEEDED"}, timeout=RECONNECT_SECONDS + WAKE_BOUND_SECONDS)
            # Idle again before the next: a submission racing the worker's new idle mark may wait for the
            # poll, by design (reliableq/wake.py); CI once sent it in that window.
            await wait_until(lambda: _marked_and_listening(system), 10, "the worker's idle mark and its LISTEN again")
            later = await system.submit_direct(NOOP)  # and heard again once it listens
            await system.wait_for_status(later.id, {"SUCCEEDED"}, timeout=WAKE_BOUND_SECONDS)
        await system.stop_workers()


@pytest.mark.slow
async def test_a_notification_comes_only_with_the_commit_of_an_insert_and_only_while_a_worker_is_idle(databases):
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as listener, \
            await psycopg.AsyncConnection.connect(databases.queue_url) as writer:
        await listener.execute(f"LISTEN {CHANNEL}")
        await writer.execute("INSERT INTO jobs (payload) VALUES ('{}')")
        await writer.commit()
        assert [n async for n in listener.notifies(timeout=0.3)] == []  # nobody idle: nothing to wake
        await writer.execute("INSERT INTO idle_workers (worker_id, until) VALUES ('w', now() + interval '1 hour')")
        await writer.commit()
        await writer.execute("INSERT INTO jobs (payload) VALUES ('{}'), ('{}')")
        assert [n async for n in listener.notifies(timeout=0.3)] == []  # not committed: nothing heard
        await writer.rollback()
        assert [n async for n in listener.notifies(timeout=0.3)] == []  # rolled back: never heard
        await writer.execute("INSERT INTO jobs (payload) VALUES ('{}'), ('{}')")
        await writer.commit()
        heard = [n async for n in listener.notifies(timeout=1.0)]
        assert [n.channel for n in heard] == [CHANNEL]  # one per statement, however many rows


async def test_a_mark_that_ran_out_wakes_nobody_and_is_cleared_by_the_next_mark(pool, databases):
    """A killed worker's mark, not renewed, stops making submissions notify once it runs out; an hour
    later the next worker's mark clears it."""
    queue = Queue(pool)
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        await conn.execute("INSERT INTO idle_workers (worker_id, until) VALUES ('killed', now() - interval '1 s')")
        await queue.submit(NOOP)
        assert [n async for n in conn.notifies(timeout=0.3)] == []
        await conn.execute("UPDATE idle_workers SET until = now() - interval '2 hours'")
        await queue.mark_idle("alive", seconds=60)
        await queue.submit(NOOP)
        assert [n.channel async for n in conn.notifies(timeout=1.0)] == [CHANNEL]
        rows = await (await conn.execute("SELECT worker_id, until > now() FROM idle_workers")).fetchall()
    assert rows == [("alive", True)]


async def test_a_worker_renews_its_mark_at_each_idle_poll(databases):
    async with local_system(databases=databases, api=False, charge=False) as system:
        worker = system.worker(fast_settings(poll_seconds=0.2))
        system.start_worker(worker)
        async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
            async def until() -> object:
                row = await (await conn.execute("SELECT until FROM idle_workers")).fetchone()
                return row and row[0]
            first = await wait_until(until, 5, "the worker's mark")
            await wait_until(lambda: later_than(until, first), 5, "the mark renewed")
        await system.stop_workers()


async def later_than(read, earlier) -> bool:
    return (await read()) > earlier


async def test_a_mark_says_whether_it_was_live_so_a_worker_knows_when_to_claim_once_more(pool, databases):
    """A new mark, or one renewed after it ran out, was not live: a submission meanwhile found nobody idle
    and notified nobody, so the worker claims once more at once. A renewal in time was live."""
    queue = Queue(pool)
    assert await queue.mark_idle("worker-1", seconds=60) is False
    assert await queue.mark_idle("worker-1", seconds=60) is True
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
        await conn.execute("UPDATE idle_workers SET until = now() - interval '1 s'")
    assert await queue.mark_idle("worker-1", seconds=60) is False
    await queue.mark_busy("worker-1")
    assert await queue.mark_idle("worker-1", seconds=60) is False


async def test_a_worker_is_marked_idle_only_while_it_finds_nothing(databases):
    """Busy workers make submissions silent (no notifying commits under load); an idle one is marked,
    unmarked when it claims, and unmarked when it stops."""
    async def idle_marks() -> list[str]:
        async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
            return [row[0] for row in await (await conn.execute("SELECT worker_id FROM idle_workers")).fetchall()]

    async with local_system(databases=databases, api=False, charge=False) as system:
        blocked = asyncio.Event()

        async def wait_for_the_test(job):
            await blocked.wait()
            return Outcome("ok", "released")
        handlers = HandlerRegistry()
        handlers.register("noop", wait_for_the_test)
        worker = system.worker(fast_settings(poll_seconds=POLL_SECONDS, concurrency=1), handlers=handlers)
        system.start_worker(worker)
        await wait_until(lambda: idle_marks_now(idle_marks, [worker.worker_id]), 5, "the idle mark")
        await system.submit_direct(NOOP)  # takes its only permit: busy
        await wait_until(lambda: idle_marks_now(idle_marks, []), WAKE_BOUND_SECONDS, "the mark taken back")
        blocked.set()
        await wait_until(lambda: idle_marks_now(idle_marks, [worker.worker_id]), WAKE_BOUND_SECONDS, "idle again")
        await system.stop_workers()
    assert await idle_marks() == []


async def idle_marks_now(read, expected: list[str]) -> bool:
    return await read() == expected


def test_the_schema_notifies_the_channel_the_workers_listen_on():
    assert f"pg_notify('{CHANNEL}'" in sql.schema("queue")
