"""The proxy process: listeners, per-broker listeners opened on first sight, lifecycle.

Clients connect to the listen address (the "bootstrap listener"), whose connections go to
the ``--bootstrap`` brokers (first that answers). Every broker a response names gets a
listener of its own at ``broker_port_base + node id`` (opened synchronously, before the
response that names it reaches the client), whose connections go to that broker's real
address; responses are rewritten so clients only ever learn proxy addresses
(``proxy.rewrite``). Each client connection gets its own upstream connection
(``proxy.session``), so correlation ids and ordering stay the client's own.

A broker listener mirrors its broker's reachability: when the broker refuses a connection
(it is down), the listener is closed, so clients are refused too and back off as they would
on a direct connection, rather than being accepted and cut off at once (kafka-python 3.0
then reconnected about 240 times a second); a probe reopens it as soon as the broker accepts
connections again (``REFUSED_PROBE_SECONDS``).

Every connection is forwarded on the event loop: there is one I/O model. A thread-per-
connection path (``--io threads``) used 3-10% less CPU per MB with a few busy connections, but
at 200 connections it cost 417-435 us of CPU per exchange against 195-207 us on the loop, and
when 2,000 idle connections closed at once another client's round trip stalled 4.8-6.2 s
against 8-33 ms (4,000 threads waking at once behind the GIL), so it was removed
(``REMOVED_IO``).

**Operations.** The metrics port is the admin endpoint (``proxy.admin``): ``/metrics``,
``/healthz``, ``/ready`` (``Proxy.ready_state``) and ``GET``/``PUT /rules``
(``Proxy.put_rules``). SIGHUP re-reads the rules from where they came from
(``ProxyConfig.rules_reloader``: the ``--rules`` file or the config file) and swaps them in
at once (``Proxy.replace_rules``); a file that does not parse keeps the rules in force, is
logged in one line and counted (``kwire_proxy_rule_reloads_total{result="error"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy import outdir, rewrite, tls
from proxy.admin import AdminAuth, AdminRoutes, admin_ssl_context, serve_admin
from proxy.budget import DEFAULT_MAX_MEMORY_MB, MemoryBudget
from proxy.config_file import IO_MODES, REMOVED_IO
from proxy.endings import Endings
from proxy.inject import Rule, RuleSet
from proxy.metrics import DEFAULT_CLIENT_IDS, Metrics
from proxy.recorder_worker import RecorderProcess
from proxy.session import ClientProtocol, Session

__all__ = [
    "IO_MODES",
    "REMOVED_IO",
    "Proxy",
    "ProxyConfig",
    "check_io",
    "os_reason",
    "parse_address",
    "tune_malloc",
]


log = logging.getLogger("kwire.proxy")

#: How often a closed broker listener checks whether its broker accepts connections again.
REFUSED_PROBE_SECONDS = 0.2
#: Default ``ProxyConfig.header_timeout`` (``--header-timeout-s``).
HEADER_TIMEOUT_SECONDS = 30.0
#: ``/ready`` reuses its last broker check for this long (probes every second cost one
#: connection to a broker a second at most).
READY_REUSE_SECONDS = 1.0
#: How long ``/ready`` waits for a broker to accept a connection.
READY_CONNECT_SECONDS = 2.0

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def tune_malloc(mmap_threshold: int = 32 << 20, trim_threshold: int = 128 << 20) -> bool:
    """Keep glibc from handing every freed socket buffer back to the kernel.

    Each read is a fresh bytes object of up to 1 MB. With glibc's defaults such blocks are
    mmapped, or carved from the top of the heap that is trimmed again as soon as they are
    freed, so nearly every page forwarded was a new page: a minor page fault (and the
    kernel zeroing 4 KB) per 4 KB, about a third of the proxy's CPU under load. Raising
    both thresholds lets freed blocks be reused. Linux/glibc only; False elsewhere.

    Those thresholds apply to each malloc arena, and glibc gives threads arenas of their
    own (up to 8 per core; the recorder's writer thread and ``asyncio.to_thread`` workers run
    Python too), each keeping freed blocks of its own. Python allocates under the GIL anyway,
    so two arenas cost no contention.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt(_M_ARENA_MAX, 2)
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not port:
        if default_port is None:
            raise ValueError(f"{text!r}: expected HOST:PORT")
        return host, default_port
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host or "127.0.0.1", int(port)


