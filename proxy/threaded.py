"""Plain TCP connections forwarded on blocking threads: one thread per direction.

A ``Session`` (``proxy.session``) does the forwarding work either way; this module only
feeds it. Each listener has an accept thread; each accepted client gets a thread that
connects upstream and then reads the client, and a second thread that reads the broker.
A read is up to 1 MB (``recv``), handed to the session, which writes it on with ``sendall``:
a slow reader holds its writer back, which is all the backpressure there is to have.

Why threads: on a 2-core machine, with the broker and the clients on the same cores, the
CPU a proxy burns is taken from them. A bare asyncio forwarder (selector wake-ups, transport
buffering, callbacks) cost 1.4-1.8 times the CPU per MB of a bare threaded one; for kwire,
whose decoding and rows cost the same either way, threads saved 3-10% (``bench/
proxy_overhead.py``; the README's Overhead section has the figures). TLS and fault rules stay on the event loop (``proxy.session.ClientProtocol``):
TLS needs its buffering, and rules answer or delay requests from timers.

Why not (measured 2026-11-25 on the shared 2-core machine): with 200 connections at 10
requests/s each this path cost 417-435 us of CPU per exchange against 195-207 on the loop,
and when 2,000 idle connections closed at once another client's round trip took 4.8-6.2 s
(8-33 ms on the loop): 4,000 threads wake at once and the one forwarding that client waits
its turn for the GIL behind them. Thread-per-connection cannot bound that under the GIL.

Ending: a reset or a failed write on either side, or the broker's end of stream, ends the
session once (``Session.client_gone``/``upstream_gone``), which shuts both sockets down; that
wakes the other thread's blocked read. The client's end of stream is passed on as a half
close: the broker sees it and the responses it is still sending reach the client (or the
client's reset, which is recorded), for at most ``proxy.session.LINGER_SECONDS``. The
client's thread closes both sockets once both threads are done.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxy.session import BACKLOG_LIMIT, LINGER_SECONDS, Session

if TYPE_CHECKING:
    from proxy.server import Proxy

__all__ = ["SocketEnd", "serve_listener"]

log = logging.getLogger("kwire.proxy")

#: Bytes asked of the kernel per read, as on the event-loop path.
_READ_SIZE = 1 << 20
#: Pause after accept() fails (or no thread can be started), so a full table does not spin a core.
_ACCEPT_BACKOFF = 0.05


class SocketEnd:
    """A connected blocking socket, as the transport a ``Session`` writes to."""

    __slots__ = ("sock", "write")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.write = sock.sendall

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            try:
                return self.sock.getpeername()
            except OSError:
                return default
        return default

    def is_closing(self) -> bool:
        return False  # a failed write raises instead

    def close(self) -> None:
        """End both directions now (writes are synchronous: nothing is left to flush)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    abort = close


def serve_listener(
    proxy: Proxy, listener: socket.socket, targets: Callable[[], list[tuple[str, int]]]
) -> None:
    """Accept clients on ``listener`` (blocking) until it is shut down; each gets two threads."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            if proxy.stopping or listener in proxy.retired or listener.fileno() < 0:
                proxy.retired.discard(listener)
                return
            log.warning("accept failed on port %s: %s", listener.getsockname()[1], exc)
            time.sleep(_ACCEPT_BACKOFF)
            continue
        if proxy.stopping:
            client.close()
            return
        thread = threading.Thread(
            target=_serve_client, args=(proxy, client, targets()), name="kwire-client", daemon=True
        )
        proxy.threads.add(thread)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (a process or memory limit)
            proxy.threads.discard(thread)
            log.warning("cannot serve a client on port %s: %s", listener.getsockname()[1], exc)
            client.close()
            time.sleep(_ACCEPT_BACKOFF)


def _connect(
    targets: list[tuple[str, int]], timeout: float
) -> tuple[socket.socket | None, BaseException | None]:
    """The first target that accepts a connection, or None and the last error."""
    error: BaseException | None = None
    for target in targets:
        try:
            sock = socket.create_connection(target, timeout=timeout)
        except OSError as exc:
            error = exc
            continue
        sock.settimeout(None)
        return sock, None
    return None, error


def _serve_client(proxy: Proxy, client: socket.socket, targets: list[tuple[str, int]]) -> None:
    """One client connection, on the thread that reads the client."""
    session: Session | None = None
    upstream: socket.socket | None = None
    try:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = Session(proxy, SocketEnd(client))
        session.record_close_later = True  # the other thread may record after the end
        if proxy.stopping:  # accepted as the proxy began to stop: it may not have seen this session
            session.abort("open_at_end")
            return
        upstream, error = _connect(targets, proxy.config.connect_timeout)
        if upstream is None:
            _take_backlog(client, session)
            session.unreachable(targets, error)
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not session.connected(SocketEnd(upstream), targets[0]):
            return
        reader = threading.Thread(
            target=_serve_upstream, args=(proxy, session, upstream), name="kwire-broker", daemon=True
        )
        reader.start()
        if _pump(proxy, session, client, session.from_client, session.client_gone, session.upstream_gone):
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)  # the client's end of stream, passed on
            reader.join(LINGER_SECONDS)
            session.client_gone(None)  # if the broker has not ended it by now
        reader.join()
    except Exception:  # a bug must cost this connection, never the proxy
        log.exception("client %s: forwarding failed", client)
        if session is not None:
            session.abort("rst")
    finally:
        if session is not None:
            session.record_close()
        if upstream is not None:
            upstream.close()
        client.close()
        proxy.threads.discard(threading.current_thread())


def _take_backlog(client: socket.socket, session: Session) -> None:
    """Hand the session what the client sent while no broker could be reached (up to
    ``BACKLOG_LIMIT``, without waiting), so its requests are recorded as on the event loop."""
    taken = 0
    client.setblocking(False)
    try:
        while taken < BACKLOG_LIMIT:
            data = client.recv(BACKLOG_LIMIT - taken)
            if not data:
                return
            taken += len(data)
            session.from_client(data)
    except OSError:  # nothing more to read now (or the client is gone)
        return
    finally:
        client.setblocking(True)


def _serve_upstream(proxy: Proxy, session: Session, upstream: socket.socket) -> None:
    """The broker -> client direction, on its own thread; the broker's end of stream ends the session."""
    if _pump(proxy, session, upstream, session.from_upstream, session.upstream_gone, session.client_gone):
        session.upstream_gone(None)


def _pump(
    proxy: Proxy,
    session: Session,
    source: socket.socket,
    feed: Callable[[bytes], None],
    source_gone: Callable[[BaseException | None], None],
    sink_gone: Callable[[BaseException | None], None],
) -> bool:
    """Read ``source`` and feed the session until either side ends.

    True when ``source`` ended its stream (the caller decides what that means); False when
    the session ended, here (a reset, a failed write: reported through ``source_gone`` or
    ``sink_gone``) or elsewhere.
    """
    recv = source.recv
    catch_up = proxy.recorder.catch_up
    try:
        while not session.closed:
            try:
                data = recv(_READ_SIZE)
            except OSError as exc:
                source_gone(exc)
                return False
            if not data:
                return not session.closed
            try:
                feed(data)
            except OSError as exc:  # the write to the other side failed
                sink_gone(exc)
                return False
            catch_up()  # after forwarding: what came in is on its way
    except Exception:
        log.exception("client %s:%s: forwarding failed", *session.client_addr)
        session.abort("rst")
    return False
