"""What a client may submit, checked before anything is stored: the envelope every job shares, and the
check its kind registered for the rest.

A submission is a JSON object: `kind` (left out, the API's default kind: `charge` for the stock API),
`max_attempts` (optional attempt budget), `submission_key` (optional: the client's idempotency key,
the body's form of the `Idempotency-Key` header) and `tenant` (optional: whose work it is, for the fair
claim; left out, the shared tenant `default`) belong to the queue; every other field is the kind's
payload, checked by the check the API's builder gave for that kind (JobKinds; for `charge`:
reliableq/charge/payload.py). Anything refused raises InvalidSubmission, with a message naming the
field and why. A batch is `{"jobs": [<submission>, ...]}`, accepted only if every submission in it is;
its refusals name the job (`jobs[3]: ...`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reliableq.config import DEFAULT_MAX_ATTEMPTS, MAX_BATCH_JOBS

MAX_ATTEMPTS_LIMIT = 100
MAX_SUBMISSION_KEY_CHARS = 255
# Visible ASCII: a key travels in an HTTP header, where anything else is mangled or refused on the way.
_SUBMISSION_KEY = re.compile(rf"[\x21-\x7e]{{1,{MAX_SUBMISSION_KEY_CHARS}}}")
DEFAULT_TENANT = "default"  # the tenant of every job submitted without one
MAX_TENANT_CHARS = 64
# A tenant is a name an operator reads in listings and logs, and a client's own identifier for a customer.
TENANT_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_TENANT_CHARS - 1}}}$"

# A kind's payload check: returns the payload to store (defaults filled in), or raises ValueError with a
# message for the client.
Validator = Callable[[dict[str, Any]], dict[str, Any]]
# Text PostgreSQL stores (storable_text), as a JSON Schema pattern: no NUL. Lone surrogates cannot be
# written in a JSON body as UTF-8, so only NUL is left to say.
STORABLE_TEXT_PATTERN = "^[^\\x00]*$"


def documented(schema: dict[str, Any]) -> Callable[[Validator], Validator]:
    """Mark a payload check with the JSON Schema of the payload fields it takes, exactly (the API's
    document shows it for the check's kind, beside the envelope's fields): `@documented({...})`."""
    def mark(check: Validator) -> Validator:
        check.payload_schema = schema  # type: ignore[attr-defined]
        return check
    return mark


def payload_schema(check: Validator) -> dict[str, Any] | None:
    """The schema `check` was documented with; None for a check that says nothing of its payload."""
    return getattr(check, "payload_schema", None)


class InvalidSubmission(ValueError):
    """A submission that must be refused; the message is meant for the client."""


@dataclass(frozen=True)
class JobKinds:
    """The job kinds an API accepts, each with its payload check, and the kind of a submission that names
    none (None: every submission names its kind). Given by whoever builds the API: the queue knows no kind."""
    checks: Mapping[str, Validator]
    default: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", dict(self.checks))  # as given now: later registrations change nothing
        if self.default is not None and self.default not in self.checks:
            raise ValueError(f"the default kind {self.default!r} is not one of the kinds {sorted(self.checks)}")

    def example(self) -> str:
        """A kind to name in a message or an example: the default, else the first by name."""
        return self.default or min(self.checks)


@dataclass(frozen=True)
class Submission:
    payload: dict[str, Any]  # what the kind's handler needs
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    kind: str = field(kw_only=True)
    # The client's idempotency key: one job per key (within the API's window), however often it is sent.
    key: str | None = None
    tenant: str = field(default=DEFAULT_TENANT, kw_only=True)  # whose work it is: the fair claim takes turns

    def fingerprint(self) -> str:
        """What a repeat with the same key must match: the job it asks for, not how its JSON was spelt. The
        default tenant is left out, so a key's fingerprint from before tenants existed still matches."""
        asked = {"kind": self.kind, "max_attempts": self.max_attempts, "payload": self.payload}
        return json_sha256(asked if self.tenant == DEFAULT_TENANT else asked | {"tenant": self.tenant})


