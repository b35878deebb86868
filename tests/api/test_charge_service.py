"""The charge service over real HTTP and its own real database, and the worker's client for it:
idempotent creation under concurrency, the request log, injected faults and their classification,
seeded determinism, the capacity limit and input validation."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest

from reliableq.api import create_api_app
from reliableq.charge.client import ChargeClient
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.charge.service import ChargeFaults, create_charge_app
from reliableq.lab.waiting import wait_until
from reliableq.queue import idempotency_key
from reliableq.servers import LoopbackServer
from tests.conftest import serve

# Marked here, at collection, so that parametrized async tests keep their parameters (the conftest's
# late marker makes anyio re-create such items without their callspec).
pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 2.0
CHARGE = {"amount_cents": 1250, "currency": "USD"}


async def charge_a_new_job(client: ChargeClient, payload: dict):
    """The client's charge for a job of its own, under that job's key."""
    job_id = uuid.uuid4()
    return await client.charge(job_id, payload, idempotency_key("charge", job_id))


# -- helpers ----------------------------------------------------------------------------------


def charge_service(databases, faults: ChargeFaults | None = None):
    """The charge service on 127.0.0.1 over the test's charge database (it applies its own schema)."""
    return serve(create_charge_app(databases.charge_url, faults))


@asynccontextmanager
async def charge_client(base_url: str, timeout_seconds: float = 5.0, **kwargs: Any) -> AsyncIterator[ChargeClient]:
    client = ChargeClient(base_url, timeout_seconds, **kwargs)
    try:
        yield client
    finally:
        await client.aclose()


