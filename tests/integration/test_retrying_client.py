"""A client that retries every request it never heard answered, against real API processes SIGKILLed
mid-stream (reliableq/lab/retrying_client.py): without an idempotency key a lost 202 becomes a second
job; with one, acknowledged = stored = distinct keys, and no request makes two jobs."""

from __future__ import annotations

import uuid

import pytest

from reliableq.lab.retrying_client import run_lost_answer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REQUESTS = 40


async def test_with_keys_every_request_is_one_job_through_two_api_kills(databases):
    """The API kills itself right after a commit (its 202 never leaves), then is SIGKILLed from outside
    with 8 requests in flight; the client retries everything unanswered with its key."""
    run = await run_lost_answer(databases, with_keys=True, requests=REQUESTS, concurrency=8, kill_after=20, seed=3)
    assert run.api_kills == 2
    assert run.acknowledged == run.jobs_stored == run.keys_held == REQUESTS
    assert run.duplicated == [] and run.problems == []
    assert all(len(jobs) == 1 for jobs in run.jobs_by_request.values())
    answered = {uuid.UUID(request.answer["id"]) for request in run.requests}
    assert len(answered) == REQUESTS
    # The interleaving the test is for happened: a try committed unanswered, and its retry got its job.
    assert any(request.replayed and request.tries > 1 for request in run.requests)


async def test_without_keys_the_lost_answer_is_a_second_job(databases):
    """One at a time, so exactly one try commits unanswered: its retry is a new job, charged again."""
    run = await run_lost_answer(databases, with_keys=False, requests=6, concurrency=1, seed=3)
    assert run.acknowledged == 6 and run.keys_held == 0
    assert run.jobs_stored == 7
    assert run.duplicated == ["request-1"]
    assert "BROKEN: 1 request(s) became two jobs or more" in "\n".join(run.summary())
