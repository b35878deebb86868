"""The HTTP API clients submit jobs through, and operators inspect and replay them with.

`POST /v1/jobs` answers 202 in the order commit_before_ack says: only after the insert has committed
(the real system), or before it (the naive order, where a crash in between loses an acknowledged job).
reliableq/acknowledgement.py holds both orders and runs them; this module maps what they end in to HTTP.
`POST /v1/jobs/batch` does the same for up to MAX_BATCH_JOBS jobs stored by one statement: all of them
or none. A submission names its `kind` (or gets the default one); the API accepts the kinds it was given, each
payload checked by its kind's validator. Bad input, an unknown kind included, gets a 4xx with a one-line
message and stores nothing. This module does not run jobs.
A client that retries a submission whose answer it never heard (the API crashed after the commit, the
connection dropped) sends an `Idempotency-Key` header (in a batch, a `submission_key` per job): the
same key with the same body is answered with the job it first made, never a second one; with another
body, 409. A key is held for the API's window (24 h by default), enforced by a UNIQUE key in the
database whichever API process answers. `GET /metrics` serves Prometheus metrics (reliableq/metrics.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from psycopg_pool import PoolTimeout
from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from reliableq import api_contract as contract
from reliableq import db, sql
from reliableq.acknowledgement import (
    NotAcknowledged,
    Store,
    SubmissionOrder,
    Submitted,
    acknowledge_in_order,
    finish,
    shipped_order,
)
from reliableq.config import (
    DEFAULT_REPLAY_BUDGET,
    DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS,
    MAX_BATCH_BYTES,
    MAX_BATCH_JOBS,
    MAX_PAYLOAD_BYTES,
    Mechanisms,
)
from reliableq.group_commit import GroupCommitter
from reliableq.hooks import FaultHook
from reliableq.metrics import JOB_COUNT_SECONDS, ApiMetrics
from reliableq.payload import InvalidSubmission, JobKinds, Submission, parse_batch, parse_submission, submission_key
from reliableq.position import ListPosition
from reliableq.queue import STATUSES, Job, KeyReused, Queue, Stored, idempotency_key, json_row
from reliableq.tokens import bearer_matches

log = logging.getLogger("reliableq.api")
Parsed = TypeVar("Parsed")
# /health/ready's own bound on its `SELECT 1`, well inside the second a probe may wait for its answer.
READINESS_SECONDS = 0.5
# What a 503 tells clients to wait: the pool tries the database afresh for the next request that comes.
RETRY_AFTER_SECONDS = 1
# Paths a load balancer or orchestrator probes without the API's token.
HEALTH_PATHS = ("/healthz", "/health/live", "/health/ready")


def _error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status_code)


# A submission answered 503 after the database was asked to store it: it may be stored (a commit that
# went through before the connection broke, or one still waiting for a synchronous standby).
MAY_BE_STORED = ("the job may have been stored: retry with the same Idempotency-Key (in a batch, the same "
                 "submission_key per job), which never stores it twice; a retry without a key may store it again")
SUBMISSION_PATHS = ("/v1/jobs", "/v1/jobs/batch")


def _unavailable(error: BaseException, advice: str = "retry later") -> JSONResponse:
    reason = " ".join(str(error).split())[:150] or "no answer in time"
    return JSONResponse({"error": f"database unavailable ({type(error).__name__}: {reason}); {advice}"},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class _Refused(Exception):
    """A request answered with a 4xx before anything is stored (the app's handler turns it into one)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code, self.message = status_code, message


async def _read_body(request: Request, limit: int, parse: Callable[[Any], Parsed]) -> Parsed:
    """The body, read up to `limit` bytes, decoded as JSON and checked by `parse`; _Refused (413, 400 or
    422) otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Refused(413, f"payload larger than {limit} bytes")
    # Read at most the limit: a chunked body has no Content-Length to refuse it by up front.
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _Refused(413, f"payload larger than {limit} bytes")
    try:
        decoded = json.loads(body)
    except RecursionError:
        raise _Refused(400, "invalid JSON: nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise _Refused(400, f"invalid JSON: {error}"[:300]) from None
    try:
        return parse(decoded)
    except InvalidSubmission as error:
        raise _Refused(422, str(error)) from None


def _receipt(submission: Submission, job_id: uuid.UUID, stored: Stored | None) -> dict[str, Any]:
    """A job's 202 body. `stored`: where a submission with a key went, once known (the naive order
    answers before it stores, and can only promise the job it is about to store)."""
    if stored is not None:
        job_id = stored.job_id
    receipt: dict[str, Any] = {"id": str(job_id), "status": stored.status if stored else "PENDING",
                               "idempotency_key": idempotency_key(submission.kind, job_id)}
    if submission.key is not None:
        receipt |= {"submission_key": submission.key, "replayed": bool(stored and stored.replayed)}
    return receipt


def _with_header_key(submission: Submission, header: str | None) -> Submission:
    """The submission with the key its `Idempotency-Key` header gives; _Refused when the header is not a
    key, or disagrees with the body's `submission_key`."""
    if header is None:
        return submission
    try:
        key = submission_key(header, "Idempotency-Key")
    except InvalidSubmission as error:
        raise _Refused(422, str(error)) from None
    if submission.key not in (None, key):
        raise _Refused(422, "Idempotency-Key and the body's submission_key differ; send one key")
    return dataclasses.replace(submission, key=key)


