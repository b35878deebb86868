"""The connection pool every part of the queue borrows from (reliableq/db.py `BoundedPool`)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from psycopg.pq import TransactionStatus

from reliableq import db


class Interrupted(Exception):
    """What a crash or a Stop raises into a borrower."""


async def _left_open_then_borrowed_again(url: str, interrupted: bool) -> tuple[TransactionStatus, str | None]:
    """A borrower opens a transaction with BEGIN and returns its connection without ending it, normally or
    interrupted by an exception; the next borrower's transaction status and what it sees of the first's."""
    pool = await db.open_pool_checked(url, max_size=1, hold_seconds=5)
    try:
        try:
            async with pool.connection() as conn:
                await conn.execute("BEGIN")
                await conn.execute("SELECT set_config('reliableq.left_open', 'committed', false)")
                if interrupted:
                    raise Interrupted
        except Interrupted:
            pass
        async with pool.connection() as conn:
            status = conn.pgconn.transaction_status
            left = await (await conn.execute("SELECT current_setting('reliableq.left_open', true)")).fetchone()
    finally:
        await pool.close()
    return status, left[0]


@pytest.mark.parametrize("interrupted", [False, True], ids=["returned", "interrupted"])
async def test_a_transaction_its_borrower_left_open_is_rolled_back_not_committed(databases, caplog, interrupted):
    """The pool's connections are autocommit: what a borrower opened with BEGIN and never ended must not
    take effect; the next borrower gets the connection idle."""
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        status, left = await _left_open_then_borrowed_again(databases.queue_url, interrupted)
    assert status == TransactionStatus.IDLE
    assert left in (None, ""), "the open transaction was committed when its connection came back"
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    if interrupted:
        # A crash or a Stop inside a transaction is expected: nothing to tell (a notebook shows each
        # warning under the cell that ran, as stderr).
        assert warned == []
    else:
        assert any("rolling back returned connection" in message for message in warned), warned


async def test_a_borrower_cancelled_inside_its_transaction_leaves_the_connection_idle(databases, caplog):
    """A task cancelled while it holds a transaction open, as a worker is on a crash or at shutdown."""
    pool = await db.open_pool_checked(databases.queue_url, max_size=1, hold_seconds=5)
    began = asyncio.Event()

    async def borrower() -> None:
        async with pool.connection() as conn:
            await conn.execute("BEGIN")
            began.set()
            await asyncio.Event().wait()

    try:
        with caplog.at_level(logging.WARNING, logger="psycopg"):
            task = asyncio.create_task(borrower())
            await asyncio.wait_for(began.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with pool.connection() as conn:
                status = conn.pgconn.transaction_status
    finally:
        await pool.close()
    assert status == TransactionStatus.IDLE
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
