"""Job kinds as registered handlers (reliableq/handlers.py): registering, checking payloads, running."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from reliableq.handlers import HandlerRegistry, JobContext, Outcome, noop
from reliableq.payload import InvalidSubmission, JobKinds, accept_any_payload, parse_submission
from reliableq.queue import Job
from tests.conftest import recording_handlers


def job_of_kind(kind: str, payload: dict | None = None, attempts: int = 1) -> Job:
    now = datetime.now(UTC)
    job_id = uuid.uuid4()
    return Job(id=job_id, payload=payload or {}, status="RUNNING", attempts=attempts, max_attempts=5, run_at=now,
               lease_token=uuid.uuid4(), lease_expires_at=now, worker_id="w", last_error=None,
               idempotency_key=f"key:{job_id}", created_at=now, updated_at=now, finalized_at=None, kind=kind,
               tenant="default")


def positive_n(payload: dict) -> dict:
    if not isinstance(payload.get("n"), int) or payload["n"] < 1:
        raise ValueError("n must be a positive integer")
    return payload


def test_register_runs_the_handler_with_the_jobs_context():
    """A registered handler receives the job's id, payload, attempt and idempotency key."""
    registry, seen = recording_handlers("record", Outcome("transient", "later"))
    job = job_of_kind("record", {"n": 1}, attempts=3)
    assert asyncio.run(registry.handle(job)) == Outcome("transient", "later")
    assert seen == [JobContext(job.id, {"n": 1}, 3, job.idempotency_key)]


def test_a_kind_is_registered_once():
    """Registering a second handler for one kind is refused, not a silent replacement."""
    registry = HandlerRegistry()
    registry.register("noop", noop)
    with pytest.raises(ValueError, match="'noop' is already registered"):
        registry.register("noop", noop)


def test_each_kind_validates_its_own_payload():
    """A kind's check runs for that kind only; a kind registered without one accepts any payload."""
    registry = HandlerRegistry()
    registry.register("counted", noop, validate=positive_n)
    registry.register("noop", noop)
    assert parse_submission({"kind": "counted", "n": 2}, JobKinds(registry.validators)).payload == {"n": 2}
    with pytest.raises(InvalidSubmission, match="n must be a positive integer"):
        parse_submission({"kind": "counted", "n": 0}, JobKinds(registry.validators))
    kinds = JobKinds(registry.validators)
    assert parse_submission({"kind": "noop", "anything": True}, kinds).payload == {"anything": True}


def test_an_unknown_kind_is_refused_and_fails_permanently():
    """Refused at submission naming the field and the known kinds; if one reaches a worker anyway (a row
    inserted past the API), a permanent failure."""
    registry = HandlerRegistry()
    registry.register("noop", noop)
    with pytest.raises(InvalidSubmission, match="kind: unknown job kind 'mystery'; known: noop"):
        parse_submission({"kind": "mystery"}, JobKinds(registry.validators))
    outcome = asyncio.run(registry.handle(job_of_kind("mystery")))
    assert outcome == Outcome("permanent", "no handler for job kind 'mystery'")


def test_validators_are_a_copy():
    """What an API was given cannot change under it when more kinds are registered later."""
    registry = HandlerRegistry()
    given = registry.validators
    registry.register("noop", noop)
    assert given == {} and list(registry.validators) == ["noop"]


def test_job_kinds_are_fixed_when_given_and_name_a_default_they_hold():
    """An API's kinds are what its builder gave: a check registered later changes nothing, and a default
    kind that is not one of them is a wiring mistake said at once."""
    checks = {"noop": accept_any_payload}
    kinds = JobKinds(checks, default="noop")
    checks["late"] = accept_any_payload
    assert list(kinds.checks) == ["noop"]
    assert parse_submission({}, kinds).kind == "noop"
    with pytest.raises(ValueError, match="the default kind 'charge' is not one of the kinds"):
        JobKinds({"noop": accept_any_payload}, default="charge")
