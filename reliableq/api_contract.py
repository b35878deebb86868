"""What the API's OpenAPI document (`/openapi.json`) says each route takes and answers: documentation
only. The API reads and checks request bodies itself (reliableq/payload.py, with its own size limits),
so nothing here validates a request; the schemas below describe those checks, built from the same
constants, and each route's responses list every status it can really answer.

Not a guarantee on its own: tests/api/test_contract.py fuzzes the live API against this document.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Query
from pydantic import BaseModel

from reliableq.config import MAX_BATCH_BYTES, MAX_BATCH_JOBS, MAX_PAYLOAD_BYTES
from reliableq.payload import (
    DEFAULT_TENANT,
    MAX_ATTEMPTS_LIMIT,
    MAX_SUBMISSION_KEY_CHARS,
    STORABLE_TEXT_PATTERN,
    TENANT_PATTERN,
    JobKinds,
    Validator,
    payload_schema,
)
from reliableq.position import CURSOR_CHARS, CURSOR_PATTERN
from reliableq.queue import STATUSES, Job

MAX_LIST_LIMIT = 1000
MAX_REPLAY_BUDGET = 100

# Parameters as the document describes them. `json_schema_extra`, not FastAPI's own constraints: the
# routes check these themselves (400 with their own message), and one check is enough.
StatusQuery = Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)},
                                          description="any case; another value: 400")]
LimitQuery = Annotated[int, Query(json_schema_extra={"minimum": 1, "maximum": MAX_LIST_LIMIT},
                                  description="outside the range: 400")]
CursorQuery = Annotated[str | None, Query(
    json_schema_extra={"pattern": CURSOR_PATTERN, "minLength": CURSOR_CHARS, "maxLength": CURSOR_CHARS},
    description="the `next` of the previous page, as given; absent: the first page; another shape: 400")]
BudgetQuery = Annotated[int, Query(json_schema_extra={"minimum": 1, "maximum": MAX_REPLAY_BUDGET},
                                   description="fresh attempts the replayed job gets; outside the range: 400")]
JobIdPath = Annotated[str, Path(json_schema_extra={"format": "uuid"}, description="not a UUID: 400")]


class Error(BaseModel):
    """Every 4xx and 5xx the API sends: one line saying what is wrong."""

    error: str


class Accepted(BaseModel):
    id: str
    status: str
    idempotency_key: str  # the key the job's effect is made with (the charge service's), not the client's
    # With a client's key only: the key, and whether it already named this job (nothing new was stored).
    submission_key: str | None = None
    replayed: bool | None = None


class BatchAccepted(BaseModel):
    jobs: list[Accepted]


class JobList(BaseModel):
    jobs: list[Job]  # newest first
    counts: dict[str, int] | None  # jobs by status, on the first page only; null after it, or if not counted in 1 s
    next: str | None  # the cursor of the following page; null on the last


class Attempt(BaseModel):
    """One claim of the job (sql/queue.sql job_attempts_of), oldest first."""
    attempt: int
    worker_id: str
    lease_token: uuid.UUID
    claimed_at: datetime
    lease_expires_at: datetime | None
    finished_at: datetime | None  # null while it runs
    # The finalize this claim won, or lost_<operation> (a stale owner refused); expired: reclaimed after its
    # lease ran out; null while it runs.
    outcome: Literal["succeeded", "retried", "dead", "lost_succeed", "lost_retry", "lost_dead", "lost_renew",
                     "expired"] | None
    error: str | None
    retry_delay_seconds: float | None  # a won retry's wait before the next attempt (0 without backoff)


class JobEvent(BaseModel):
    """A submission or an operator's replay, oldest first."""
    at: datetime
    event: Literal["submitted", "replayed"]
    detail: str | None  # the client's key of a submission; the error a replay cleared


# A dataclass like Job, which pydantic documents as one: the stored fields, then the history.
@dataclass(frozen=True, kw_only=True)
class JobDetail(Job):
    attempt_history: list[Attempt]
    events: list[JobEvent]


class Health(BaseModel):
    status: str
    mechanisms: str


class Live(BaseModel):
    status: str


def error(description: str) -> dict[str, Any]:
    return {"model": Error, "description": description}


SUBMISSION_KEY = {"type": "string", "minLength": 1, "maxLength": MAX_SUBMISSION_KEY_CHARS,
                  "pattern": "^[\\x21-\\x7e]+$",
                  "description": "the client's idempotency key: the same key and body name one job, whatever "
                                 "the number of retries (another body: 409); held for the API's window"}
TENANT = {"type": "string", "pattern": TENANT_PATTERN, "default": DEFAULT_TENANT,
          "description": "whose work the job is: with the fairness mechanism, due jobs are claimed tenant by "
                         "tenant in turn, so one tenant's backlog does not hold back another's job"}


# Any JSON value PostgreSQL's jsonb stores (reliableq/payload.py's `storable`): text without NUL, keys too.
STORABLE_VALUE = {"anyOf": [
    {"type": "string", "pattern": STORABLE_TEXT_PATTERN}, {"type": ["number", "boolean", "null"]},
    {"type": "array", "items": {"$ref": "#/components/schemas/StorableValue"}},
    {"type": "object", "propertyNames": {"pattern": STORABLE_TEXT_PATTERN},
     "additionalProperties": {"$ref": "#/components/schemas/StorableValue"}}]}
