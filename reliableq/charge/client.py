"""The worker's client for the charge service, and how it classifies every answer.

Outcomes: ok, transient (never sent or refused for now), permanent (the business said no), ambiguous
(sent, no answer: the charge may or may not exist; retry with the key). The key is the job's stable
idempotency key (`jobs.idempotency_key`, 'reliableq:charge:<job id>'), the same on every attempt and
after a replay. This module does not decide retries; the worker does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

TRANSIENT_STATUS = frozenset({408, 429})
# The longest Retry-After taken at its word: a service asking for days is misconfigured, and a job held
# back that long looks lost to everyone watching the queue.
RETRY_AFTER_MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class ChargeOutcome:
    kind: str  # ok | transient | permanent | ambiguous
    detail: str
    status_code: int | None = None
    charge_id: str | None = None
    retry_after_seconds: float | None = None  # a transient answer's Retry-After, when it had a usable one


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delay-seconds or an HTTP-date, RFC 9110 10.2.3), at most
    RETRY_AFTER_MAX_SECONDS; None when absent or unreadable (then backoff alone decides)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 850 and asctime dates carry no zone: HTTP dates are GMT
            when = when.replace(tzinfo=UTC)
        seconds = max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
    return min(seconds, RETRY_AFTER_MAX_SECONDS)


def classify_status(status_code: int) -> str:
    """ok for 2xx; transient for 408, 429 and 5xx (try again later); permanent for other 4xx."""
    if 200 <= status_code < 300:
        return "ok"
    if status_code in TRANSIENT_STATUS or status_code >= 500:
        return "transient"
    return "permanent"


DEFAULT_TIMEOUT_SECONDS = 5.0  # no answer by then: the outcome is ambiguous


class ChargeClient:
    """Calls the charge service for a job, with its stable key when idempotency is on.

    aiohttp rather than httpx, on the worker's hot path: measured on loopback, httpx spent 0.6 ms of
    CPU per request in the client and aiohttp 0.07 ms, and a worker's CPU per job bounds its throughput."""

    def __init__(self, base_url: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
                 send_idempotency_key: bool = True, max_connections: int = 100) -> None:
        self.send_idempotency_key = send_idempotency_key
        self.timeout_seconds = timeout_seconds
        self._url = base_url.rstrip("/") + "/v1/charges"
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the running loop

    async def charge(self, job_id: uuid.UUID, payload: dict[str, Any], key: str) -> ChargeOutcome:
        """Charge `payload` for the job, under its idempotency `key` (sent unless send_idempotency_key is
        off: the stage that shows what the key is for)."""
        headers = {"Idempotency-Key": key} if self.send_idempotency_key else {}
        body = {"job_id": str(job_id), **payload}
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._max_connections))
        try:
            # One deadline for the whole call: connecting, sending, and a trickling answer too.
            async with asyncio.timeout(self.timeout_seconds):
                async with self._session.post(self._url, json=body, headers=headers) as response:
                    status_code, raw = response.status, await response.read()
                    retry_after = response.headers.get("Retry-After")
        except TimeoutError:
            return ChargeOutcome("ambiguous", f"no complete answer within {self.timeout_seconds:g}s")
        except aiohttp.ClientConnectorError as error:  # no connection, so nothing was sent
            return ChargeOutcome("transient", f"charge service unreachable: {type(error).__name__}")
        except aiohttp.ClientError as error:
            # The request went out; the charge may exist. Only a retry with the same key is safe.
            return ChargeOutcome("ambiguous", f"no answer from the charge service: {type(error).__name__}")
        kind = classify_status(status_code)
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):  # a proxy's error page, a bare string
            answer = {}
        detail = answer.get("error") or f"HTTP {status_code}"
        return ChargeOutcome(kind, detail, status_code, answer.get("charge_id"),
                             retry_after_seconds(retry_after) if kind == "transient" else None)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
