"""`GET /v1/jobs` page by page over real HTTP and a real PostgreSQL: a keyset cursor returns every job
exactly once, newest first, even while jobs are inserted between pages; an offset would not. A few
thousand rows, inserted by one statement (the benchmark is the place for millions)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from tests.api.job_steps import submit

pytestmark = pytest.mark.anyio

OLD_JOBS = 3000
PAGE = 250


async def execute(url: str, query: str, params: tuple = ()) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def insert_old_jobs(url: str) -> list[tuple[str, str]]:
    """OLD_JOBS jobs created a day ago, three to each microsecond-exact created_at (ties the id must break),
    statuses in turn; returns their (id, status), newest first as the listing orders them."""
    await execute(url, """
        INSERT INTO jobs (payload, status, created_at)
        SELECT jsonb_build_object('amount_cents', n), (ARRAY['PENDING','RUNNING','SUCCEEDED','DEAD'])[n %% 4 + 1],
               now() - interval '1 day' + (n / 3) * interval '1 second'
        FROM generate_series(1, %s) AS n""", (OLD_JOBS,))
    rows = await execute(url, "SELECT id::text, status FROM jobs ORDER BY created_at DESC, id DESC")
    assert len({row[0] for row in rows}) == OLD_JOBS
    return rows


async def list_page(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await client.get("/v1/jobs", params={"limit": PAGE, **params})
    assert response.status_code == 200, response.text
    return response.json()


async def walk(client: httpx.AsyncClient, between_pages=None, **params: Any) -> list[dict[str, Any]]:
    """Every page from the first to the one whose `next` is null, calling `between_pages(page_number)`
    after each; the jobs in the order listed."""
    listed, cursor, number = [], None, 0
    while True:
        page = await list_page(client, **params, **({"cursor": cursor} if cursor else {}))
        listed += page["jobs"]
        cursor, number = page["next"], number + 1
        if cursor is None:
            return listed
        assert len(page["jobs"]) == PAGE  # only the last page may be short
        if between_pages:
            await between_pages(number)


async def test_pages_return_every_job_once_newest_first(api, databases):
    """Walking every page lists each of 3,000 jobs exactly once, in (created_at, id) order, newest first;
    the last page's `next` is null."""
    old = await insert_old_jobs(databases.queue_url)
    listed = await walk(api)
    assert [job["id"] for job in listed] == [job_id for job_id, _ in old]


async def test_only_the_first_page_counts_the_jobs(api, databases):
    """A count reads the whole table: the first page carries it, the pages after it do not."""
    await insert_old_jobs(databases.queue_url)
    first = await list_page(api)
    assert first["counts"] == {status: OLD_JOBS // 4 for status in ("PENDING", "RUNNING", "SUCCEEDED", "DEAD")}
    assert (await list_page(api, cursor=first["next"]))["counts"] is None


async def test_jobs_inserted_between_pages_make_no_page_repeat_or_skip_an_old_job(api, databases):
    """Between pages, new jobs arrive through the API (newer than any page), and rows whose transaction
    began earlier commit with an old created_at, inside the pages already read and the pages to come.
    Every old job is still listed exactly once, in order; none twice."""
    old = await insert_old_jobs(databases.queue_url)
    ahead, behind = [], []  # jobs that sort after every cursor handed out, and before

    async def insert(number: int) -> None:
        behind.append((await submit(api, 100 + number))["id"])
        # As transactions that began a while ago and commit now would: an old created_at, one older than
        # every old job (ahead of any cursor), one newer (among the pages already read).
        for days, among in ((-3, ahead), (-0.5, behind)):
            (row,) = await execute(databases.queue_url, """
                INSERT INTO jobs (payload, created_at) VALUES ('{}', now() + %s * interval '1 day')
                RETURNING id::text""", (days,))
            among.append(row[0])
    listed = [job["id"] for job in await walk(api, insert)]

    assert len(listed) == len(set(listed)), "a page repeated a job"
    old_ids = {job_id for job_id, _ in old}
    assert [job_id for job_id in listed if job_id in old_ids] == [job_id for job_id, _ in old]
    assert set(ahead) <= set(listed) and not set(behind) & set(listed)


async def test_an_offset_would_repeat_a_job_when_one_is_inserted_between_pages(databases):
    """The failure a keyset avoids: OFFSET pages shift when a newer job arrives, and the next page starts
    with the last job of the page before."""
    await insert_old_jobs(databases.queue_url)
    by_offset = "SELECT id FROM jobs ORDER BY created_at DESC, id DESC LIMIT %s OFFSET %s"
    first = await execute(databases.queue_url, by_offset, (PAGE, 0))
    await execute(databases.queue_url, "INSERT INTO jobs (payload) VALUES ('{}')")
    second = await execute(databases.queue_url, by_offset, (PAGE, PAGE))
    assert second[0] == first[-1]


async def test_a_status_filter_combines_with_the_cursor(api, databases):
    """`?status=` with the cursor pages through that status only, each job once, in order; a cursor
    from a page of one status continues another from the same position."""
    old = await insert_old_jobs(databases.queue_url)
    for status in ("SUCCEEDED", "dead"):
        listed = await walk(api, status=status)
        assert [job["id"] for job in listed] == [job_id for job_id, s in old if s == status.upper()]
    first_all = await list_page(api)
    pending_after = await list_page(api, status="PENDING", cursor=first_all["next"])
    boundary = [job_id for job_id, _ in old].index(first_all["jobs"][-1]["id"])
    expected = [job_id for job_id, s in old[boundary + 1:] if s == "PENDING"][:PAGE]
    assert [job["id"] for job in pending_after["jobs"]] == expected


def _cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


# The old base64 cursors, and texts a digit, a hex digit or a newline off a cursor's shape (16 digits, ".",
# 32 lowercase hex digits).
BAD_CURSORS = ["", "not a cursor", "%%%", _cursor_of("foo/bar"), _cursor_of(f"2026-01-01T00:00:00/{uuid.UUID(int=0)}"),
               _cursor_of(f"2026-01-01T00:00:00+00:00/{uuid.UUID(int=0)}/more"), "1" * 15 + "." + "a" * 32,
               "1" * 16 + "." + "A" * 32, "1" * 16 + "." + "a" * 31, "1" * 16 + "." + "a" * 32 + "\n"]


async def test_a_cursor_no_page_gave_out_is_400_with_one_line(api):
    """Garbage, base64 of something else, a time without its zone, a part too many: 400 naming the
    cursor, in one line."""
    for cursor in BAD_CURSORS:
        response = await api.get("/v1/jobs", params={"cursor": cursor, "status": "PENDING"})
        assert response.status_code == 400, cursor
        message = response.json()["error"]
        assert "cursor" in message and "\n" not in message, cursor


async def test_a_single_page_says_there_is_no_next(api):
    """Fewer jobs than the limit: one page, `next` null; exactly the limit: still no next page."""
    ids = {(await submit(api, amount))["id"] for amount in (100, 200)}
    assert (await list_page(api))["next"] is None
    page = await list_page(api, limit=2)
    assert page["next"] is None and {job["id"] for job in page["jobs"]} == ids
    first = await list_page(api, limit=1)
    rest = await list_page(api, limit=1, cursor=first["next"])
    assert first["next"] is not None and rest["next"] is None
    assert {first["jobs"][0]["id"], rest["jobs"][0]["id"]} == ids