def _parse_job_id(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


def create_api_app(database_url: str, mechanisms: Mechanisms = Mechanisms(), faults: FaultHook | None = None,
                   api_token: str | None = None, pool_size: int = 10, *, kinds: JobKinds,
                   order: SubmissionOrder | None = None, standby_session: str | None = None,
                   db_timeout: float = db.DEFAULT_DB_TIMEOUT_SECONDS,
                   key_window: float = DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS) -> FastAPI:
    """The API as an ASGI app over the queue's database. `api_token`: require this bearer token.
    `kinds`: the job kinds it accepts, each with its payload check, and the default kind (the stock API:
    reliableq.charge.handler.STANDARD_KINDS); the queue itself knows no kind.
    `order`: how a submission is stored and acknowledged; by default the one `mechanisms` says.
    `standby_session`: what each database session runs first with sync_standby on (a learner's setting);
    by default the shipped synchronous_commit level. With it off, sessions commit locally.
    `db_timeout`: seconds a request waits for a database connection, and then for the database's answer
    (a hung server's), before it is answered 503.
    `key_window`: seconds a submission's idempotency key names its job; an older key names a new one."""
    faults = faults or FaultHook()
    order = order or shipped_order(mechanisms)
    session = ((standby_session or sql.queries("queue")["session_commits_wait_for_standby"])
               if mechanisms.sync_standby else sql.queries("queue")["session_commits_local"])

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Every write the API makes answers a client; with sync_standby on, each commit waits for a
        # synchronous standby if the server has one (set per session: no round trip per submission).
        pool = await db.open_pool_checked(database_url, max_size=pool_size, db_timeout_seconds=db_timeout,
                                          hold_seconds=db_timeout, session_sql=session)
        app.state.queue = queue = Queue(pool, mechanisms, faults)

        async def store_group(submitted: list[tuple[Submission, uuid.UUID]]) -> list[Stored | KeyReused | None]:
            if any(submission.key is not None for submission, _ in submitted):
                return await store_keyed(submitted)
            # One job or many, the batch statement: it reads back no row (the API drew the ids).
            await queue.submit_many([submission for submission, _ in submitted], [job_id for _, job_id in submitted])
            return [None] * len(submitted)

        async def store_keyed(submitted: list[tuple[Submission, uuid.UUID]]) -> list[Stored | KeyReused]:
            """Each submission's own outcome. A key twice in one group (a retry racing its first try) goes
            in a later statement of the same transaction's successor, which finds it held."""
            outcomes: dict[int, Stored | KeyReused] = {}
            waiting = list(range(len(submitted)))
            while waiting:
                keys_now: set[str] = set()
                now, later = [], []
                for index in waiting:
                    key = submitted[index][0].key
                    (later if key in keys_now else now).append(index)
                    if key is not None:
                        keys_now.add(key)
                stored = await queue.submit_keyed([submitted[index][0] for index in now],
                                                  [submitted[index][1] for index in now], key_window,
                                                  all_or_none=False)
                outcomes.update(zip(now, stored, strict=True))
                waiting = later
            return [outcomes[index] for index in range(len(submitted))]
        # Single submissions share inserts and commits: the ones that arrive while a commit runs go in the
        # next, together (a lone request never waits). The driver's CPU per statement was half of what the
        # API spent on a submission; one commit at a time, not five side by side, groups more and was faster
        # at 4 and 16 clients (2,145–2,278 and 4,349–4,494 requests/s against 1,995–2,189 and 3,427–3,697).
        app.state.submissions = GroupCommitter(store_group, MAX_BATCH_JOBS)
        try:
            yield
        finally:
            await pool.close()

    app = _Api(title="ReliableQ API", lifespan=lifespan, api_token=api_token)
    app.router.route_class = _ApiRoute

    @app.exception_handler(_Refused)
    async def refuse(request: Request, refused: _Refused) -> JSONResponse:
        return _error(refused.status_code, refused.message)

    # FastAPI's own refusals (no such route, a method the path lacks, a query parameter not of its type)
    # answer with the same one-line body as the API's.
    @app.exception_handler(HTTPException)
    async def http_refusal(request: Request, refusal: HTTPException) -> JSONResponse:
        path = request.url.path[:200]
        if refusal.status_code == 404:
            return _error(404, f"no such route: {path}")
        if refusal.status_code != 405:
            return _error(refusal.status_code, str(refusal.detail))
        # Starlette's Allow names only the first route on the path; the document lists them all.
        allowed = ", ".join(sorted(_methods_at(request.app, request.scope)))
        return JSONResponse({"error": f"{request.method} is not served at {path}; it takes {allowed}"},
                            status_code=405, headers={"Allow": allowed})

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, invalid: RequestValidationError) -> JSONResponse:
        first = invalid.errors()[0]
        return _error(422, f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}")

    @app.exception_handler(psycopg.OperationalError)  # PoolTimeout included: no connection came in time
    async def database_unavailable(request: Request, error: psycopg.OperationalError) -> JSONResponse:
        # An outage is the operator's to see in one line, not a traceback per request.
        log.warning("%s %s answered 503: database unavailable: %s: %s", request.method, request.url.path,
                    type(error).__name__, " ".join(str(error).split()))
        asked = request.method == "POST" and request.url.path in SUBMISSION_PATHS and not isinstance(error, PoolTimeout)
        return _unavailable(error, MAY_BE_STORED if asked else "retry later")

    token = contract.REFUSED_TOKEN if api_token else {}
    metrics = app.state.metrics = ApiMetrics()  # this app's own registry: apps side by side never collide

    def queue(request: Request) -> Queue:
        return request.app.state.queue

    async def answer(receipt: Callable[[Any], dict[str, Any]], store: Store, submitted: Submitted) -> JSONResponse:
        """202 with `receipt(stored)` once `order` acknowledges, the rest of the order running on as the
        response's background task; a key reused with another body, 409; an outage before the
        acknowledgement, 503 (the app's handler); an order that ends unacknowledged, 500."""
        try:
            acknowledged = await acknowledge_in_order(order, store, submitted, faults,
                                                      raised_as_they_are=(psycopg.OperationalError, KeyReused))
        except KeyReused as reused:
            return _error(409, str(reused))
        except NotAcknowledged as failure:
            cause = failure.__cause__
            log.error("%s (answered 500)%s", failure, f": {cause}" if cause is not None and str(cause) else "")
            return _error(500, str(failure))
        metrics.submissions.inc(1 if isinstance(submitted, uuid.UUID) else len(submitted))
        return JSONResponse(receipt(acknowledged.stored), status_code=202,
                            background=BackgroundTask(finish, acknowledged))

    @app.post("/v1/jobs", status_code=202, response_model=None,
              responses={202: {"model": contract.Accepted}, **contract.SUBMITTED, **contract.UNAVAILABLE, **token},
              openapi_extra=contract.single_job_body(kinds))
    async def submit_job(request: Request) -> JSONResponse:
        submission = await _read_body(request, MAX_PAYLOAD_BYTES, partial(parse_submission, kinds=kinds))
        submission = _with_header_key(submission, request.headers.get("Idempotency-Key"))
        job_id = uuid.uuid4()

        async def store() -> Stored | None:
            outcome = await request.app.state.submissions.submit((submission, job_id))
            if isinstance(outcome, KeyReused):
                raise outcome
            return outcome
        return await answer(partial(_receipt, submission, job_id), store, job_id)

    @app.post("/v1/jobs/batch", status_code=202, response_model=None,
              responses={202: {"model": contract.BatchAccepted}, **contract.SUBMITTED, **contract.UNAVAILABLE, **token},
              openapi_extra=contract.batch_body(kinds))
    async def submit_batch(request: Request) -> JSONResponse:
        """Every job validated before any is stored; all stored by one statement, acknowledged together."""
        if "Idempotency-Key" in request.headers:  # ignored, it would leave a retrying client unprotected
            raise _Refused(422, "a batch takes a submission_key per job, not an Idempotency-Key header")
        submissions = await _read_body(request, MAX_BATCH_BYTES, partial(parse_batch, kinds=kinds))
        job_ids = tuple(uuid.uuid4() for _ in submissions)
        keyed = any(submission.key is not None for submission in submissions)

        async def store() -> list[Stored] | None:
            if not keyed:
                await queue(request).submit_many(submissions, job_ids)
                return None
            return await queue(request).submit_keyed(submissions, job_ids, key_window, all_or_none=True)

        def receipt(stored: list[Stored] | None) -> dict[str, Any]:
            return {"jobs": [_receipt(submission, job_id, outcome) for submission, job_id, outcome
                             in zip(submissions, job_ids, stored or [None] * len(job_ids), strict=True)]}
        return await answer(receipt, store, job_ids)

    @app.get("/v1/jobs", response_model=None, responses={
        200: {"model": contract.JobList},
        400: contract.error("an unknown status, a limit out of range or a cursor no page gave out"),
        **contract.BAD_QUERY, **contract.UNAVAILABLE, **token})
    async def list_jobs(request: Request, status: contract.StatusQuery = None, limit: contract.LimitQuery = 100,
                        cursor: contract.CursorQuery = None) -> JSONResponse:
        """A page of jobs, newest first; its `next` (null on the last page) passed as `cursor` gives the
        following one, with the same `status` filter or another."""
        if status is not None and status.upper() not in STATUSES:
            return _error(400, f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
        if not 1 <= limit <= contract.MAX_LIST_LIMIT:
            return _error(400, f"limit must be between 1 and {contract.MAX_LIST_LIMIT}")
        try:
            after = ListPosition.from_cursor(cursor) if cursor is not None else None
        except ValueError as error:
            return _error(400, str(error))
        page = await queue(request).page(status.upper() if status else None, limit, after)
        # Counted for the first page only: a count reads the whole table, and a walk through a long history
        # would pay it on every page.
        counts = await bounded_counts(request, "GET /v1/jobs") if after is None else None
        return JSONResponse({"jobs": [job.as_json() for job in page.jobs], "counts": counts,
                             "next": page.next.cursor() if page.next else None})

    @app.get("/v1/jobs/{job_id}", response_model=None, responses={
        200: {"model": contract.JobDetail}, 400: contract.error("not a job id (a UUID)"),
        404: contract.error("no such job"), **contract.UNAVAILABLE, **token})
    async def show_job(request: Request, job_id: contract.JobIdPath) -> JSONResponse:
        parsed = _parse_job_id(job_id)
        if parsed is None:
            return _error(400, f"{job_id!r} is not a job id (a UUID)")
        job = await queue(request).get(parsed)
        if job is None:
            return _error(404, f"no job {parsed}")
        attempts = await queue(request).attempts_of(parsed)
        events = await queue(request).events_of(parsed)
        return JSONResponse(job.as_json() | {
            "attempt_history": [json_row(a) for a in attempts], "events": [json_row(e) for e in events]})

    @app.post("/v1/jobs/{job_id}/replay", response_model=None, responses={
        200: {"model": Job}, 400: contract.error("not a job id (a UUID), or a budget out of range"),
        404: contract.error("no such job"), 409: contract.error("the job is not DEAD"), **contract.BAD_QUERY,
        **contract.UNAVAILABLE, **token})
    async def replay_job(request: Request, job_id: contract.JobIdPath,
                         budget: contract.BudgetQuery = DEFAULT_REPLAY_BUDGET) -> JSONResponse:
        parsed = _parse_job_id(job_id)
        if parsed is None:
            return _error(400, f"{job_id!r} is not a job id (a UUID)")
        if not 1 <= budget <= contract.MAX_REPLAY_BUDGET:
            return _error(400, f"budget must be between 1 and {contract.MAX_REPLAY_BUDGET} attempts")
        replayed = await queue(request).replay(parsed, budget)
        if replayed is None:
            job = await queue(request).get(parsed)
            if job is None:
                return _error(404, f"no job {parsed}")
            return _error(409, f"job {parsed} is {job.status}; only DEAD jobs can be replayed")
        return JSONResponse(replayed.as_json())

    @app.get("/health/live", response_model=None, responses={200: {"model": contract.Live}})
    async def live() -> JSONResponse:
        """The process serves requests; the database is not asked (an outage must not restart the API)."""
        return JSONResponse({"status": "ok"})

    @app.get("/health/ready", response_model=None, responses=contract.READY)
    @app.get("/healthz", response_model=None, responses=contract.READY)
    async def ready(request: Request) -> JSONResponse:
        """A transaction that writes commits within READINESS_SECONDS, or 503: a database that answers
        reads while every commit waits for an unreachable synchronous standby cannot take a submission.
        The probe is answered by then whatever the database does: a hung server's query is left to
        finish or fail on its own."""
        check = asyncio.create_task(queue(request).database_commits(READINESS_SECONDS))
        done, _ = await asyncio.wait({check}, timeout=READINESS_SECONDS)
        if not done:
            check.add_done_callback(_discard_outcome)
            return _unavailable(TimeoutError(f"no commit within {READINESS_SECONDS} s (a synchronous standby "
                                             "unreachable, or the server not answering)"))
        if check.exception() is not None:
            return _unavailable(check.exception())
        return JSONResponse({"status": "ok", "mechanisms": mechanisms.describe()})

    @app.get("/metrics", response_model=None, responses={**contract.METRICS, **token})
    async def scrape(request: Request) -> Response:
        """Prometheus' text format. Behind the token like every route but the health probes: job counts
        and rates are the operator's, and a scraper sends the token as easily as a client (Prometheus'
        `authorization` setting). The count is bounded: past JOB_COUNT_SECONDS, or with the database
        down, the reliableq_jobs series are left out and the rest is still answered."""
        return Response(metrics.exposition(await bounded_counts(request, "/metrics")),
                        media_type=CONTENT_TYPE_LATEST)

    async def bounded_counts(request: Request, route: str) -> dict[str, int] | None:
        """Jobs by status, or None past JOB_COUNT_SECONDS or with the database down (logged)."""
        try:
            return await queue(request).counts(within_seconds=JOB_COUNT_SECONDS)
        except psycopg.Error as error:  # PoolTimeout and a cancelled statement included
            log.warning("%s: jobs not counted: %s: %s", route, type(error).__name__, " ".join(str(error).split()))
            return None

    app.openapi = partial(contract.document, app, kinds)
    app.serve_directly()
    return app


class _Api(FastAPI):
    """FastAPI, with two differences.

    A route whose endpoint takes just the Request (the submissions, the readiness probes, the metrics)
    reads its own body and returns its own Response, so it is called before FastAPI's middleware stack,
    router and request handling, which would do nothing for it but cost (the routes matched one by one,
    dependency solving, exit stacks, the response-model path). The stack and the routing alone were a tenth
    of py-spy's samples of a submission; without them the API's CPU a request went 0.43 → 0.39 ms at 4
    clients, 0.30 → 0.24 at 16. Its exceptions go to the app's handlers all the same.

    With `api_token`, every request but a health probe's must carry it (401 otherwise), checked first,
    for every route alike."""

    def __init__(self, *, api_token: str | None, **options: Any) -> None:
        super().__init__(**options)
        self.api_token = api_token
        self.direct_endpoints: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {}

    def serve_directly(self) -> None:
        """Call the endpoints of the routes declared so far that take just the Request directly."""
        self.direct_endpoints = {
            (method, route.path): route.endpoint for route in self.routes if isinstance(route, APIRoute)
            and route.dependant.request_param_name and len(inspect.signature(route.endpoint).parameters) == 1
            for method in route.methods}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        endpoint = self.direct_endpoints.get((scope["method"], scope["path"]))
        refused = self.api_token is not None and scope["path"] not in HEALTH_PATHS and not bearer_matches(
            Headers(scope=scope).get("Authorization"), self.api_token)
        if not refused and endpoint is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        request = Request(scope, receive, send)
        if refused:
            response = _error(401, "missing or wrong bearer token")
        else:
            try:
                response = await endpoint(request)
            except Exception as error:
                handler = next((self.exception_handlers[kind] for kind in type(error).__mro__
                                if kind in self.exception_handlers), None)
                if handler is None:
                    raise  # uvicorn answers 500 and logs it, as Starlette's outermost middleware would have
                response = await handler(request, error)
        await response(scope, receive, send)


class _ApiRoute(APIRoute):
    """A route of the API: one whose template fits a path another route spells out leaves that path to
    it, as OpenAPI matches paths: GET /v1/jobs/batch is a method the batch path lacks (405), not a job id
    (400)."""

    def matches(self, scope: dict[str, Any]) -> tuple[Match, dict[str, Any]]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE and self.param_convertors and any(
                not getattr(route, "param_convertors", True) and route.matches(scope)[0] is not Match.NONE
                for route in scope["app"].router.routes):
            return Match.NONE, {}
        return match, child_scope


def _methods_at(app: FastAPI, scope: dict[str, Any]) -> set[str]:
    """Every method the document lists at the request's path: a path the routes spell out (/v1/jobs/batch)
    takes precedence over a template it also fits (/v1/jobs/{job_id}), as OpenAPI matches paths."""
    fitting = [route for route in app.router.routes if route.matches(scope)[0] is not Match.NONE]
    concrete = [route for route in fitting if not route.param_convertors]
    return {method for route in concrete or fitting for method in getattr(route, "methods", ())}


def _discard_outcome(task: asyncio.Task) -> None:
    """A readiness check answered without: its outcome, retrieved so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()
