"""A TCP forwarder on loopback: the network between a primary and its standby, as a process of its own.

`python -m reliableq.tcp_link LISTEN_PORT TARGET_PORT` accepts on 127.0.0.1:LISTEN_PORT and copies bytes
both ways to 127.0.0.1:TARGET_PORT, printing `listening` once it accepts. Signals are its controls:
SIGSTOP cuts the link (nothing more crosses; what it had read waits in its own buffers), SIGCONT
restores it, SIGKILL loses whatever it held. Stopping the standby's WAL receiver instead does not cut
reliably: the standby's kernel keeps filling that receiver's socket, and those bytes survive the
primary's death (reliableq/standby.py).
"""

from __future__ import annotations

import asyncio
import sys

CHUNK_BYTES = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # either side went away: the other is closed below
    finally:
        writer.close()


async def serve(listen_port: int, target_port: int) -> None:
    async def forward(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, target_writer), _pipe(target_reader, client_writer))

    server = await asyncio.start_server(forward, "127.0.0.1", listen_port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    try:
        listen_port, target_port = (int(arg) for arg in argv)
    except ValueError:
        print("usage: python -m reliableq.tcp_link LISTEN_PORT TARGET_PORT", file=sys.stderr)
        return 2
    asyncio.run(serve(listen_port, target_port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
