"""The charge service: the side effect a job performs, as a separate HTTP app with its own database.

`POST /v1/charges` creates one charge per idempotency key with INSERT ... ON CONFLICT (never
select-then-insert): the same key and payload returns the original charge, a different payload
conflicts (409). Requests without a key (stage `idempotency` off) always create a charge. Every request
received is logged, so handler executions (H) can be counted. Latency, seeded failures and a capacity
limit can be injected for experiments (`ChargeFaults`). The worker's side is `reliableq.charge.client`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg.rows import dict_row
from starlette.requests import ClientDisconnect

from reliableq import db, sql
from reliableq.charge.payload import check_charge
from reliableq.payload import json_sha256

_Q = sql.queries("charge")


@dataclass
class ChargeFaults:
    """Injected behaviour of the charge service. Rates are probabilities per request, drawn from a
    generator seeded by (seed, job, how many requests that job made before), so a seeded run fails
    the same requests whatever order they arrive in."""

    latency_seconds: float = 0.0  # added to every request
    transient_rate: float = 0.0  # 503 before doing anything
    timeout_rate: float = 0.0  # hang before doing anything: the client times out
    permanent_rate: float = 0.0  # 422 before doing anything
    lost_response_rate: float = 0.0  # commit the charge, then hang: the client cannot know
    hang_seconds: float = 30.0  # how long a hang lasts (longer than the client's timeout)
    capacity: int | None = None  # requests beyond this many in flight are refused with 503
    decline_over_cents: int = 1_000_000  # business rule: larger amounts are declined (422)
    seed: int = 0
    outage_until: float = 0.0  # time.monotonic() before which every request gets 503 (see start_outage)
    retry_after_seconds: int | None = None  # sent with every 503 as Retry-After; None: no header

    def __post_init__(self) -> None:
        rates = (self.transient_rate, self.timeout_rate, self.permanent_rate, self.lost_response_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError("failure rates must be non-negative and add up to at most 1")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError("capacity must be at least 1")

    def start_outage(self, seconds: float) -> None:
        """Answer every request with 503 for the next `seconds` (a dependency that is down)."""
        self.outage_until = time.monotonic() + seconds

    def draw(self, job_id: str, nth_request: int) -> str | None:
        """The fault for the `nth_request` of `job_id`, or None."""
        u = random.Random(f"{self.seed}:{job_id}:{nth_request}").random()
        for fault, rate in (("transient", self.transient_rate), ("timeout", self.timeout_rate),
                            ("permanent", self.permanent_rate), ("lost_response", self.lost_response_rate)):
            if u < rate:
                return fault
            u -= rate
        return None


@dataclass
class ChargeStats:
    """What the service observed in memory (the durable record is the charge_requests table)."""

    in_flight: int = 0
    in_flight_peak: int = 0
    requests_by_job: Counter = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        # cpu_seconds: this process's CPU so far, so a benchmark can say what a charge costs the service.
        return {"in_flight": self.in_flight, "in_flight_peak": self.in_flight_peak,
                "requests": sum(self.requests_by_job.values()), "cpu_seconds": time.process_time()}


def _parse_charge(body: Any) -> dict[str, Any]:
    """The charge a request asks for: its job id and a payload checked as the API checked it."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    fields = dict(body)
    try:
        job_id = uuid.UUID(str(fields.pop("job_id", None)))
    except ValueError:
        raise ValueError("job_id must be a UUID") from None
    if "currency" not in fields:  # a payment names its currency; only the API fills in a default
        raise ValueError("currency is required")
    charge = check_charge(fields)
    return {"job_id": str(job_id), "amount_cents": charge["amount_cents"], "currency": charge["currency"],
            "description": charge.get("description")}


def charge_queries(replaced_queries: Mapping[str, str] | None = None) -> dict[str, str]:
    """The named queries of sql/charge.sql, with `replaced_queries` run in place of the shipped text (the
    lab's exercises plug a learner's SQL in here); their parameters are the same."""
    unknown = set(replaced_queries or ()) - _Q.keys()
    if unknown:
        raise ValueError(f"no query named {', '.join(sorted(unknown))} in charge.sql")
    return {**_Q, **(replaced_queries or {})}


