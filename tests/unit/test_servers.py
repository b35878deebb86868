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
