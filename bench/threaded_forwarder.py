"""A bare threaded TCP forwarder: blocking sockets, one thread per direction (a benchmark reference).

No framing, no rewriting, no recording: each direction is a thread that reads up to 1 MB
into its own buffer (``recv_into``) and writes it to the other side (``sendall``, so a slow
reader holds the writer back: backpressure without an event loop). ``bench/proxy_overhead.py``
runs it as the ``threads`` path, next to ``asyncio`` (``bench/asyncio_forwarder.py``): the
two show what the same forwarding costs in Python with and without an event loop between the
kernel and the bytes.

Usage: ``python bench/threaded_forwarder.py [LISTEN_HOST:]LISTEN_PORT TARGET_HOST:TARGET_PORT``; prints
``listening`` once it accepts connections.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

_READ_SIZE = 1 << 20


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until end of stream, then pass the end on (half-close)."""
    buffer = bytearray(_READ_SIZE)
    view = memoryview(buffer)
    with contextlib.suppress(OSError):  # a reset ends the direction like an end of stream
        while n := source.recv_into(buffer):
            sink.sendall(view[:n])
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _forward(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
    _pump(client, upstream)


def main() -> None:
    listen_host, _, listen_port = sys.argv[1].rpartition(":")
    host, _, port = sys.argv[2].rpartition(":")
    server = socket.create_server((listen_host or "127.0.0.1", int(listen_port)), backlog=1024)
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_forward, args=(client, (host, int(port))), daemon=True).start()


if __name__ == "__main__":
    main()
