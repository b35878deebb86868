"""What a client may submit: the envelope (reliableq/payload.py) and the charge kind's payload
(reliableq/charge/payload.py); defaults, and each refusal naming its field."""

from __future__ import annotations

import pytest

from reliableq.charge.handler import STANDARD_KINDS
from reliableq.payload import InvalidSubmission, JobKinds, parse_batch, parse_submission


def parse(body):
    return parse_submission(body, STANDARD_KINDS)


def test_submission_defaults_and_fields():
    """A minimal body is a USD charge with the default budget."""
    parsed = parse({"amount_cents": 1250})
    assert (parsed.kind, parsed.max_attempts) == ("charge", 5)
    assert parsed.payload == {"amount_cents": 1250, "currency": "USD"}
    full = parse({"amount_cents": 1, "currency": "EUR", "description": "tea", "max_attempts": 2})
    assert full.payload["description"] == "tea" and full.max_attempts == 2


def test_the_kind_chooses_the_check():
    """`kind` and `max_attempts` belong to the queue; the rest is the kind's payload, checked by its kind."""
    noop = parse({"kind": "noop", "max_attempts": 3, "note": "anything"})
    assert (noop.kind, noop.payload, noop.max_attempts) == ("noop", {"note": "anything"}, 3)
    assert parse({"kind": "charge", "amount_cents": 7}).payload == {"amount_cents": 7, "currency": "USD"}


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
    ({"amount_cents": 5, "currency": "USD\n"}, "currency"),  # `$` in a regex would let it through
    ({"amount_cents": 5, "description": 7}, "description"),
    ({"amount_cents": 5, "description": "a\x00b"}, "description"),
    ({"amount_cents": 5, "max_attempts": 0}, "max_attempts"),
    ({"amount_cents": 5, "max_attempts": 101}, "max_attempts"),
    ({"amount_cents": 5, "colour": "red"}, "unknown field(s): colour; a charge takes amount_cents"),
    ({"kind": "mystery"}, "kind: unknown job kind 'mystery'; known: charge, noop"),
    ({"kind": 3}, "kind must be text"),
    ({"kind": "noop", "max_attempts": "3"}, "max_attempts must be an integer"),
    ({"kind": "noop", "x": {"y": "a\x00"}}, "NUL"),
    ({"kind": "noop", "x": float("nan")}, "finite"),
])
def test_bad_submissions_are_refused_with_the_field_named(body, fragment):
    """Each refusal names the field and what is wrong."""
    with pytest.raises(InvalidSubmission, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse(body)


def test_a_check_that_returns_no_object_is_refused():
    """A kind's check must hand back a JSON object; anything else is refused, never stored."""
    with pytest.raises(InvalidSubmission, match="payload must be a JSON object, got list"):
        parse_submission({"kind": "listy"}, JobKinds({"listy": lambda fields: [fields]}))


def test_a_batch_names_the_refused_job():
    """One bad job refuses the batch, named by its index; good batches keep each job's kind in order."""
    with pytest.raises(InvalidSubmission, match=r"jobs\[1\]: kind: unknown job kind 'x'"):
        parse_batch({"jobs": [{"amount_cents": 1}, {"kind": "x"}]}, STANDARD_KINDS)
    parsed = parse_batch({"jobs": [{"amount_cents": 1}, {"kind": "noop"}]}, STANDARD_KINDS)
    assert [s.kind for s in parsed] == ["charge", "noop"]