def json_sha256(value: Any) -> str:
    """A digest of a JSON value that ignores key order and spacing."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def submission_key(value: Any, name: str) -> str:
    """`value` if it is a usable idempotency key; InvalidSubmission naming `name` otherwise."""
    if not isinstance(value, str) or not _SUBMISSION_KEY.fullmatch(value):
        raise InvalidSubmission(f"{name} must be 1 to {MAX_SUBMISSION_KEY_CHARS} visible ASCII characters "
                                "(no spaces), such as a UUID")
    return value


def tenant_name(value: Any) -> str:
    """`value` if it is a usable tenant; InvalidSubmission otherwise."""
    if not isinstance(value, str) or not re.fullmatch(TENANT_PATTERN, value):
        raise InvalidSubmission(f"tenant must be 1 to {MAX_TENANT_CHARS} letters, digits and . _ : @ - , starting "
                                "with a letter or digit, such as \"acme-corp\"")
    return value


def positive_int(value: Any, name: str, limit: int) -> int:
    """`value` if it is an integer in 1..limit; InvalidSubmission naming `name` otherwise. JSON has one
    kind of number: 12.0 is the integer 12 (as JSON Schema's `integer` says), 12.5 is not."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    # bool is an int in Python, but `true` is not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSubmission(f"{name} must be an integer, got {type(value).__name__}")
    if not 0 < value <= limit:
        raise InvalidSubmission(f"{name} must be between 1 and {limit}, got {value}")
    return value


def parse_submission(data: Any, kinds: JobKinds) -> Submission:
    """Check a decoded JSON body against the envelope and its kind's check (from `kinds`), and return the
    submission; InvalidSubmission otherwise."""
    if not isinstance(data, dict):
        raise InvalidSubmission('a submission must be a JSON object such as {"amount_cents": 1250}')
    fields = dict(data)
    kind = fields.pop("kind", kinds.default)
    if kind is None:
        raise InvalidSubmission(f"kind: required; known: {', '.join(sorted(kinds.checks))}")
    if not isinstance(kind, str):
        raise InvalidSubmission(f'kind must be text such as "{kinds.example()}", got {type(kind).__name__}')
    if kind not in kinds.checks:
        raise InvalidSubmission(f"kind: unknown job kind {kind[:40]!r}; known: {', '.join(sorted(kinds.checks))}")
    key = submission_key(fields.pop("submission_key"), "submission_key") if "submission_key" in fields else None
    tenant = tenant_name(fields.pop("tenant")) if "tenant" in fields else DEFAULT_TENANT
    max_attempts = DEFAULT_MAX_ATTEMPTS
    if "max_attempts" in fields:
        max_attempts = positive_int(fields.pop("max_attempts"), "max_attempts", MAX_ATTEMPTS_LIMIT)
    try:
        payload = kinds.checks[kind](fields)
    except InvalidSubmission:
        raise
    except ValueError as error:  # a registered check speaks to the client through ValueError
        raise InvalidSubmission(str(error)) from None
    return Submission(payload=storable(payload), max_attempts=max_attempts, kind=kind, key=key, tenant=tenant)


def storable(payload: Any) -> dict[str, Any]:
    """`payload` if PostgreSQL's jsonb can hold it; InvalidSubmission otherwise. Checked for every kind,
    whatever its own check let through: a row the database refuses would fail the whole group of
    submissions committed with it."""
    if not isinstance(payload, dict):
        raise InvalidSubmission(f"payload must be a JSON object, got {type(payload).__name__}")
    for value in _scalars(payload):
        if isinstance(value, str):
            if not storable_text(value):
                raise InvalidSubmission("payload text must be valid UTF-8 without NUL characters")
        elif isinstance(value, float) and not math.isfinite(value):  # jsonb has no NaN or Infinity
            raise InvalidSubmission("payload numbers must be finite")
    return payload


def _scalars(value: Any):
    """Every key and every value but the objects and arrays that hold them, in a decoded JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)
    else:
        yield value


def storable_text(text: str) -> bool:
    """Whether PostgreSQL can store `text`: no NUL, and no lone surrogates (they decode from JSON
    escapes but cannot be encoded as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def parse_batch(data: Any, kinds: JobKinds) -> list[Submission]:
    """Check a decoded batch body and return its submissions in order, or raise InvalidSubmission
    naming the first bad one's index: a batch is stored whole or not at all, so one bad job refuses it."""
    if not isinstance(data, dict) or set(data) != {"jobs"}:
        raise InvalidSubmission('the body must be a JSON object {"jobs": [...]} and nothing else')
    jobs = data["jobs"]
    if not isinstance(jobs, list):
        raise InvalidSubmission(f"jobs must be a list of submissions, got {type(jobs).__name__}")
    if not 1 <= len(jobs) <= MAX_BATCH_JOBS:
        raise InvalidSubmission(f"jobs must hold between 1 and {MAX_BATCH_JOBS} submissions, got {len(jobs)}")
    submissions: list[Submission] = []
    first_with_key: dict[str, int] = {}
    for index, job in enumerate(jobs):
        try:
            submission = parse_submission(job, kinds)
        except InvalidSubmission as error:
            raise InvalidSubmission(f"jobs[{index}]: {error}") from None
        if submission.key is not None:
            if submission.key in first_with_key:
                first = first_with_key[submission.key]
                raise InvalidSubmission(f"jobs[{index}]: submission_key repeats jobs[{first}]'s; a key names one job")
            first_with_key[submission.key] = index
        submissions.append(submission)
    return submissions


def accept_any_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The check of a kind that takes any JSON object (the request's size limit still bounds it)."""
    return payload
