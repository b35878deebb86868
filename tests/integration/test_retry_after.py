"""Retry-After: a charge service that answers 503 (or 429) with `Retry-After` is not asked again before
it; without the header, backoff alone decides; with backoff off, nothing waits (the lab's failure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import psycopg
import pytest

from reliableq.charge.client import RETRY_AFTER_MAX_SECONDS, retry_after_seconds
from reliableq.charge.service import ChargeFaults
from reliableq.config import Mechanisms
from reliableq.lab.harness import fast_settings, local_system
from reliableq.payload import Submission

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("header", "seconds"), [
    ("3", 3.0), (" 7 ", 7.0), ("0", 0.0),
    (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
    (format_datetime(NOW - timedelta(seconds=90), usegmt=True), 0.0),  # already past: no wait of its own
    ("Thursday, 03-Dec-26 12:00:30 GMT", 30.0),  # RFC 850, still allowed to arrive
    ("999999999", RETRY_AFTER_MAX_SECONDS),
    (None, None), ("", None), ("soon", None), ("-1", None), ("1.5", None), ("\uff13", None),
])
def test_retry_after_is_read_as_seconds_or_a_date_and_bounded(header, seconds):
    assert retry_after_seconds(header, NOW) == seconds


async def first_retry_delay(databases, retry_after: int | None, mechanisms: Mechanisms = Mechanisms()) -> float:
    """Seconds between a job's first retry and the time it is due again, the charge service refusing
    every request with 503 (and `retry_after`)."""
    faults = ChargeFaults(transient_rate=1.0, retry_after_seconds=retry_after)
    async with local_system(mechanisms, charge_faults=faults, databases=databases, api=False) as system:
        job = await system.submit_direct(Submission({"amount_cents": 1250, "currency": "USD"}, max_attempts=10,
                                                    kind="charge"))
        system.start_worker(system.worker(fast_settings()))

        async def retried_once() -> bool:
            row = await system.queue.get(job.id)
            return row.attempts >= 1 and row.status == "PENDING"
        await system.wait_until(retried_once, 10, "the first retry")
        await system.stop_workers()
    async with await psycopg.AsyncConnection.connect(databases.queue_url) as conn:
        (delay,) = await (await conn.execute(
            "SELECT extract(epoch FROM run_at - updated_at) FROM jobs WHERE id = %s", (job.id,))).fetchone()
    return float(delay)


async def test_a_retry_is_not_due_before_the_services_retry_after(databases):
    assert 5.0 <= await first_retry_delay(databases, retry_after=5) < 5.5


async def test_without_the_header_backoff_alone_decides(databases):
    assert await first_retry_delay(databases, retry_after=None) <= fast_settings().backoff_max_seconds


async def test_with_backoff_off_nothing_waits_not_even_for_retry_after(databases):
    """Each attempt follows the last at once, though the service asked for 5 s. Read from the attempts'
    history once the job is DEAD: a PENDING job due at once is claimed again too soon to be seen reliably."""
    faults = ChargeFaults(transient_rate=1.0, retry_after_seconds=5)
    async with local_system(Mechanisms(backoff=False), charge_faults=faults, databases=databases,
                            api=False) as system:
        job = await system.submit_direct(Submission({"amount_cents": 1250, "currency": "USD"}, max_attempts=3,
                                                    kind="charge"))
        system.start_worker(system.worker(fast_settings()))
        await system.wait_settled([job.id], timeout=10)
        await system.stop_workers()
    async with await psycopg.AsyncConnection.connect(databases.queue_url) as conn:
        gaps = [gap for (gap,) in await (await conn.execute(
            "SELECT extract(epoch FROM claimed_at - lag(finished_at) OVER (ORDER BY attempt)) FROM job_attempts "
            "WHERE job_id = %s ORDER BY attempt", (job.id,))).fetchall()]
    assert len(gaps) == 3 and gaps[0] is None
    assert max(gaps[1:]) < 1.0  # not the 5 s asked for
