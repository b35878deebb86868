"""The retention scenario's whole-history listing check (reliableq/bench/retention.py): it holds for the
real keyset pages, and fails for pages that skip a job or repeat one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reliableq.bench.retention import _insert_history, _listed_once
from reliableq.lab.harness import local_system
from reliableq.position import ListPosition

pytestmark = pytest.mark.anyio

HISTORY = 2_500  # three pages of the largest page, the last one short


async def listing_check(databases, broken=None):
    async with local_system(databases=databases, api=False, charge=False) as system:
        await _insert_history(system, HISTORY)
        if broken is not None:
            system.queue.page = broken(system.queue.page)
        check, _ = await _listed_once(system)
    return check


async def test_every_job_of_the_history_is_listed_once(databases):
    check = await listing_check(databases)
    assert check.held, check.violations
    assert check.note.startswith(f"{HISTORY:,} jobs in 3 pages")


async def test_pages_that_skip_a_job_fail_the_check(databases):
    def skipping(page):
        async def first_dropped(**kwargs):
            found = await page(**kwargs)
            return replace(found, jobs=found.jobs[1:]) if kwargs.get("after") else found
        return first_dropped
    check = await listing_check(databases, skipping)
    assert not check.held and check.violations == [{"stored": HISTORY, "listed_distinct": HISTORY - 2}]


async def test_pages_that_repeat_a_job_fail_the_check(databases):
    def repeating(page):
        async def overlapping(**kwargs):
            found = await page(**kwargs)
            if found.next is None:
                return found
            second_last = found.jobs[-2]  # the next page starts one job early: the last one again
            return replace(found, next=ListPosition(second_last.created_at, second_last.id))
        return overlapping
    check = await listing_check(databases, repeating)
    assert not check.held and {v.get("listed") for v in check.violations} == {2}
