"""The fair claim (sql/queue.sql job_claim_due_fair) on real PostgreSQL: tenant by tenant in turn, each
tenant's first due job before anyone's second, each claim starting one tenant further round; a lone
tenant gets every slot; leases that ran out are taken first; locked rows are skipped; and the tenants
with due work are found through the index, never by reading a backlog. The FIFO claim beside it shows
the starvation it removes."""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from reliableq import sql

FAIR = sql.queries("queue")["job_claim_due_fair"]
FIFO = sql.queries("queue")["job_claim_due_skip_locked"]


def _add(conn: psycopg.Connection, tenant: str, jobs: int, *, run_at: str = "now()") -> list[uuid.UUID]:
    """`jobs` due jobs of `tenant` in one statement, their run_at one microsecond apart (oldest first)."""
    rows = conn.execute(
        f"INSERT INTO jobs (id, kind, payload, max_attempts, tenant, run_at) "
        f"SELECT gen_random_uuid(), 'noop', %s, 5, %s, {run_at} + g * interval '1 microsecond' "
        f"FROM generate_series(1, %s) AS g RETURNING id", [Jsonb({}), tenant, jobs]).fetchall()
    return [row[0] for row in rows]


def _claim(conn: psycopg.Connection, limit: int, query: str = FAIR, worker: str = "w") -> list[dict]:
    return conn.cursor(row_factory=dict_row).execute(query, {
        "now": None, "limit": limit, "reclaim_expired": True, "enforce_budget": True, "worker_id": worker,
        "lease_seconds": 30.0}).fetchall()


def _tenants(rows: list[dict]) -> list[str]:
    return sorted(row["tenant"] for row in rows)


@pytest.fixture
def conn(databases):
    with psycopg.connect(databases.queue_url, autocommit=True) as connection:
        yield connection


def test_a_lone_job_behind_a_backlog_is_taken_within_a_round_not_after_the_backlog(conn):
    """Tenant A's 200 due jobs, then tenant B's one: claims of one job reach B's within two claims (two
    tenants with due work); the FIFO claim reaches it only after all 200 of A's."""
    _add(conn, "A", 200)
    (b_job,) = _add(conn, "B", 1, run_at="now() + interval '1 second' - interval '1 second'")
    fair = [_claim(conn, 1)[0]["id"] for _ in range(2)]
    assert b_job in fair
    conn.execute("UPDATE jobs SET status = 'PENDING', attempts = 0 WHERE status = 'RUNNING'")
    conn.execute("DELETE FROM job_attempts")
    fifo = [_claim(conn, 1, FIFO)[0]["id"] for _ in range(201)]
    assert fifo.index(b_job) == 200


def test_every_tenants_first_before_anyones_second_and_the_round_moves_on(conn):
    """Five tenants with due work, claims of three: each claim takes three different tenants, and five
    claims in a row have started at five different tenants (each tenant first in one of them)."""
    for tenant in "ABCDE":
        _add(conn, tenant, 10)
    claims = [_claim(conn, 3) for _ in range(5)]
    assert all(len(set(_tenants(rows))) == 3 for rows in claims)
    served = Counter(tenant for rows in claims for tenant in _tenants(rows))
    assert served == {tenant: 3 for tenant in "ABCDE"}  # 15 jobs, 3 each: nobody served twice ahead of another


def test_many_tenants_each_reached_within_as_many_claims(conn):
    """Forty tenants, claims of one job: the first forty claims take one job of each tenant."""
    for n in range(40):
        _add(conn, f"t{n:02d}", 3)
    assert sorted(_claim(conn, 1)[0]["tenant"] for _ in range(40)) == [f"t{n:02d}" for n in range(40)]


def test_a_lone_tenant_gets_every_slot_and_spare_slots_go_to_who_has_more(conn):
    """Work-conserving: one tenant alone fills the claim; beside a tenant with one job, the other tenant
    fills the rest."""
    _add(conn, "A", 10)
    assert _tenants(_claim(conn, 4)) == ["A"] * 4
    _add(conn, "B", 1)
    assert _tenants(_claim(conn, 4)) == ["A", "A", "A", "B"]


def test_leases_that_ran_out_are_taken_first_and_every_claim_is_leased(conn):
    """An expired lease is reclaimed before any pending job; claimed jobs are RUNNING with a fresh token,
    one more attempt and an open attempt row (the same taking as the FIFO claim's)."""
    (stale,) = _add(conn, "A", 1)
    conn.execute("UPDATE jobs SET status = 'RUNNING', attempts = 1, lease_token = gen_random_uuid(), "
                 "lease_expires_at = now() - interval '1 minute' WHERE id = %s", [stale])
    _add(conn, "B", 3)
    rows = _claim(conn, 2)
    assert rows[0]["id"] == stale or rows[1]["id"] == stale
    assert all(r["status"] == "RUNNING" and r["lease_token"] and r["lease_expires_at"] for r in rows)
    assert conn.execute("SELECT count(*) FROM job_attempts WHERE outcome IS NULL").fetchone()[0] == 2
    assert conn.execute("SELECT attempts FROM jobs WHERE id = %s", [stale]).fetchone()[0] == 2


def test_a_claim_skips_the_jobs_another_claim_holds(databases, conn):
    """A claim still open in another session holds its jobs (and, until it commits, up to its share of
    each served tenant's next ones): this one takes others, never the same."""
    for tenant in "AB":
        _add(conn, tenant, 8)
    with psycopg.connect(databases.queue_url) as other:  # a transaction left open: its locks held
        held = {row["id"] for row in _claim(other, 4, worker="other")}
        taken = {row["id"] for row in _claim(conn, 4)}
        other.rollback()
    assert len(held) == len(taken) == 4 and not held & taken


def test_the_waiting_tenants_are_found_through_the_index_not_by_reading_the_backlog(conn):
    """A thousand tenants, one with a backlog of 20,000: the claim's plan steps through
    jobs_pending_tenant_run_at (a probe per tenant), reads no table sequentially, and touches a number
    of pages set by the tenants, not the backlog."""
    conn.execute("INSERT INTO jobs (id, kind, payload, max_attempts, tenant) SELECT gen_random_uuid(), 'noop', "
                 "'{}', 5, 't' || lpad(g::text, 4, '0') FROM generate_series(1, 1000) AS g")
    _add(conn, "flood", 20_000)
    conn.execute("ANALYZE jobs")
    plan = "\n".join(row[0] for row in conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + FAIR,
        {"now": None, "limit": 8, "reclaim_expired": True, "enforce_budget": True, "worker_id": "w",
         "lease_seconds": 30.0}).fetchall())
    assert "jobs_pending_tenant_run_at" in plan and "Seq Scan on jobs" not in plan, plan
    touched = sum(int(n) for n in __import__("re").findall(r"shared hit=(\d+)", plan.splitlines()[1]))
    assert touched < 20_000 / 10, plan  # a backlog read would touch every one of its pages
