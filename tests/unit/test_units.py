"""Pure pieces, no database: backoff, submissions, error sanitising, switches, the SQL loader."""

from __future__ import annotations

import pytest

from reliableq import sql
from reliableq.backoff import Backoff
from reliableq.charge.client import classify_status
from reliableq.config import Mechanisms, WorkerSettings
from reliableq.lab.faults import FaultPlan
from reliableq.payload import InvalidSubmission, parse_submission
from reliableq.queue import sanitize_error


def test_backoff_ceiling_doubles_then_caps():
    """The jitter window is base * 2^(n-1), capped at max."""
    backoff = Backoff(base_seconds=0.5, max_seconds=4.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.ceiling(10_000) == 4.0


def test_backoff_full_jitter_stays_in_window_and_is_seeded():
    """Delays fall in [0, ceiling]; a seed reproduces them per job and attempt, another seed differs."""
    seeded = Backoff(0.5, 60.0, seed=42)
    delays = [seeded.delay(n, "job-a") for n in range(1, 9)]
    assert all(0 <= d <= seeded.ceiling(n) for n, d in enumerate(delays, start=1))
    assert delays == [Backoff(0.5, 60.0, seed=42).delay(n, "job-a") for n in range(1, 9)]
    assert delays != [Backoff(0.5, 60.0, seed=43).delay(n, "job-a") for n in range(1, 9)]
    assert seeded.delay(3, "job-a") != seeded.delay(3, "job-b")


def test_backoff_spreads_a_burst():
    """Full jitter: 200 jobs failing together retry over the whole window, not in lockstep."""
    backoff = Backoff(1.0, 60.0, seed=1)
    delays = sorted(backoff.delay(4, f"job-{i}") for i in range(200))
    assert delays[0] < 1.0 and delays[-1] > 7.0
    assert len({round(d, 3) for d in delays}) > 190


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


def test_sanitize_error_strips_secrets_and_bounds_length():
    """Stored errors are one line, bounded, without credentials."""
    text = sanitize_error("failed\r\n postgresql://u:pw@host/db token=abc\x00 " + "y" * 900)
    assert "pw@" not in text and "abc" not in text and "\n" not in text and "\x00" not in text
    assert len(text) == 500 and text.startswith("failed postgresql://u:***@host/db token=***")


@pytest.mark.parametrize("secret", [
    "Authorization: Bearer abc123secret", "api_token=abc123secret", "client_secret=abc123secret",
    "X-Api-Key: abc123secret", '{"password": "abc123secret"}', "postgresql://u:abc@123secret@host/db",
])
def test_sanitize_error_hides_secrets_in_their_usual_spellings(secret):
    """Headers, keyed assignments, JSON fields and URLs with an @ in the password all lose the secret."""
    assert "123secret" not in sanitize_error(f"charge failed: {secret} (retrying)")


@pytest.mark.parametrize("status, kind", [
    (200, "ok"), (201, "ok"), (408, "transient"), (429, "transient"), (500, "transient"), (503, "transient"),
    (400, "permanent"), (409, "permanent"), (422, "permanent"),
])
def test_status_classification(status, kind):
    """408, 429 and 5xx may succeed later; other 4xx will not."""
    assert classify_status(status) == kind


def test_mechanisms_are_ordered_and_switchable():
    """The flags come in stage order; up_to turns on a prefix; unknown names are refused."""
    assert Mechanisms.names() == ["commit_before_ack", "skip_locked", "leases", "fencing", "idempotency",
                                  "backoff", "dead", "semaphore"]
    assert Mechanisms.up_to("leases").off() == ["fencing", "idempotency", "backoff", "dead", "semaphore"]
    assert Mechanisms.up_to(None) == Mechanisms.all_off()
    assert Mechanisms.up_to("semaphore") == Mechanisms()
    with pytest.raises(ValueError, match="unknown mechanism"):
        Mechanisms().without("speed")


def test_worker_settings_refuse_nonsense():
    """Zero concurrency or a non-positive lease is a configuration error, not a hang."""
    with pytest.raises(ValueError, match="concurrency"):
        WorkerSettings(concurrency=0)
    with pytest.raises(ValueError, match="lease_seconds"):
        WorkerSettings(lease_seconds=0)


def test_fault_points_are_named():
    """Arming an unknown point is an error, not a silent no-op."""
    with pytest.raises(ValueError, match="unknown fault point"):
        FaultPlan().arm_crash("somewhere")


def test_every_named_query_is_loaded_and_nonempty():
    """The loader finds each `-- name:` block; the core's queries exist."""
    queue, charge = sql.queries("queue"), sql.queries("charge")
    for name in ("job_insert", "job_claim_due_skip_locked", "job_select_due", "job_mark_claimed",
                 "job_renew_lease", "job_succeed", "job_retry", "job_dead", "job_replay"):
        assert queue[name].strip()
    assert "ON CONFLICT (idempotency_key) DO NOTHING" in charge["charge_insert_once"]
    assert all(not text.lstrip().startswith("--") for text in {**queue, **charge}.values())


async def test_served_connections_turn_nagle_off():
    """Connections accepted on a `bind_listener` socket (what uvicorn serves on) have TCP_NODELAY:
    without it a response written as head then body waited 40 ms for a delayed ACK."""
    import asyncio
    import socket

    from reliableq.servers import bind_listener

    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            raw = transport.get_extra_info("socket")
            accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    listener = bind_listener("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
