"""A bare asyncio TCP forwarder: the floor for any Python asyncio proxy (a benchmark reference).

No framing, no rewriting, no recording: each read is written to the other side as it is,
with the same 1 MB reads as ``kwire proxy`` and with backpressure (a side stops reading while
the other side's write buffer is full). ``bench/proxy_overhead.py`` runs it as the
``asyncio`` path, in front of a broker that advertises its port, so what it costs over
``direct`` is what Python and asyncio cost before kwire does anything.

Usage: ``python bench/asyncio_forwarder.py [LISTEN_HOST:]LISTEN_PORT TARGET_HOST:TARGET_PORT``; prints
``listening`` once it accepts connections.
"""

from __future__ import annotations

import asyncio
import sys

_READ_SIZE = 1 << 20


class _Side(asyncio.Protocol):
    """One end of a forwarded connection; ``peer`` is the other end, once it exists."""

    def __init__(self, peer: _Side | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.backlog: list[bytes] = []  # client bytes that came before the upstream connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.max_size = _READ_SIZE  # type: ignore[attr-defined]
        client = self.peer
        if client is not None:  # the upstream side: bytes the client sent meanwhile go first
            client.peer = self
            for data in client.backlog:
                self.transport.write(data)
            client.backlog.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.backlog.append(data)
        else:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def _serve(listen: tuple[str, int], host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # held so the tasks are not collected mid-way

    def accepted() -> _Side:
        client = _Side()

        async def connect() -> None:
            try:
                await loop.create_connection(lambda: _Side(client), host, port)
            except OSError:
                if client.transport is not None:
                    client.transport.abort()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accepted, *listen, backlog=1024)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen_host, _, listen_port = sys.argv[1].rpartition(":")
    host, _, port = sys.argv[2].rpartition(":")
    asyncio.run(_serve((listen_host or "127.0.0.1", int(listen_port)), host, int(port)))


if __name__ == "__main__":
    main()
