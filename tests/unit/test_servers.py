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