@dataclass
class ProxyConfig:
    bootstrap: list[tuple[str, int]]
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    out_dir: Path | None = None
    advertise: str | None = None
    broker_port_base: int | None = None  # None: listen port + 1; 0: the OS picks each port
    flush_seconds: float = 10.0
    flush_rows: int = 100_000
    max_queue_bytes: int = 64 << 20
    #: Everything held, over all connections (held frames, the recorder's queue and decoders,
    #: rule-held requests, pre-connect backlogs): ``proxy.budget``. 0: no limit.
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_MB << 20
    max_pending_rows: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    upstream_tls: bool = False
    upstream_ca: Path | None = None
    upstream_verify: bool = True
    rules: list[Rule] = field(default_factory=list)
    seed: int | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_client_ids: int = DEFAULT_CLIENT_IDS  # client ids shown in the metrics, the rest as other
    metrics_token: str | None = None  # bearer token /metrics asks for (None: open)
    admin_open: bool = False  # PUT /rules without a token or client certificate
    admin_tls_cert: Path | None = None  # TLS on the admin (metrics) port
    admin_tls_key: Path | None = None
    admin_client_ca: Path | None = None  # mutual TLS: clients need a certificate this CA signed
    #: Re-reads the rules for SIGHUP (raises ValueError/OSError with a one-line message); None:
    #: SIGHUP has nothing to re-read (rules given with --inject only, or none).
    rules_reloader: Callable[[], list[Rule]] | None = None
    rules_origin: str | None = None  # where the rules come from, for the log
    connect_timeout: float = 10.0
    io: str = "auto"
    #: A request header begun (or, on a new connection, the first one) must be complete within
    #: this many seconds, else the connection is closed (counted). None or 0: no limit.
    header_timeout: float | None = HEADER_TIMEOUT_SECONDS

    def check(self) -> None:
        """ValueError (one line) if the configuration cannot be honoured."""
        check_io(self.io)


def check_io(io: str) -> None:
    """ValueError with a one-line message unless ``io`` is one of ``IO_MODES``."""
    if io in REMOVED_IO:
        raise ValueError(REMOVED_IO[io])
    if io not in IO_MODES:
        raise ValueError(f"io must be one of {', '.join(IO_MODES)}, not {io!r}")