async def query(charge_url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows read straight from the charge database on a new connection."""
    async with await psycopg.AsyncConnection.connect(charge_url, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall()


async def count(charge_url: str, table: str) -> int:
    assert table in ("charges", "charge_requests")
    return (await query(charge_url, f"SELECT count(*) FROM {table}"))[0][0]


def charge_body(job_id: uuid.UUID | str, **overrides: Any) -> dict[str, Any]:
    return {"job_id": str(job_id), **CHARGE, **overrides}


def key_header(job_id: uuid.UUID | str) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key("charge", job_id)}


def job_whose_faults_are(faults: ChargeFaults, *sequence: str | None) -> uuid.UUID:
    """A fixed job id whose first requests draw `sequence` under `faults` (seeded, so always the same)."""
    for n in range(10_000):
        job_id = uuid.UUID(int=n + 1)
        if [faults.draw(str(job_id), i) for i in range(len(sequence))] == list(sequence):
            return job_id
    raise AssertionError(f"no job draws {sequence}")


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- idempotency -------------------------------------------------------------------------------


async def test_concurrent_requests_with_one_key_create_exactly_one_charge(databases):
    """20 concurrent identical requests with one key make one charge; all see it, one of them as its creator."""
    job_id = uuid.uuid4()
    async with charge_service(databases) as http:
        responses = await asyncio.gather(*(
            http.post("/v1/charges", json=charge_body(job_id), headers=key_header(job_id)) for _ in range(20)))

    statuses = Counter(response.status_code for response in responses)
    assert statuses == {201: 1, 200: 19}, statuses
    answers = [response.json() for response in responses]
    assert len({answer["charge_id"] for answer in answers}) == 1
    assert [answer["replayed"] for answer in answers].count(False) == 1
    created = next(a for a, r in zip(answers, responses, strict=True) if r.status_code == 201)
    assert created["replayed"] is False
    assert all(a["idempotency_key"] == idempotency_key("charge", job_id) for a in answers)

    rows = await query(databases.charge_url, "SELECT id, job_id, amount_cents, idempotency_key FROM charges")
    assert rows == [(uuid.UUID(created["charge_id"]), job_id, 1250, idempotency_key("charge", job_id))]
    outcomes = await query(databases.charge_url,
                           "SELECT outcome, count(*) FROM charge_requests GROUP BY outcome ORDER BY outcome")
    assert outcomes == [("created", 1), ("replayed", 19)]


async def test_same_key_with_a_different_payload_conflicts(databases):
    """Reusing a key for a different amount is 409 naming the original charge; still one row."""
    job_id = uuid.uuid4()
    async with charge_service(databases) as http:
        first = await http.post("/v1/charges", json=charge_body(job_id), headers=key_header(job_id))
        assert first.status_code == 201
        other = await http.post("/v1/charges", json=charge_body(job_id, amount_cents=9999), headers=key_header(job_id))
        assert other.status_code == 409
        assert "idempotency key" in other.json()["error"]
        assert other.json()["charge_id"] == first.json()["charge_id"]
        # The original payload still replays.
        same = await http.post("/v1/charges", json=charge_body(job_id), headers=key_header(job_id))
        assert (same.status_code, same.json()["charge_id"], same.json()["replayed"]) == (
            200, first.json()["charge_id"], True)
    assert await query(databases.charge_url, "SELECT amount_cents FROM charges") == [(1250,)]


async def test_without_a_key_every_request_creates_a_charge(databases):
    """With no Idempotency-Key (idempotency off), two identical requests create two charges."""
    job_id = uuid.uuid4()
    async with charge_service(databases) as http:
        responses = [await http.post("/v1/charges", json=charge_body(job_id)) for _ in range(2)]
        assert [r.status_code for r in responses] == [201, 201]
        assert responses[0].json()["charge_id"] != responses[1].json()["charge_id"]
        async with charge_client(str(http.base_url), send_idempotency_key=False) as client:
            outcome = await client.charge(job_id, CHARGE, idempotency_key("charge", job_id))
        assert (outcome.kind, outcome.status_code) == ("ok", 201)
    rows = await query(databases.charge_url, "SELECT job_id, idempotency_key FROM charges")
    assert rows == [(job_id, None)] * 3


# -- the request log -------------------------------------------------------------------------------


async def test_every_request_is_logged_including_injected_failures(databases):
    """charge_requests holds one row per request sent, with the status code the caller received."""
    faults = ChargeFaults(seed=11, transient_rate=0.3, permanent_rate=0.2, decline_over_cents=5000)
    jobs = [uuid.UUID(int=n + 1) for n in range(8)]
    drawn = {faults.draw(str(job), 0) for job in jobs}
    assert {"transient", "permanent", None} <= drawn  # the seed gives a mix of outcomes
    sent: list[httpx.Response] = []
    async with charge_service(databases, faults) as http:
        for job in jobs:
            sent.append(await http.post("/v1/charges", json=charge_body(job), headers=key_header(job)))
        # A repeat of each job (its second draw), one declined amount, one conflict and one keyless request.
        for job in jobs:
            sent.append(await http.post("/v1/charges", json=charge_body(job), headers=key_header(job)))
        declined = uuid.UUID(int=100)
        sent.append(await http.post("/v1/charges", json=charge_body(declined, amount_cents=7000)))
        ok = next(job for job in jobs if faults.draw(str(job), 0) is None and faults.draw(str(job), 2) is None)
        sent.append(await http.post("/v1/charges", json=charge_body(ok, amount_cents=1), headers=key_header(ok)))
        stats = (await http.get("/v1/stats")).json()

    received = Counter(r.status_code for r in sent)
    assert {201, 200, 409, 503, 422} <= set(received)
    assert await count(databases.charge_url, "charge_requests") == len(sent) == stats["requests"] == 18
    logged = Counter(dict(await query(databases.charge_url,
                                      "SELECT status_code, count(*) FROM charge_requests GROUP BY status_code")))
    assert logged == received
    created = await query(databases.charge_url, "SELECT count(*) FROM charge_requests WHERE outcome = 'created'")
    assert created[0][0] == await count(databases.charge_url, "charges")


async def test_malformed_requests_are_logged_too(databases):
    """A request refused as malformed (400) is still a request received, so it is logged as well."""
    async with charge_service(databases) as http:
        response = await http.post("/v1/charges", content=b"{not json", headers={"Idempotency-Key": "k"})
        assert response.status_code == 400
    # The schema and module say every request received is logged "whatever became of it".
    assert await query(databases.charge_url, "SELECT status_code FROM charge_requests") == [(400,)]


# -- injected faults and how the client classifies them ------------------------------------------


async def test_transient_fault_is_503_and_classified_transient(databases):
    """transient_rate=1.0 answers 503 before doing anything; the client calls it transient."""
    async with charge_service(databases, ChargeFaults(transient_rate=1.0)) as http:
        async with charge_client(str(http.base_url)) as client:
            outcome = await charge_a_new_job(client, CHARGE)
    assert (outcome.kind, outcome.status_code) == ("transient", 503)
    assert "transient" in outcome.detail
    assert await count(databases.charge_url, "charges") == 0
    assert await count(databases.charge_url, "charge_requests") == 1


async def test_permanent_fault_is_422_and_classified_permanent(databases):
    """permanent_rate=1.0 answers 422; the client calls it permanent (retrying will not help)."""
    async with charge_service(databases, ChargeFaults(permanent_rate=1.0)) as http:
        async with charge_client(str(http.base_url)) as client:
            outcome = await charge_a_new_job(client, CHARGE)
    assert (outcome.kind, outcome.status_code) == ("permanent", 422)
    assert await count(databases.charge_url, "charges") == 0


async def test_declined_amount_is_permanent(databases):
    """An amount over the business limit is declined with 422, classified permanent, and not charged."""
    async with charge_service(databases, ChargeFaults(decline_over_cents=1000)) as http:
        async with charge_client(str(http.base_url)) as client:
            outcome = await charge_a_new_job(client, {"amount_cents": 1001, "currency": "USD"})
    assert (outcome.kind, outcome.status_code) == ("permanent", 422)
    assert "declined" in outcome.detail
    assert await count(databases.charge_url, "charges") == 0


async def test_lost_response_is_ambiguous_while_the_charge_is_committed(databases):
    """A lost response times the client out (ambiguous) although the charge exists; a keyed retry finds it."""
    faults = ChargeFaults(seed=3, lost_response_rate=0.5, hang_seconds=2)
    job_id = job_whose_faults_are(faults, "lost_response", None)
    async with charge_service(databases, faults) as http:
        async with charge_client(str(http.base_url), timeout_seconds=0.3) as client:
            lost = await client.charge(job_id, CHARGE, idempotency_key("charge", job_id))
            assert (lost.kind, lost.status_code, lost.charge_id) == ("ambiguous", None, None)

            async def committed() -> bool:
                return await count(databases.charge_url, "charges") == 1
            await wait_until(committed, DEADLINE_SECONDS, "the charge row to be committed")

            retried = await client.charge(job_id, CHARGE, idempotency_key("charge", job_id))
    assert (retried.kind, retried.status_code) == ("ok", 200)
    [(charge_id, key)] = await query(databases.charge_url, "SELECT id, idempotency_key FROM charges")
    assert (retried.charge_id, key) == (str(charge_id), idempotency_key("charge", job_id))


async def test_lost_response_rate_one_is_ambiguous_with_the_row_committed(databases):
    """lost_response_rate=1.0: the client (0.3 s timeout) sees ambiguous, the charges table has the row."""
    job_id = uuid.uuid4()
    async with charge_service(databases, ChargeFaults(lost_response_rate=1.0, hang_seconds=2)) as http:
        async with charge_client(str(http.base_url), timeout_seconds=0.3) as client:
            outcome = await client.charge(job_id, CHARGE, idempotency_key("charge", job_id))
        assert outcome.kind == "ambiguous"

        async def committed() -> bool:
            return await query(databases.charge_url, "SELECT job_id FROM charges") == [(job_id,)]
        await wait_until(committed, DEADLINE_SECONDS, "the charge row to be committed")


async def test_injected_timeout_is_ambiguous_and_charges_nothing(databases):
    """timeout_rate=1.0 hangs before doing anything: ambiguous to the client, and no charge exists."""
    async with charge_service(databases, ChargeFaults(timeout_rate=1.0, hang_seconds=2)) as http:
        async with charge_client(str(http.base_url), timeout_seconds=0.3) as client:
            outcome = await charge_a_new_job(client, CHARGE)
    assert outcome.kind == "ambiguous"
    assert await count(databases.charge_url, "charges") == 0
    assert await query(databases.charge_url, "SELECT outcome FROM charge_requests") == [("injected_timeout",)]


async def test_unreachable_service_is_transient():
    """Nothing listening on the port: the request never went out, so the outcome is transient."""
    async with charge_client(f"http://127.0.0.1:{closed_port()}", timeout_seconds=0.5) as client:
        outcome = await charge_a_new_job(client, CHARGE)
    assert outcome.kind == "transient"
    assert outcome.status_code is None
    assert "unreachable" in outcome.detail


# -- seeded faults -----------------------------------------------------------------------------


def test_seeded_faults_are_deterministic():
    """draw(job, n) depends only on (seed, job, n): the same sequence twice, another for another seed."""
    job = str(uuid.UUID(int=42))
    first = [ChargeFaults(seed=7, transient_rate=0.5).draw(job, n) for n in range(64)]
    again = [ChargeFaults(seed=7, transient_rate=0.5).draw(job, n) for n in range(64)]
    other_seed = [ChargeFaults(seed=8, transient_rate=0.5).draw(job, n) for n in range(64)]
    assert first == again
    assert first != other_seed
    assert set(first) == {"transient", None}
    # Order of arrival does not matter: each draw is computed on its own.
    faults = ChargeFaults(seed=7, transient_rate=0.5)
    assert [faults.draw(job, n) for n in reversed(range(64))] == list(reversed(first))
    # And another job under the same seed gets its own sequence.
    assert [faults.draw(str(uuid.UUID(int=43)), n) for n in range(64)] != first


@pytest.mark.parametrize("kwargs", [{"transient_rate": -0.1}, {"transient_rate": 0.6, "permanent_rate": 0.5},
                                    {"capacity": 0}])
def test_invalid_fault_settings_are_refused(kwargs):
    """Negative rates, rates adding up to more than 1 and a capacity below 1 are refused."""
    with pytest.raises(ValueError):
        ChargeFaults(**kwargs)


# -- capacity ------------------------------------------------------------------------------------


async def test_requests_over_capacity_are_refused_with_503(databases):
    """With capacity=2, of 6 concurrent slow requests at most 2 are served; the rest get 503 over capacity."""
    faults = ChargeFaults(capacity=2, latency_seconds=0.3)
    async with charge_service(databases, faults) as http:
        async with charge_client(str(http.base_url)) as client:
            outcomes = await asyncio.gather(*(charge_a_new_job(client, CHARGE) for _ in range(6)))
        stats = (await http.get("/v1/stats")).json()

    served = [o for o in outcomes if o.kind == "ok"]
    refused = [o for o in outcomes if o.kind != "ok"]
    assert len(served) <= 2
    assert len(refused) >= 4
    assert all((o.kind, o.status_code) == ("transient", 503) and "over capacity" in o.detail for o in refused)
    assert 2 < stats["in_flight_peak"] <= 6
    assert stats["in_flight"] == 0
    assert stats["requests"] == 6
    assert stats["faults"]["capacity"] == 2
    overloaded = await query(databases.charge_url, "SELECT count(*) FROM charge_requests WHERE outcome = 'overloaded'")
    assert overloaded[0][0] == len(refused)
    assert await count(databases.charge_url, "charges") == len(served)


# -- validation ----------------------------------------------------------------------------------

_JOB = str(uuid.UUID(int=7))


@pytest.mark.parametrize("body", [
    pytest.param(b"{not json", id="invalid-json"),
    pytest.param(b"", id="empty"),
    pytest.param([charge_body(_JOB)], id="array"),
    pytest.param({"amount_cents": 1250, "currency": "USD"}, id="job-id-missing"),
    pytest.param(charge_body("job-7"), id="job-id-not-uuid"),
    pytest.param(charge_body(_JOB, amount_cents="1250"), id="amount-string"),
    pytest.param(charge_body(_JOB, amount_cents=12.5), id="amount-float"),
    pytest.param(charge_body(_JOB, amount_cents=True), id="amount-true"),
    pytest.param(charge_body(_JOB, amount_cents=0), id="amount-zero"),
    pytest.param(charge_body(_JOB, amount_cents=-1), id="amount-negative"),
    pytest.param({"job_id": _JOB, "amount_cents": 1250}, id="currency-missing"),
    pytest.param(charge_body(_JOB, currency="EURO"), id="currency-four-letters"),
    # The API's own check (reliableq/charge/payload.py): what it refused, the service refuses too.
    pytest.param(charge_body(_JOB, currency="USD\n"), id="currency-trailing-newline"),
    pytest.param(charge_body(_JOB, colour="red"), id="unknown-field"),
    # Currently answered with 500 (see the report): they must be refused as malformed too.
    pytest.param(charge_body(_JOB, currency="U\u0000D"), id="currency-nul"),
    pytest.param(charge_body(_JOB, currency="\ud800SD"), id="currency-surrogate"),
    pytest.param(b"[" * 5000 + b"]" * 5000, id="deeply-nested-json"),
])
async def test_malformed_charge_body_is_400_and_charges_nothing(databases, body):
    """A malformed charge request gets 400 with a message, and no charge is created."""
    # Asserted after the server stopped: a 500's traceback is logged by then (see tests/conftest.py serve).
    async with charge_service(databases) as http:
        # json.dumps escapes NUL and lone surrogates (\\u0000, \\ud800), as any JSON client may send them.
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await http.post("/v1/charges", content=content,
                                   headers={"Content-Type": "application/json", **key_header(_JOB)})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("invalid charge request")
    assert await count(databases.charge_url, "charges") == 0


async def test_a_non_object_json_answer_is_classified_not_a_crash():
    """A proxy answering 502 with a bare JSON string is a transient failure, not a client exception."""
    async def bad_gateway(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 502,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'"bad gateway"'})

    server = LoopbackServer(bad_gateway)
    url = await asyncio.to_thread(server.start)
    client = ChargeClient(url, timeout_seconds=2)
    try:
        outcome = await charge_a_new_job(client, {"amount_cents": 1, "currency": "USD"})
    finally:
        await client.aclose()
        await asyncio.to_thread(server.stop)
    assert (outcome.kind, outcome.status_code, outcome.detail) == ("transient", 502, "HTTP 502")


@pytest.mark.parametrize("currency", [
    pytest.param("USD\n", id="trailing-newline"), pytest.param("USD ", id="trailing-space"),
    pytest.param("usd", id="lowercase"), pytest.param("\uff35\uff33\uff24", id="fullwidth-look-alike"),
    pytest.param("U\u0405D", id="cyrillic-look-alike"), pytest.param("\u0391BC", id="greek-look-alike"),
])
async def test_a_currency_the_api_refuses_the_charge_service_refuses_too(databases, currency):
    """One rule for the field (reliableq/charge/payload.py), so no job the API accepts goes DEAD at the
    service over its payload: each hostile spelling is refused by both, and neither stores anything."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as api:
        submitted = await api.post("/v1/jobs", json={"amount_cents": 1250, "currency": currency})
    async with charge_service(databases) as http:
        charged = await http.post("/v1/charges", json=charge_body(_JOB, currency=currency), headers=key_header(_JOB))
    assert (submitted.status_code, charged.status_code) == (422, 400), (submitted.text, charged.text)
    assert "currency" in submitted.json()["error"] and "currency" in charged.json()["error"]
    assert await count(databases.charge_url, "charges") == 0
    async with await psycopg.AsyncConnection.connect(databases.queue_url) as conn:
        assert (await (await conn.execute("SELECT count(*) FROM jobs")).fetchone())[0] == 0
