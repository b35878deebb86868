"""What a client may submit, checked before anything is stored.

A submission is a JSON object: `amount_cents` (a positive integer, required), `currency` (three
capital letters, default USD), `description` (optional text) and `max_attempts` (optional attempt
budget). Anything else is refused with a message saying which field is wrong and why. A batch is
`{"jobs": [<submission>, ...]}`, accepted only if every submission in it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from reliableq.config import DEFAULT_MAX_ATTEMPTS, MAX_BATCH_JOBS

MAX_AMOUNT_CENTS = 10**12  # fits a bigint with room; larger is a typo, not a charge
MAX_DESCRIPTION_CHARS = 200
MAX_ATTEMPTS_LIMIT = 100
_CURRENCY = re.compile(r"^[A-Z]{3}$")
_FIELDS = {"amount_cents", "currency", "description", "max_attempts"}


class InvalidSubmission(ValueError):
    """A submission that must be refused; the message is meant for the client."""


@dataclass(frozen=True)
class Submission:
    payload: dict[str, Any]  # what the handler needs: amount_cents, currency, description
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


def _positive_int(value: Any, name: str, limit: int) -> int:
    # bool is an int in Python, but `true` is not an amount.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSubmission(f"{name} must be an integer, got {type(value).__name__}")
    if not 0 < value <= limit:
        raise InvalidSubmission(f"{name} must be between 1 and {limit}, got {value}")
    return value


def _encodable(text: str) -> bool:
    # Lone surrogates decode from JSON escapes but cannot be stored as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_submission(data: Any) -> Submission:
    """Check a decoded JSON body and return the submission, or raise InvalidSubmission."""
    if not isinstance(data, dict):
        raise InvalidSubmission('a submission must be a JSON object such as {"amount_cents": 1250}')
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidSubmission(f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(_FIELDS))}")
    if "amount_cents" not in data:
        raise InvalidSubmission("amount_cents is required")
    payload: dict[str, Any] = {"amount_cents": _positive_int(data["amount_cents"], "amount_cents", MAX_AMOUNT_CENTS)}
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        raise InvalidSubmission("currency must be three capital letters, such as USD")
    payload["currency"] = currency
    if "description" in data:
        description = data["description"]
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise InvalidSubmission(f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters")
        if "\x00" in description or not _encodable(description):
            raise InvalidSubmission("description must be valid UTF-8 text without NUL characters")
        payload["description"] = description
    max_attempts = DEFAULT_MAX_ATTEMPTS
    if "max_attempts" in data:
        max_attempts = _positive_int(data["max_attempts"], "max_attempts", MAX_ATTEMPTS_LIMIT)
    return Submission(payload=payload, max_attempts=max_attempts)


def parse_batch(data: Any) -> list[Submission]:
    """Check a decoded batch body and return its submissions in order, or raise InvalidSubmission
    naming the first bad one's index: a batch is stored whole or not at all, so one bad job refuses it."""
    if not isinstance(data, dict) or set(data) != {"jobs"}:
        raise InvalidSubmission('the body must be a JSON object {"jobs": [...]} and nothing else')
    jobs = data["jobs"]
    if not isinstance(jobs, list):
        raise InvalidSubmission(f"jobs must be a list of submissions, got {type(jobs).__name__}")
    if not 1 <= len(jobs) <= MAX_BATCH_JOBS:
        raise InvalidSubmission(f"jobs must hold between 1 and {MAX_BATCH_JOBS} submissions, got {len(jobs)}")
    submissions = []
    for index, job in enumerate(jobs):
        try:
            submissions.append(parse_submission(job))
        except InvalidSubmission as error:
            raise InvalidSubmission(f"jobs[{index}]: {error}") from None
    return submissions
