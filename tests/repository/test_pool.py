"""The connection pool every part of the queue borrows from (reliableq/db.py `BoundedPool`)."""

from __future__ import annotations

from psycopg.pq import TransactionStatus

from reliableq import db


async def test_a_transaction_its_borrower_left_open_is_rolled_back_not_committed(databases):
    """The pool's connections are autocommit: what a borrower opened with BEGIN and never ended is its
    own mistake, and nothing of it may take effect; the next borrower gets the connection idle."""
    pool = await db.open_pool_checked(databases.queue_url, max_size=1, hold_seconds=5)
    try:
        async with pool.connection() as conn:
            await conn.execute("BEGIN")
            await conn.execute("SELECT set_config('reliableq.left_open', 'committed', false)")
        async with pool.connection() as conn:
            status = conn.pgconn.transaction_status
            left = await (await conn.execute("SELECT current_setting('reliableq.left_open', true)")).fetchone()
    finally:
        await pool.close()
    assert status == TransactionStatus.IDLE
    assert left[0] in (None, ""), "the open transaction was committed when its connection came back"
