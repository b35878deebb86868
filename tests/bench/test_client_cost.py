"""The client-cost scenario's instruments (reliableq/bench/client_cost.py): round trips counted as the
operations that waited for the server's answer, on a real PostgreSQL; a profile written where asked."""

from __future__ import annotations

import json

import psycopg
import pytest

from reliableq.bench.client_cost import RoundTrips, profiled


async def _counted(conn: psycopg.AsyncConnection, work) -> int:
    before = RoundTrips.count
    await work(conn)
    return RoundTrips.count - before


async def test_round_trips_are_the_operations_that_waited_for_an_answer(databases):
    unwrapped = psycopg.AsyncConnection.wait
    async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
        with RoundTrips.counting():
            async def one_statement(conn):
                await conn.execute("SELECT 1")

            async def in_a_transaction(conn):  # BEGIN, the statement, COMMIT
                async with conn.transaction():
                    await conn.execute("SELECT 1")

            async def nothing_to_commit(conn):  # autocommit: psycopg sends nothing
                await conn.commit()

            async def pipelined(conn):  # three statements, one answer awaited
                async with conn.pipeline():
                    for _ in range(2):
                        await conn.execute("SELECT 1")
                    # The last answer comes well after the last byte is sent (else, on a loaded machine, every
                    # answer may arrive while psycopg still sends, and no operation waits only to read).
                    await conn.execute("SELECT pg_sleep(0.05)")
            assert await _counted(conn, one_statement) == 1
            assert await _counted(conn, in_a_transaction) == 3
            assert await _counted(conn, nothing_to_commit) == 0
            assert 1 <= await _counted(conn, pipelined) <= 2
            assert (await (await conn.execute("SELECT 41 + 1")).fetchone())[0] == 42  # answers pass through
        assert psycopg.AsyncConnection.wait is unwrapped  # counting ends with the block
        assert await _counted(conn, one_statement) == 0


async def test_a_profile_is_written_with_its_round_trips_even_when_the_run_fails(databases, tmp_path):
    path = tmp_path / "profiles" / "run.pstats"
    with pytest.raises(RuntimeError):
        with profiled(path):
            async with await psycopg.AsyncConnection.connect(databases.queue_url, autocommit=True) as conn:
                for _ in range(4):
                    await conn.execute("SELECT 1")
            raise RuntimeError("stopped")
    totals = json.loads(path.with_suffix(".json").read_text())
    assert totals["round_trips"] >= 4 and totals["cpu_seconds"] > 0  # connecting waits too
    assert f"{totals['round_trips']} round trips" in path.with_suffix(".txt").read_text()
    assert path.stat().st_size > 0