# A kind whose check documents nothing: any object the database stores.
ANY_PAYLOAD = {"type": "object", "propertyNames": {"pattern": STORABLE_TEXT_PATTERN},
               "additionalProperties": {"$ref": "#/components/schemas/StorableValue"}}


def kind_schema_name(kind: str) -> str:
    """The component naming one kind's submission: `charge` -> ChargeSubmission."""
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", kind)) + "Submission"


def kind_schema(kind: str, check: Validator, default: bool) -> dict[str, Any]:
    """One kind's submission: the queue's envelope and the payload fields its check documents (any
    storable object when it documents none). `kind` may be left out for the `default` kind only."""
    payload = {name: value for name, value in (payload_schema(check) or ANY_PAYLOAD).items() if name != "example"}
    kind_field: dict[str, Any] = {"type": "string", "enum": [kind]}
    if default:
        kind_field["default"] = kind
    return payload | {
        "title": kind_schema_name(kind),
        "properties": {"kind": kind_field, "max_attempts": {"type": "integer", "minimum": 1,
                                                            "maximum": MAX_ATTEMPTS_LIMIT},
                       "submission_key": SUBMISSION_KEY, "tenant": TENANT} | payload.get("properties", {}),
        "required": ([] if default else ["kind"]) + payload.get("required", []),
    }


def kind_components(kinds: JobKinds) -> dict[str, Any]:
    """The document's components for `kinds`: a submission schema per kind."""
    return {kind_schema_name(kind): kind_schema(kind, check, kind == kinds.default)
            for kind, check in kinds.checks.items()} | {"StorableValue": STORABLE_VALUE}


def submission_schema(kinds: JobKinds) -> dict[str, Any]:
    """One job as `POST /v1/jobs` takes it: one of the kinds' submissions, told apart by `kind` (left
    out: the default kind, when the API has it). Its example is the example kind's own, if it has one."""
    refs = {kind: f"#/components/schemas/{kind_schema_name(kind)}" for kind in sorted(kinds.checks)}
    example_kind = kinds.example()
    example = {"kind": example_kind} | (payload_schema(kinds.checks[example_kind]) or {}).get("example", {})
    left_out = f"left out, it is {kinds.default}" if kinds.default else "it is required"
    return {"oneOf": [{"$ref": ref} for ref in refs.values()],
            "discriminator": {"propertyName": "kind", "mapping": refs},
            "description": f"`kind` picks the payload's schema; {left_out}", "example": example}


def request_body(schema: dict[str, Any], limit: int) -> dict[str, Any]:
    """`openapi_extra` declaring a JSON body the route reads itself, of at most `limit` bytes."""
    return {"requestBody": {"required": True, "description": f"JSON, at most {limit} bytes (larger: 413)",
                            "content": {"application/json": {"schema": schema}}}}


def single_job_body(kinds: JobKinds) -> dict[str, Any]:
    key_header = {"name": "Idempotency-Key", "in": "header", "required": False, "schema": SUBMISSION_KEY,
                  "description": "send it with every retry of one request (or as the body's submission_key)"}
    return request_body(submission_schema(kinds), MAX_PAYLOAD_BYTES) | {"parameters": [key_header]}


def batch_body(kinds: JobKinds) -> dict[str, Any]:
    batch = {"type": "object", "required": ["jobs"], "additionalProperties": False,
             "properties": {"jobs": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_JOBS,
                                     "items": submission_schema(kinds)}}}
    return request_body(batch, MAX_BATCH_BYTES)


SUBMITTED = {
    400: error("the body is not JSON"),
    409: error("an idempotency key already names a job submitted with a different body: nothing is stored"),
    413: error("the body is larger than the limit"),
    422: error("the submission is refused (unknown kind, bad field or key): nothing is stored"),
    500: error("the submission failed before it was acknowledged"),
}
# Every route that asks the database: while it is unreachable, answered within the API's --db-timeout.
UNAVAILABLE = {503: error("the database is unavailable; Retry-After says when to try again")}
READY = {200: {"model": Health}, **UNAVAILABLE}
BAD_QUERY = {422: error("a query parameter is not of its type (ranges and values outside them: 400)")}
REFUSED_TOKEN = {401: error("missing or wrong bearer token")}
# /metrics: Prometheus' text format, not JSON; a database that does not answer leaves the job counts out.
METRICS = {200: {"description": "the API's metrics in Prometheus' text exposition format",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}}


def document(app: FastAPI, kinds: JobKinds) -> dict[str, Any]:
    """FastAPI's document for `app`, with the submission schema of each of `kinds`, less the 422 it lists
    on every route with a parameter: where a route can answer 422 it says so itself; elsewhere (a text
    path parameter) it never does."""
    schema = FastAPI.openapi(app)  # built once and cached by FastAPI; what follows is idempotent
    schema["components"]["schemas"].update(kind_components(kinds))
    for operations in schema["paths"].values():
        for operation in operations.values():
            if "HTTPValidationError" in str(operation["responses"].get("422")):
                del operation["responses"]["422"]
    for unused in ("HTTPValidationError", "ValidationError"):
        schema["components"]["schemas"].pop(unused, None)
    return schema