class Proxy:
    """A running ``kwire proxy``: ``await start()``, then ``await stop()`` (or ``serve()``)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        config.check()
        host, port = config.listen
        self.source = f"proxy:{host}:{port}"
        self.run_id = f"{int(time.time()):x}{os.getpid() & 0xFFFF:04x}"
        self.metrics = Metrics(config.metrics_client_ids)
        self.rules = RuleSet(config.rules, seed=config.seed)
        self.metrics.rules_active = len(config.rules)
        self._ready_at = float("-inf")
        self._ready_last: tuple[bool, str] = (False, "not started")
        self._ready_check: asyncio.Future[tuple[bool, str]] | None = None
        self.budget = MemoryBudget(config.max_memory_bytes)
        self.endings = Endings()  # event loop: connection ends, a few per loop turn
        self.recorder = RecorderProcess(
            config.out_dir,
            self.metrics,
            flush_seconds=config.flush_seconds,
            flush_rows=config.flush_rows,
            max_queue_bytes=config.max_queue_bytes,
            max_pending_rows=config.max_pending_rows,
            budget=self.budget,
        )
        self.client_ssl: ssl.SSLContext | None = None
        if config.tls_cert and config.tls_key:
            self.client_ssl = tls.client_side_context(config.tls_cert, config.tls_key)
        self.upstream_ssl: ssl.SSLContext | None = None
        if config.upstream_tls:
            self.upstream_ssl = tls.upstream_context(config.upstream_ca, verify=config.upstream_verify)
        self.rewriting = True
        self.rewrites = rewrite.RewriteMemo()
        self.sessions: set[Session] = set()
        self.nodes: dict[int, tuple[str, int]] = {}  # node id -> broker's real address
        self.node_ports: dict[int, int] = {}  # node id -> local listener port
        self.topic_names: dict[str, str] = {}  # topic id -> name, from Metadata responses
        self.servers: list[asyncio.AbstractServer] = []
        self._node_servers: dict[int, Any] = {}  # node id -> its listening socket or asyncio server
        self._refusing: set[int] = set()  # nodes whose listener is closed while the broker refuses
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metrics_server: asyncio.AbstractServer | None = None
        self._header_sweeper: asyncio.Task[None] | None = None
        self._out_claim: int | None = None  # the lock held on the output directory
        self._session_keys = 0
        self.stopping = False  # set once: stop accepting
        self.listen_port = port

    @property
    def advertise(self) -> str:
        if self.config.advertise:
            return self.config.advertise
        host = self.config.listen[0]
        return socket.getfqdn() if host in ("0.0.0.0", "::", "") else host

    def next_session_key(self) -> int:
        self._session_keys += 1
        return self._session_keys

    # ---- listeners --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        host, port = self.config.listen
        if self.config.out_dir is not None:
            self._out_claim, removed = outdir.claim(Path(self.config.out_dir))
            if removed:
                log.info(
                    "removed %s unfinished file(s) a killed proxy left in %s",
                    len(removed),
                    self.config.out_dir,
                )
        try:
            await self.recorder.start()
        except BaseException:
            self._release_out_dir()
            raise
        try:
            await self._listen(host, port)
        except OSError as exc:  # the OS's message does not name the address
            await self.recorder.stop()
            self._release_out_dir()
            raise OSError(f"cannot listen on {host}:{port}: {os_reason(exc)}") from exc
        if port == 0:
            self.source = f"proxy:{host}:{self.listen_port}"
        if self.config.header_timeout:
            self._header_sweeper = asyncio.get_running_loop().create_task(
                self._sweep_headers(self.config.header_timeout), name="kwire-header-timeouts"
            )
        if self.config.metrics_port is not None:
            await self._serve_admin()
        self._log_rules("fault rules", self.rules.rules, self.config.rules_origin)

    async def _serve_admin(self) -> None:
        config = self.config
        context = None
        if config.admin_tls_cert is not None and config.admin_tls_key is not None:
            context = admin_ssl_context(config.admin_tls_cert, config.admin_tls_key, config.admin_client_ca)
        routes = AdminRoutes(self.metrics, self.ready_state, self.rules_json, self.put_rules)
        auth = AdminAuth(config.metrics_token, config.admin_open, context)
        try:
            self._metrics_server = await serve_admin(
                routes, config.metrics_host, config.metrics_port or 0, auth
            )
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: {os_reason(exc)}"
            ) from exc

    # ---- fault rules: listed, replaced, reloaded --------------------------------------

    def _log_rules(self, what: str, rules: list[Rule], origin: str | None = None) -> None:
        """One line naming the rules (and where they came from), then one per rule."""
        source = f" from {origin}" if origin else ""
        log.info("%s: %s%s", what, len(rules) or "none", source)
        for n, rule in enumerate(rules, 1):
            where = f" ({rule.origin})" if rule.origin else ""
            log.info("  rule %s: %s%s", n, rule.text, where)

    def replace_rules(self, rules: list[Rule]) -> list[Rule]:
        """Make ``rules`` the rules in force, for open connections too."""
        active = self.rules.replace(rules)
        self.metrics.rules_active = len(active)
        return active

    def rules_json(self) -> dict[str, Any]:
        """The rules in force, JSON-ready (``GET /rules``)."""
        return {"rules": [rule.describe() for rule in self.rules.rules]}

    def put_rules(self, text: str) -> dict[str, Any]:
        """``PUT /rules``: replace the rules from YAML/JSON text. ValueError (one line, with the
        line number) keeps the rules in force, counted."""
        from proxy.config_file import parse_rules_text

        try:
            active = self.replace_rules(parse_rules_text(text, "PUT /rules"))
        except ValueError as exc:
            self.metrics.bump(self.metrics.rule_reloads, ("admin", "error"))
            log.warning("PUT /rules refused, the rules in force are kept: %s", exc)
            raise
        self.metrics.bump(self.metrics.rule_reloads, ("admin", "ok"))
        self._log_rules("fault rules replaced", active, "PUT /rules")
        return self.rules_json()

    def reload_rules(self) -> bool:
        """SIGHUP: re-read the rules where they came from and put them in force. A file that
        cannot be used keeps the rules in force (one log line, counted). True if replaced."""
        reload = self.config.rules_reloader
        if reload is None:
            log.warning("SIGHUP: no rules file to re-read (rules come from --inject or nowhere)")
            return False
        try:
            active = self.replace_rules(reload())
        except (ValueError, OSError) as exc:
            self.metrics.bump(self.metrics.rule_reloads, ("signal", "error"))
            log.error("SIGHUP: the rules in force are kept: %s", exc)
            return False
        self.metrics.bump(self.metrics.rule_reloads, ("signal", "ok"))
        self._log_rules("fault rules reloaded (SIGHUP)", active, self.config.rules_origin)
        return True

    # ---- readiness --------------------------------------------------------------------

    async def ready_state(self) -> tuple[bool, str]:
        """(ready, why) for ``/ready``: listening, and a bootstrap broker accepts a TCP
        connection (checked at most every ``READY_REUSE_SECONDS``; concurrent calls share one)."""
        if self.stopping:
            return False, "stopping"
        if not self.servers:
            return False, "not listening"
        if time.monotonic() - self._ready_at < READY_REUSE_SECONDS:
            return self._ready_last
        if self._ready_check is None or self._ready_check.done():
            self._ready_check = asyncio.ensure_future(self._check_brokers())
        return await asyncio.shield(self._ready_check)

    async def _check_brokers(self) -> tuple[bool, str]:
        listening = f"listening on {self.config.listen[0]}:{self.listen_port}"
        result = (False, f"{listening}, but no broker accepts connections")
        for host, port in self.config.bootstrap:
            try:
                _reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port),
                    min(self.config.connect_timeout, READY_CONNECT_SECONDS),
                )
            except OSError as exc:  # TimeoutError too
                why = "timed out" if isinstance(exc, TimeoutError) else os_reason(exc)
                result = (False, f"{listening}, but no broker accepts connections ({host}:{port}: {why})")
                continue
            writer.close()
            result = (True, f"{listening}; broker {host}:{port} accepts connections")
            break
        self._ready_last, self._ready_at = result, time.monotonic()
        return result

    async def _listen(self, host: str, port: int) -> None:
        """Open the bootstrap listener."""
        server = await asyncio.get_running_loop().create_server(
            lambda: ClientProtocol(self, self._bootstrap_targets),
            host,
            port,
            ssl=self.client_ssl,
            reuse_address=True,
            backlog=1024,
        )
        self.servers.append(server)
        self.listen_port = server.sockets[0].getsockname()[1]

    @property
    def metrics_port(self) -> int | None:
        if self._metrics_server is None:
            return None
        return self._metrics_server.sockets[0].getsockname()[1]

    def _bootstrap_targets(self) -> list[tuple[str, int]]:
        return list(self.config.bootstrap)

    def _port_for(self, node_id: int) -> int:
        base = self.config.broker_port_base
        if base is None:
            base = self.listen_port + 1
        if base == 0:
            return 0
        return base + node_id

    def local_address(self, node_id: int, host: str, port: int) -> tuple[str, int] | None:
        """Where clients should reach broker ``node_id`` (now at host:port); opens its
        listener on first sight. None if no listener could be opened (address left as is)."""
        self.nodes[node_id] = (host, port)
        local = self.node_ports.get(node_id)
        if local is None:
            local = self._open_node_listener(node_id)
            if local is None:
                return None
        return self.advertise, local

    def _open_node_listener(self, node_id: int) -> int | None:
        if self.stopping:
            return None
        listen_host = self.config.listen[0]
        port = self._port_for(node_id)
        if not 0 <= port <= 65535:
            log.error("broker %s: listener port %s out of range", node_id, port)
            return None
        try:
            sock = _listening_socket(listen_host, port)  # clients can connect from now on
        except OSError as exc:
            log.error("cannot open a listener for broker %s on %s:%s: %s", node_id, listen_host, port, exc)
            return None
        local = sock.getsockname()[1]
        self.node_ports[node_id] = local
        self.metrics.add("node_listeners")
        self._serve_node(node_id, sock)
        log.info(
            "listening on %s:%s for broker %s (%s:%s), advertised as %s:%s",
            listen_host,
            local,
            node_id,
            *self.nodes[node_id],
            self.advertise,
            local,
        )
        return local

    def _serve_node(self, node_id: int, sock: socket.socket) -> None:
        """Accept clients of broker ``node_id`` on a listening socket."""

        def targets(node_id: int = node_id) -> list[tuple[str, int]]:
            return [self.nodes[node_id]]

        sock.setblocking(False)
        self._node_servers[node_id] = sock

        async def serve() -> None:
            if self._node_servers.get(node_id) is not sock:  # closed before it was served
                return
            server = await asyncio.get_running_loop().create_server(
                lambda: ClientProtocol(self, targets), sock=sock, ssl=self.client_ssl
            )
            self.servers.append(server)
            if self._node_servers.get(node_id) is sock:
                self._node_servers[node_id] = server
            else:  # closed while it was being set up
                server.close()
            if self.stopping:
                server.close()

        asyncio.get_running_loop().create_task(serve())

    # ---- a broker that refuses connections ---------------------------------------------

    def upstream_refused(self, targets: list[tuple[str, int]], error: BaseException | None) -> None:
        """A client's broker refused the connection. If it is one broker's
        listener, close that listener until the broker accepts connections again."""
        if not isinstance(error, ConnectionRefusedError) or len(targets) != 1 or self._loop is None:
            return
        node_id = next((n for n, address in self.nodes.items() if address == targets[0]), None)
        if node_id is None or node_id in self._refusing or self.stopping:
            return
        self._refusing.add(node_id)
        self._loop.call_soon(self._refuse, node_id)

    def _refuse(self, node_id: int) -> None:
        """Close broker ``node_id``'s listener (on the loop) and start probing the broker."""
        server = self._node_servers.pop(node_id, None)
        if self.stopping or server is None:
            self._refusing.discard(node_id)
            return
        self._close_listener(server)
        log.warning(
            "broker %s (%s:%s) refuses connections: so does %s:%s until it accepts them again",
            node_id,
            *self.nodes[node_id],
            self.advertise,
            self.node_ports[node_id],
        )
        self.metrics.add("node_listeners", -1)
        asyncio.get_running_loop().create_task(self._probe(node_id))

    def _close_listener(self, server: Any) -> None:
        if isinstance(server, socket.socket):  # not served yet
            server.close()
        else:
            if server in self.servers:
                self.servers.remove(server)
            server.close()

    async def _probe(self, node_id: int) -> None:
        """Reopen broker ``node_id``'s listener once the broker accepts a connection."""
        port = self.node_ports[node_id]
        while not self.stopping:
            await asyncio.sleep(REFUSED_PROBE_SECONDS)
            host, broker_port = self.nodes[node_id]
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, broker_port), self.config.connect_timeout
                )
            except (OSError, TimeoutError):
                continue
            writer.close()
            if self.stopping:
                break
            try:
                sock = _listening_socket(self.config.listen[0], port)
            except OSError as exc:
                log.error("cannot reopen the listener for broker %s on port %s: %s", node_id, port, exc)
                continue
            self._serve_node(node_id, sock)
            self.metrics.add("node_listeners")
            log.info("broker %s accepts connections again: %s:%s reopened", node_id, self.advertise, port)
            break
        self._refusing.discard(node_id)

    # ---- connections that never finish a request header ------------------------------

    async def _sweep_headers(self, timeout: float) -> None:
        """Close connections whose request header is overdue (``Session.header_expired``),
        checking every quarter of the timeout: one is closed 1 to 1.25 timeouts after its
        header began."""
        period = min(max(timeout / 4, 0.05), 5.0)
        while not self.stopping:
            await asyncio.sleep(period)
            now = time.monotonic()
            expired = [session for session in list(self.sessions) if session.header_expired(now)]
            for session in expired:
                try:
                    session.abort("rst")
                except Exception:  # one connection's trouble must not end the sweeps
                    log.exception("closing client %s:%s failed", *session.client_addr)
            if expired:
                self.metrics.add("header_timeouts", len(expired))
                log.warning(
                    "closed %s connection(s) that left a request header unfinished for %s s (e.g. %s:%s)",
                    len(expired),
                    timeout,
                    *expired[0].client_addr,
                )

    # ---- lifecycle --------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop accepting, close open connections, write the last rows."""
        if self.stopping:
            return
        self.stopping = True
        for server in self.servers:
            server.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._header_sweeper is not None:
            self._header_sweeper.cancel()
        self.endings.run_all()  # ends seen before the stop are recorded as they were
        for session in list(self.sessions):
            session.abort("open_at_end")
        await asyncio.sleep(0)
        self.endings.run_all()
        await self.recorder.stop()
        self._release_out_dir()

    def _release_out_dir(self) -> None:
        if self._out_claim is not None:
            os.close(self._out_claim)  # the lock on the output directory goes with it
            self._out_claim = None

    async def serve(self, ready: Any = None) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly."""
        tune_malloc()
        await self.start()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, done.set)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload_rules)
        if ready is not None:
            ready(self)
        await done.wait()
        log.info("stopping: writing the last rows")
        await self.stop()
        if self.config.out_dir is not None:
            m = self.metrics
            log.info(
                "stopped: %d rows written; the recorder skipped %d bytes (%d gap rows) and dropped %d rows",
                m.rows_written,
                m.dropped_bytes,
                m.gap_rows,
                m.dropped_rows,
            )


def os_reason(exc: OSError) -> str:
    """The OS's words for a failed bind (asyncio wraps them in a sentence of its own); a name
    that does not resolve has the resolver's words (its codes are not errno values)."""
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A blocking TCP socket listening on host:port (port 0: the OS picks)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock
