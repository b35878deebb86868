"""`reliableq submit`, `reliableq jobs`, `reliableq replay` and `reliableq prune`: what an operator does to
the queue, straight through the database (or, for submit, through the API)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

from reliableq import db
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.cli.arguments import UsageError, print_json, run_coroutine, seconds_from
from reliableq.payload import DEFAULT_TENANT, parse_submission


def cmd_submit(args: argparse.Namespace) -> int:
    # Only what was given: the kind's own check says what is missing or does not belong.
    given = {"kind": args.kind, "amount_cents": args.amount, "currency": args.currency,
             "description": args.description, "max_attempts": args.max_attempts, "tenant": args.tenant}
    body: dict[str, Any] = {field: value for field, value in given.items() if value is not None}
    submission = parse_submission(body, STANDARD_KINDS)
    if args.api_url:
        import httpx
        try:
            token = args.token or os.environ.get("RELIABLEQ_API_TOKEN")
            response = httpx.post(f"{args.api_url}/v1/jobs", json=body, timeout=10,
                                  headers={"Authorization": f"Bearer {token}"} if token else {})
        except httpx.HTTPError as error:
            raise db.DatabaseUnavailable(f"cannot reach the API at {args.api_url}: {error}") from error
        if response.status_code != 202:
            raise UsageError(f"the API refused the job: {response.status_code} {response.text}")
        print(response.json()["id"])
        return 0
    job = run_coroutine(_with_queue(lambda queue: queue.submit(submission)))
    print(job.id)
    return 0


async def _with_queue(action):
    from reliableq.queue import Queue
    databases = db.resolve()
    await asyncio.to_thread(db.migrate, databases)
    pool = await db.open_pool_checked(databases.queue_url, max_size=2)
    try:
        return await action(Queue(pool))
    finally:
        await pool.close()


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.action == "show":
        if args.job_id is None:
            raise UsageError("jobs show needs a job id")

        async def show(queue):
            job = await queue.get(args.job_id)
            if job is None:
                raise UsageError(f"no job {args.job_id}")
            history = {"attempt_history": await queue.attempts_of(job.id), "events": await queue.events_of(job.id)}
            return job.as_json() | history
        print_json(run_coroutine(_with_queue(show)))
        return 0

    async def listing(queue):
        return await queue.page(args.status, args.limit), await queue.counts()
    page, counts = run_coroutine(_with_queue(listing))
    print("  ".join(f"{status}={n}" for status, n in counts.items()))
    for job in page.jobs:
        error = f"  {job.last_error}" if job.last_error else ""
        tenant = f"  tenant={job.tenant}" if job.tenant != DEFAULT_TENANT else ""
        print(f"{job.id}  {job.status:<9}  attempts={job.attempts}/{job.max_attempts}  {_what(job)}{tenant}{error}")
    if page.next:  # on stderr: stdout stays one line per job for whoever reads it
        print(f"(more jobs than --limit {args.limit}: raise it, or narrow with --status)", file=sys.stderr)
    return 0


def _what(job) -> str:
    """A job's kind and payload in a few words: a charge by its amount, anything else (another kind, or a
    charge row written past the API) by its payload."""
    amount, currency = job.payload.get("amount_cents"), job.payload.get("currency")
    if job.kind == "charge" and isinstance(amount, int) and isinstance(currency, str):
        return f"charge {amount / 100:.2f} {currency}"
    shown = json.dumps(job.payload, ensure_ascii=False) if job.payload else ""
    return f"{job.kind} {shown[:60]}".rstrip()


def cmd_replay(args: argparse.Namespace) -> int:
    async def replay(queue):
        replayed = await queue.replay(args.job_id, args.budget)
        if replayed is None:
            job = await queue.get(args.job_id)
            raise UsageError(f"no job {args.job_id}" if job is None
                             else f"job {args.job_id} is {job.status}; only DEAD jobs can be replayed")
        return replayed
    job = run_coroutine(_with_queue(replay))
    print(f"replayed {job.id}: PENDING, key {job.idempotency_key}, budget now {job.max_attempts} attempts")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """One pass of retention, or (--every) one pass every so often until SIGTERM or Ctrl-C; each pass
    prints what it deleted."""
    from reliableq.config import DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS
    from reliableq.retention import RetentionPolicy, prune, prune_every
    window = seconds_from(args.idempotency_window, "RELIABLEQ_IDEMPOTENCY_WINDOW",
                            DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS)
    try:
        policy = RetentionPolicy(args.older_than, args.dead, args.batch, window)
    except ValueError as error:
        raise UsageError(str(error)) from None

    def report(pruned) -> None:
        print(pruned.describe(), flush=True)

    async def run(queue) -> None:
        if args.every is None:
            report(await prune(queue, policy))
            return
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await prune_every(queue, policy, args.every, stop, report)
    run_coroutine(_with_queue(run))
    return 0
