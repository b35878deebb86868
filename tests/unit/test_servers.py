"""Serving on loopback (reliableq/servers.py): the socket options uvicorn serves with."""

from __future__ import annotations


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


async def test_servers_keep_an_idle_connection_open_longer_than_clients_reuse_one():
    """A client that reuses a connection the server is closing at that moment is told "Server
    disconnected without sending a response" (the benchmark met it after a 5 s drain): the server's
    idle limit must be past the longest reuse of the clients the project uses (its workers' aiohttp,
    the lab's and the tests' httpx)."""
    import aiohttp
    import httpx

    from reliableq.servers import uvicorn_config

    connector = aiohttp.TCPConnector()
    try:
        longest_client_reuse = max(httpx.Limits().keepalive_expiry, connector._keepalive_timeout)
    finally:
        await connector.close()
    assert uvicorn_config(app=None).timeout_keep_alive > 2 * longest_client_reuse


class _WritesSeen:
    """The real transport, with the writes it was given kept (uvloop's transport takes no attribute of ours)."""

    def __init__(self, transport, writes: list[bytes]) -> None:
        self._transport, self.writes = transport, writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


async def _next_turn() -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


async def _bodies_and_writes(protocol, requests: int, streamed: bool = False) -> tuple[list[bytes], list[bytes]]:
    """`requests` GETs over one keep-alive connection to uvicorn serving with `protocol`: the bodies the
    client read, and the writes that reached the server's real transport."""
    import asyncio

    import httpx
    import uvicorn

    from reliableq.servers import bind_listener, uvicorn_config

    writes: list[bytes] = []

    class Seen(protocol):
        def connection_made(self, transport) -> None:  # counted below whatever `protocol` wraps it in
            super().connection_made(_WritesSeen(transport, writes))

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]
                    + ([] if streamed else [(b"content-length", b"%d" % len(scope["path"]))])})
        if not streamed:
            await send({"type": "http.response.body", "body": scope["path"].encode()})
            return
        for chunk in (b"first,", b"second,", b"third"):  # each a turn of the loop after the last
            await _next_turn()
            await send({"type": "http.response.body", "body": chunk, "more_body": chunk != b"third"})

    listener = bind_listener("127.0.0.1", 0)
    listener.listen()  # the client's connection waits in the backlog until uvicorn accepts it
    server = uvicorn.Server(uvicorn_config(app, http=Seen, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        host, port = listener.getsockname()[:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as client:
            bodies = [(await client.get(f"/job/{number}")).content for number in range(requests)]
    finally:
        server.should_exit = True
        await serving
    return bodies, writes


async def test_a_response_leaves_in_one_write():
    """uvicorn writes a response's head and body apart: two segments, two wake-ups of the client. Served
    as every server of the project is, each of three responses on one connection reaches the socket as
    one write, head and body together, and the client reads each whole."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from reliableq.servers import OneWritePerResponse

    bodies, writes = await _bodies_and_writes(OneWritePerResponse, 3)
    assert bodies == [b"/job/0", b"/job/1", b"/job/2"]
    assert len(writes) == 3
    assert all(write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\n/job/%d" % number)
               for number, write in enumerate(writes))

    bodies, writes = await _bodies_and_writes(HttpToolsProtocol, 3)
    assert bodies == [b"/job/0", b"/job/1", b"/job/2"]
    assert len(writes) == 6, "uvicorn's own protocol writes a head and a body apart"


async def test_a_body_streamed_over_turns_of_the_loop_is_sent_as_it_comes():
    """Only what one turn of the loop wrote is held: a body streamed in chunks a turn apart leaves chunk
    by chunk (flow control sees each), after the head of the turn before, in order."""
    from reliableq.servers import OneWritePerResponse

    bodies, writes = await _bodies_and_writes(OneWritePerResponse, 1, streamed=True)
    assert bodies == [b"first,second,third"]
    head, *chunks = writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert chunks == [b"6\r\nfirst,\r\n", b"7\r\nsecond,\r\n", b"5\r\nthird\r\n0\r\n\r\n"]
