"""Runs an ASGI app (the API or the charge service) with uvicorn on loopback, in a background thread.

Used where one process hosts a whole experiment (tests, stages, the demo): the traffic is still real
HTTP over a real socket. Separate processes are started by the CLI instead. Binds 127.0.0.1 unless
told otherwise; port 0 picks a free port, read back once the socket is bound.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

STARTUP_TIMEOUT_SECONDS = 30.0
# A server must keep an idle connection open longer than any client keeps one for reuse (httpx 5 s,
# aiohttp 15 s), or a client may send a request on a connection the server is closing at that moment
# and be told "Server disconnected without sending a response": uvicorn's default of 5 s did that to
# the benchmark's request after a 5 s drain on a loaded machine.
KEEP_ALIVE_SECONDS = 75


class WritesOfOneTurn:
    """A transport that sends what is written to it in one turn of the event loop as one write to the
    real transport, at the end of that turn.

    uvicorn writes a response's head and its body separately, so each answer left as two TCP segments and
    its client woke twice to read it. Joined, a one-job submission cost the benchmark's client 0.125-0.147 ms
    of CPU instead of 0.173-0.197 (4 alternated rounds at one client), and the server one send fewer. A write
    of a later turn (a streamed body's next chunk) goes on its own, so flow control sees it as it comes."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._send_held)
        self._held.append(data)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def _send_held(self) -> None:
        if self._held and not self._transport.is_closing():
            self._transport.write(b"".join(self._held))
        self._held = []

    def close(self) -> None:
        self._send_held()  # the answers written before the close still leave, as they would have
        self._transport.close()

    def write_eof(self) -> None:
        self._send_held()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # the rest of the transport, as it is
        return getattr(self._transport, name)


class OneWritePerResponse(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), its writes joined per loop turn (`WritesOfOneTurn`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(WritesOfOneTurn(transport))


def uvicorn_config(app, **options) -> uvicorn.Config:
    """How every server of the project runs an app: quiet below warnings, idle connections kept long,
    a response's head and body sent together (`OneWritePerResponse`).
    No access log: its lines are INFO, never shown at WARNING, yet uvicorn builds each one's arguments
    (the client's address, the path quoted again) whenever a handler could receive them."""
    return uvicorn.Config(app, **{"log_level": "warning", "timeout_keep_alive": KEEP_ALIVE_SECONDS,
                                  "access_log": False, "http": OneWritePerResponse} | options)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it). Another process may take it before the
    caller binds it: use it for a child process's --port, or as a port nothing listens on; an app
    served in this process should bind port 0 instead (`LoopbackServer`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn to serve on (OSError when the address is taken).

    The protocol must be IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted
    sockets whose listener says TCP, and with Nagle on, a response written as head then body waits
    for the client's delayed ACK, 40 ms a request. `reliableq bench` measured 47 ms per charge so."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    return listener


class LoopbackServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = bind_listener(host, port)
        host, port = self._socket.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(uvicorn_config(app, lifespan="on", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"uvicorn {self.url}", daemon=True)

    def start(self) -> str:
        """Start serving and return the base URL once the app has finished starting up."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server at {self.url} failed to start (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {self.url} did not start within {STARTUP_TIMEOUT_SECONDS}s")
            time.sleep(0.01)  # polling a flag another thread sets; there is no event to wait on
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> LoopbackServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
