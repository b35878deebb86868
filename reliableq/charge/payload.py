"""What a `charge` job's payload holds, checked once for both places that read it: the API at
submission and the charge service on every request, so a payload the API accepts is one the service
accepts (they used to disagree on "USD\n").

`amount_cents` (a positive integer, required), `currency` (three capital letters, default USD) and
`description` (optional text). Anything else is refused with a message naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from reliableq.payload import STORABLE_TEXT_PATTERN, InvalidSubmission, documented, positive_int, storable_text

MAX_AMOUNT_CENTS = 10**12  # fits a bigint with room; larger is a typo, not a charge
MAX_DESCRIPTION_CHARS = 200
CHARGE_FIELDS = ("amount_cents", "currency", "description")
_CURRENCY = re.compile(r"[A-Z]{3}")
# check_charge's rules as the API's document states them. Lengths beside each pattern: Python's `$` also
# matches before a trailing newline, which the check refuses.
CHARGE_PAYLOAD_SCHEMA = {
    "type": "object",
    "properties": {
        "amount_cents": {"type": "integer", "minimum": 1, "maximum": MAX_AMOUNT_CENTS},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$", "minLength": 3, "maxLength": 3, "default": "USD"},
        "description": {"type": "string", "maxLength": MAX_DESCRIPTION_CHARS, "pattern": STORABLE_TEXT_PATTERN},
    },
    "required": ["amount_cents"],
    "additionalProperties": False,
    "example": {"amount_cents": 1250, "currency": "USD"},
}


@documented(CHARGE_PAYLOAD_SCHEMA)
def check_charge(fields: dict[str, Any]) -> dict[str, Any]:
    """The charge payload to store for `fields`, defaults filled in; InvalidSubmission otherwise."""
    unknown = sorted(set(fields) - set(CHARGE_FIELDS))
    if unknown:
        raise InvalidSubmission(f"unknown field(s): {', '.join(unknown)}; a charge takes {', '.join(CHARGE_FIELDS)}")
    if "amount_cents" not in fields:
        raise InvalidSubmission("amount_cents is required")
    payload: dict[str, Any] = {"amount_cents": positive_int(fields["amount_cents"], "amount_cents", MAX_AMOUNT_CENTS)}
    currency = fields.get("currency", "USD")
    # fullmatch: `$` would let a trailing newline through.
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise InvalidSubmission("currency must be three capital letters, such as USD")
    payload["currency"] = currency
    if "description" in fields:
        description = fields["description"]
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise InvalidSubmission(f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters")
        if not storable_text(description):
            raise InvalidSubmission("description must be valid UTF-8 text without NUL characters")
        payload["description"] = description
    return payload