def create_charge_app(database_url: str, faults: ChargeFaults | None = None,
                      replaced_queries: Mapping[str, str] | None = None,
                      statement_seconds: float | None = None) -> FastAPI:
    """The charge service as an ASGI app over its own database at `database_url`. `replaced_queries`:
    see `charge_queries`; `statement_seconds`: the server cancels a statement that runs longer."""
    state = {"faults": faults or ChargeFaults(), "stats": ChargeStats()}
    queries = charge_queries(replaced_queries)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(db.apply_schema, database_url, "charge")
        pool = await db.open_pool_checked(database_url, max_size=20, statement_seconds=statement_seconds)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="ReliableQ charge service", lifespan=lifespan)
    app.state.charge = state

    async def log_request(conn, charge: dict[str, Any] | None, key: str | None, outcome: str,
                          status_code: int) -> None:
        await _log_request(conn, queries, charge, key, outcome, status_code)

    def answer(status_code: int, body: dict[str, Any]) -> JSONResponse:
        retry_after = state["faults"].retry_after_seconds
        headers = {"Retry-After": str(retry_after)} if status_code == 503 and retry_after is not None else None
        return JSONResponse(body, status_code=status_code, headers=headers)

    @app.post("/v1/charges")
    async def create_charge(request: Request) -> JSONResponse:
        stats: ChargeStats = state["stats"]
        faults: ChargeFaults = state["faults"]
        key = request.headers.get("Idempotency-Key")
        try:
            charge = _parse_charge(await request.json())
        except ClientDisconnect:
            return answer(499, {"error": "the client went away before sending its request"})  # nobody reads it
        except (ValueError, TypeError, RecursionError) as error:
            async with app.state.pool.connection() as conn:
                await log_request(conn, None, key, "invalid", 400)
            return answer(400, {"error": f"invalid charge request: {error}"[:300]})
        stats.in_flight += 1
        stats.in_flight_peak = max(stats.in_flight_peak, stats.in_flight)
        # Decided before any await, so requests still waiting for a connection do not count.
        over_capacity = faults.capacity is not None and stats.in_flight > faults.capacity
        try:
            nth = stats.requests_by_job[charge["job_id"]]
            stats.requests_by_job[charge["job_id"]] += 1
            async with app.state.pool.connection() as conn:
                if over_capacity:
                    await log_request(conn, charge, key, "overloaded", 503)
                    return answer(503, {"error": "charge service over capacity, retry later"})
                if time.monotonic() < faults.outage_until:
                    await log_request(conn, charge, key, "injected_outage", 503)
                    return answer(503, {"error": "charge service outage"})
                fault = faults.draw(charge["job_id"], nth)
                if faults.latency_seconds:
                    await asyncio.sleep(faults.latency_seconds)
                if fault == "transient":
                    await log_request(conn, charge, key, "injected_503", 503)
                    return answer(503, {"error": "injected transient failure"})
                if fault == "permanent":
                    await log_request(conn, charge, key, "injected_422", 422)
                    return answer(422, {"error": "injected permanent failure: card rejected"})
                if fault == "timeout":
                    await log_request(conn, charge, key, "injected_timeout", 504)
                    await asyncio.sleep(faults.hang_seconds)
                    return answer(504, {"error": "injected timeout"})
                if charge["amount_cents"] > faults.decline_over_cents:
                    await log_request(conn, charge, key, "declined", 422)
                    return answer(422, {"error": f"declined: amount over {faults.decline_over_cents} cents"})
                status_code, body = await charge_once(conn, queries, charge, key)
            if fault == "lost_response":
                # The charge is committed; the caller will never hear so (ambiguous outcome).
                await asyncio.sleep(faults.hang_seconds)
            return answer(status_code, body)
        finally:
            stats.in_flight -= 1

    @app.get("/v1/stats")
    async def charge_stats() -> dict[str, Any]:
        return state["stats"].as_json() | {"faults": asdict(state["faults"])}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        async with app.state.pool.connection() as conn:
            await conn.execute("SELECT 1")
        return {"status": "ok"}

    return app


async def _log_request(conn, queries: Mapping[str, str], charge: dict[str, Any] | None, key: str | None,
                       outcome: str, status_code: int, charge_id: Any = None) -> None:
    await conn.execute(queries["charge_request_log"], {
        "job_id": charge and charge["job_id"], "idempotency_key": key,
        "outcome": outcome, "status_code": status_code, "charge_id": charge_id,
    })


async def charge_once(conn, queries: Mapping[str, str], charge: dict[str, Any],
                      key: str | None) -> tuple[int, dict[str, Any]]:
    """Create the charge for `key` once; a repeat returns the original or conflicts. The service's answer:
    (status code, body). `conn` autocommits in the service; the lab's exercise calls this inside a
    transaction it holds open, to force two requests with one key to overlap."""
    sha = json_sha256(charge)
    # Each statement commits on its own (the pool's connections autocommit): the charge and its
    # `created` log row are one statement; a repeat only reads and logs, so it needs no transaction.
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(queries["charge_insert_once"], {
        "idempotency_key": key, "job_id": charge["job_id"], "amount_cents": charge["amount_cents"],
        "currency": charge["currency"], "payload_sha256": sha,
    })
    created = await cur.fetchone()
    if created:
        return 201, _charge_json(created, replayed=False)
    # ON CONFLICT waited for any concurrent insert of this key to commit, so the row is visible.
    await cur.execute(queries["charge_get_by_key"], {"idempotency_key": key})
    original = await cur.fetchone()
    if original["payload_sha256"] != sha:
        await _log_request(conn, queries, charge, key, "conflict", 409, original["id"])
        return 409, {"error": "idempotency key reused with a different payload", "charge_id": str(original["id"])}
    await _log_request(conn, queries, charge, key, "replayed", 200, original["id"])
    return 200, _charge_json(original, replayed=True)


def _charge_json(row: dict[str, Any], replayed: bool) -> dict[str, Any]:
    return {"charge_id": str(row["id"]), "job_id": str(row["job_id"]), "amount_cents": row["amount_cents"],
            "currency": row["currency"], "idempotency_key": row["idempotency_key"], "replayed": replayed}
