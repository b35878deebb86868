"""What a client may submit (reliableq/payload.py): defaults, and each refusal naming its field."""

from __future__ import annotations

import pytest

from reliableq.payload import InvalidSubmission, parse_submission


def test_submission_defaults_and_fields():
    """A minimal body is a USD charge with the default budget."""
    parsed = parse_submission({"amount_cents": 1250})
    assert parsed.payload == {"amount_cents": 1250, "currency": "USD"}
    assert parsed.max_attempts == 5
    full = parse_submission({"amount_cents": 1, "currency": "EUR", "description": "tea", "max_attempts": 2})
    assert full.payload["description"] == "tea" and full.max_attempts == 2


@pytest.mark.parametrize("body, fragment", [
    ([1, 2], "JSON object"),
    ({}, "amount_cents is required"),
    ({"amount_cents": "12"}, "amount_cents must be an integer"),
    ({"amount_cents": 12.5}, "amount_cents must be an integer"),
    ({"amount_cents": True}, "amount_cents must be an integer"),
    ({"amount_cents": 0}, "amount_cents must be between"),
    ({"amount_cents": -5}, "amount_cents must be between"),
    ({"amount_cents": 10**13}, "amount_cents must be between"),
    ({"amount_cents": 5, "currency": "usd"}, "currency"),
    ({"amount_cents": 5, "description": 7}, "description"),
    ({"amount_cents": 5, "max_attempts": 0}, "max_attempts"),
    ({"amount_cents": 5, "colour": "red"}, "unknown field(s): colour"),
])
def test_bad_submissions_are_refused_with_the_field_named(body, fragment):
    """Each refusal names the field and what is wrong."""
    with pytest.raises(InvalidSubmission, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_submission(body)
