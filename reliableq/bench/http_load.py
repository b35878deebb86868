"""The bench's HTTP load generator: JSON POSTs over keep-alive HTTP/1.1 connections on asyncio streams, one
connection per request in flight.

The bench and the API it measures share the machine's cores, so the client's own CPU is taken from the
API's. aiohttp spent 0.24-0.39 ms of CPU a request beside our API on a 2-core machine, more than half of
what the API itself spent; this client spends 0.08-0.13 ms (`reliableq bench` figures move accordingly:
one job per request, 653 -> 836 a second at one client, 2,080 -> 2,717 at 16), as pgbench's C client
costs next to nothing beside PostgreSQL. It speaks just what the API answers: a status line, headers
and a body of Content-Length bytes; anything else is an error.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

REQUEST_SECONDS = 30.0
_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HttpRefused(RuntimeError):
    """An answer other than the one the caller expected: its status and the start of its body."""


class LoopbackHttp:
    """POSTs to one server. A connection serves one request at a time and goes back to the idle ones after
    it; a request that fails leaves its connection closed."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port = parts.hostname, parts.port
        self._idle: list[_Connection] = []

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def post_json(self, path: str, body: Any, expect: int) -> Any:
        """POST `body` as JSON to `path`; the answer's JSON, or HttpRefused if its status is not `expect`."""
        data = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(data)}\r\n\r\n").encode() + data
        connection = self._idle.pop() if self._idle else await asyncio.open_connection(self._host, self._port)
        try:
            async with asyncio.timeout(REQUEST_SECONDS):
                status, answer, keep = await _exchange(connection, request)
        except BaseException:
            connection[1].close()
            raise
        if keep:
            self._idle.append(connection)
        else:
            connection[1].close()
        if status != expect:
            raise HttpRefused(f"{path} answered {status}: {answer[:200].decode(errors='replace')}")
        return json.loads(answer)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for _, writer in idle), return_exceptions=True)


async def _exchange(connection: _Connection, request: bytes) -> tuple[int, bytes, bool]:
    """Send one request and read its answer: (status, body, whether the connection may serve another)."""
    reader, writer = connection
    writer.write(request)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *header_lines = head[:-4].split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    if "content-length" not in headers:
        raise HttpRefused(f"an answer without Content-Length ({status_line}): this client reads no other")
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), body, headers.get("connection", "").lower() != "close"
