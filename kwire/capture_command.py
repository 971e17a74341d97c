"""``kwire capture -i IFACE -o DIR``: the passive sidecar. It watches a broker's (or a client's) traffic
on an interface and records it like the proxy does, without being in the data path.

Packets come from a capture program (``kwire.live.CaptureProgram``: tcpdump or dumpcap, so
``CAP_NET_RAW``/``CAP_NET_ADMIN`` or root), are reassembled (``decoder.tcp``) and handed, per
connection and direction, to the proxy's own ``proxy.recorder.Recorder``: the same decoding, the
same rolling Parquet files renamed into place when complete, the same bounds (a queue bounded in
bytes whose overflow becomes a counted gap, a bound on rows waiting for the writer), the same
``DIR/.kwire-proxy.lock`` claim and the same Prometheus metrics and names, requests included
(``kwire.sidecar_requests`` counts them from the client's bytes as the proxy does), on the same
admin endpoint (``proxy.admin``: ``/metrics``, ``/healthz``, and ``/ready`` while the capture
program runs; ``--metrics-token-file`` as for the proxy).

Which side is the broker: the side on a ``--port`` (9092 unless given); connections on no such port
are not recorded. A connection already open when the capture starts is joined mid-way: its decoder
hunts for the first frame boundary, as after a lost packet.

When the capture program stops (the interface went away, it was killed), the sidecar starts it
again after a pause that grows to 5 s (back to 0.5 s once one ran 30 s); connections carry on
(their missing bytes become gaps). A program that cannot start the first time (no such interface,
a filter it cannot compile, no permission) is an error: one line and exit 2, unless
``--wait-for-interface`` asks to keep trying as after a stop (a sidecar started before its
interface exists). tcpdump keeps running while an interface is merely down (no
packets come); it exits when the interface is removed, and then cannot start until it is back.
SIGTERM or Ctrl-C: the last rows are written and the files renamed before it exits (0; 130 for Ctrl-C).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from kwire.sidecar_requests import RequestCounter

__all__ = ["Sidecar", "capture"]

log = logging.getLogger("kwire.capture")


class Sidecar:
    """Capture program -> TCP reassembly -> ``Recorder``; the reading runs on a thread of its own."""

    def __init__(
        self,
        interface: str,
        capture_filter: str | None,
        ports: list[int],
        recorder: Any,
        metrics: Any,
        *,
        wait_for_interface: bool = False,
    ) -> None:
        from decoder.tcp import TcpReassembler

        self.interface = interface
        #: keep trying when the first capture program cannot start (else: the command fails)
        self.wait_for_interface = wait_for_interface
        self.started_once = False  # a capture program has written its stream's header
        self.capture_filter = capture_filter
        self.ports = set(ports)
        self.recorder = recorder
        self.metrics = metrics
        self.reassembler = TcpReassembler()
        self.stopping = threading.Event()
        self.program: Any = None
        self.restarts = 0
        self.packets = 0
        self.error: str | None = None
        self._conns: dict[int, tuple[bool, int]] = {}  # reassembler id -> (swapped, key)
        self._requests: dict[int, RequestCounter] = {}  # reassembler id -> its request counter
        self._issued: dict[str, int] = {}
        self._last_ts = 0
        self.ended = threading.Event()  # the reading thread has ended, however it ended
        #: called on the reading thread as it ends (``_serve`` wakes on it rather than polling)
        self.on_exit: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._reading, name="kwire-capture", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def capturing(self) -> bool:
        """Whether a capture program is running now."""
        program = self.program
        return program is not None and program.process.poll() is None and not self.stopping.is_set()

    async def ready(self) -> tuple[bool, str]:
        """(ready, why) for ``/ready``: the capture program runs."""
        if self.capturing():
            return True, f"capturing on {self.interface} (restarts: {self.restarts})"
        return False, f"no capture running on {self.interface} (restarts: {self.restarts})"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop capturing, after the packets still in the kernel's ring; the open connections are
        closed as ``open_at_end``."""
        from kwire.live import RING_DELAY_S

        self.stopping.set()
        program = self.program
        if program is not None:
            program.stop(drain=RING_DELAY_S)
        self._thread.join(timeout)
        for event in self.reassembler.finish(self._last_ts or time.time_ns()):
            self._event(event)

    # ---- the reading thread -------------------------------------------------------------

    def _reading(self) -> None:
        try:
            self._run()
        finally:
            self.ended.set()
            if self.on_exit is not None:
                self.on_exit()

    def _run(self) -> None:
        from decoder.pcap import CaptureError, CaptureStats, iter_stream_segments
        from kwire.live import CaptureProgram, CaptureProgramError

        pause = 0.5
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.program = CaptureProgram(self.interface, self.capture_filter)
            except (CaptureProgramError, OSError) as exc:
                self.error = str(exc)
                log.error("%s", exc)
                return
            feed, event = self.reassembler.feeder(), self._event
            stats = CaptureStats()  # its ``files`` becomes 1 once the stream's header is read
            try:
                for segment in iter_stream_segments(self.program.stdout, self.interface, stats):
                    self.packets += 1
                    if segment.ts_ns > self._last_ts:
                        self._last_ts = segment.ts_ns
                    for item in feed(segment):
                        event(item)
                    self.recorder.catch_up()
            except CaptureError as exc:
                log.debug("capture stream ended: %s", exc)
            except (OSError, ValueError) as exc:  # the pipe closed under us by stop()
                log.debug("capture stream closed: %s", exc)
            if self.stopping.is_set():
                break
            why = self.program.failure(timeout=1.0)
            self.program.stop()
            self.started_once = self.started_once or stats.files > 0
            if not self.started_once and not self.wait_for_interface:
                # it never captured: a bad interface, filter or permission
                self.error = f"cannot capture on {self.interface}: {why}"
                if not _interface_exists(self.interface):
                    self.error += " (--wait-for-interface waits for it)"
                return
            if time.monotonic() - started > 30:
                pause = 0.5  # it ran a good while: this is a new failure, not the same one again
            self.restarts += 1
            log.warning("capture on %s stopped (%s); starting it again in %.1fs", self.interface, why, pause)
            self.stopping.wait(pause)
            pause = min(pause * 2, 5.0)

    def _event(self, event: Any) -> None:
        from decoder.tcp import StreamClosed, StreamData, StreamGap, StreamOpened
        from kwire.rows import ConnectionInfo, ended_by

        kind = type(event)
        if kind is StreamData:
            entry = self._conns.get(event.conn_id)
            if entry is not None:
                swapped, key = entry
                direction = event.direction ^ swapped
                self.recorder.data(key, direction, event.data, event.ts_ns)
                self.metrics.add("bytes_to_client" if direction else "bytes_to_broker", len(event.data))
                if not direction:
                    self._requests[event.conn_id].data(event.data)
        elif kind is StreamGap:
            entry = self._conns.get(event.conn_id)
            if entry is not None:
                direction = event.direction ^ entry[0]
                self.recorder.gap(entry[1], direction, event.nbytes, event.ts_ns)
                if not direction:
                    self._requests[event.conn_id].gap()
        elif kind is StreamOpened:
            if event.server_port in self.ports:
                swapped, opened = False, event
            elif event.client_port in self.ports:
                swapped, opened = True, event.swapped()
            else:
                return  # not a broker's connection
            key = event.conn_id
            base = f"{opened.ts_ns // 1000}-{opened.client_port}-{opened.server_port}"
            n = self._issued.get(base, 0) + 1
            if len(self._issued) >= 100_000:
                self._issued.clear()
            self._issued[base] = n
            info = ConnectionInfo(
                f"capture:{self.interface}",
                base if n == 1 else f"{base}-{n}",
                opened.client_ip,
                opened.client_port,
                opened.server_ip,
                opened.server_port,
            )
            self._conns[key] = (swapped, key)
            self._requests[key] = RequestCounter(self.metrics, synced=event.syn_seen)
            self.recorder.open(key, info, event.ts_ns)
            self.metrics.add("connections_open")
            self.metrics.add("connections_total")
            if not event.syn_seen:  # joined mid-way: find the frame boundaries
                self.recorder.gap(key, 0, 1, event.ts_ns)
                self.recorder.gap(key, 1, 1, event.ts_ns)
        elif kind is StreamClosed:
            entry = self._conns.pop(event.conn_id, None)
            self._requests.pop(event.conn_id, None)
            if entry is not None:
                swapped, key = entry
                to_server, to_client = event.stats.directions
                up, down = (to_client, to_server) if swapped else (to_server, to_client)
                end = ended_by(event.stats, swapped)
                stats = {
                    "bytes_to_broker": up.bytes + up.gap_bytes,
                    "bytes_to_client": down.bytes + down.gap_bytes,
                    "ended_by": end["ended_by"],
                    "end_ns": end["end_time"] * 1000 if end["end_time"] is not None else None,
                }
                self.recorder.close(key, event.ts_ns, event.how, stats)
                self.metrics.add("connections_open", -1)


def _interface_exists(name: str) -> bool:
    """Whether ``name`` is a network interface here (or one of the capture program's own names:
    ``any``, an index)."""
    import socket

    if name == "any" or name.isdigit():
        return True
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


async def _serve(
    sidecar: Sidecar,
    recorder: Any,
    metrics: Any,
    metrics_host: str,
    metrics_port: int | None,
    token: str | None = None,
) -> int:
    from proxy.admin import AdminAuth, AdminRoutes, serve_admin
    from proxy.server import os_reason

    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    code = 0

    def on_signal(signum: int) -> None:
        nonlocal code
        code = 130 if signum == signal.SIGINT else 0
        done.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    recorder.start()
    server = None
    if metrics_port is not None:
        try:
            server = await serve_admin(
                AdminRoutes(metrics, ready=sidecar.ready), metrics_host, metrics_port, AdminAuth(token)
            )
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {metrics_host}:{metrics_port}: {os_reason(exc)}") from exc
    sidecar.on_exit = lambda: loop.call_soon_threadsafe(done.set)
    sidecar.start()
    port = server.sockets[0].getsockname()[1] if server is not None else None
    extra = f", metrics on {metrics_host}:{port}" if port is not None else ""
    print(f"kwire capture: recording {sidecar.interface}{extra}", file=sys.stderr, flush=True)
    await done.wait()  # a signal, or the reading thread ended
    if sidecar.ended.is_set() and not sidecar.stopping.is_set():
        code = 2  # the capture program cannot be started (at all, or the first time)
    await loop.run_in_executor(None, sidecar.stop)
    await recorder.stop()
    if server is not None:
        server.close()
    if code == 2:
        print(f"kwire capture: {sidecar.error}", file=sys.stderr)
    return code


def capture(
    interface: Annotated[
        str, typer.Option("-i", "--interface", help="interface to capture on (e.g. eth0, lo)")
    ],
    out: Annotated[Path, typer.Option("-o", "--out", help="dataset directory to record into (created)")],
    capture_filter: Annotated[
        str | None,
        typer.Option(
            "-f", "--capture-filter", help="BPF capture filter [default: tcp port PORT for each --port]"
        ),
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option(
            "--port", min=1, max=65535, help="a broker port (repeatable) [default: 9092]", show_default=False
        ),
    ] = None,
    flush_seconds: Annotated[float, typer.Option(help="close and publish Parquet files this often")] = 10.0,
    flush_rows: Annotated[int, typer.Option(help="... or once this many rows are waiting")] = 100_000,
    max_queue_mb: Annotated[
        int, typer.Option(help="recorder queue bound; bytes beyond it are not decoded (counted)")
    ] = 64,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    metrics_host: Annotated[str, typer.Option(help="address the metrics endpoint binds")] = "127.0.0.1",
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            help="file holding a token /metrics then asks for (Authorization: Bearer TOKEN); "
            "or set KWIRE_METRICS_TOKEN"
        ),
    ] = None,
    wait_for_interface: Annotated[
        bool,
        typer.Option(
            help="when the capture cannot start (e.g. no such interface yet), keep trying "
            "(pauses up to 5 s) instead of exiting with its error"
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Passive sidecar: record the Kafka traffic on an interface into rolling Parquet files, as the
    proxy does, without being in the data path (needs CAP_NET_RAW and CAP_NET_ADMIN, or root)."""
    from kwire.proxy_command import _metrics_token, recording_bounds_error
    from proxy.metrics import Metrics
    from proxy.outdir import claim
    from proxy.recorder import Recorder

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s kwire capture %(levelname)s %(message)s",
    )

    def fail(message: str) -> typer.Exit:
        print(f"kwire capture: {message}", file=sys.stderr)
        return typer.Exit(2)

    if str(out) == "-":
        raise fail(
            "-o -: the sidecar records a dataset directory; to print live exchanges, use kwire decode -i"
        )
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise fail(f"--metrics-port {metrics_port}: the port must be a number from 0 to 65535")
    wrong = recording_bounds_error(flush_seconds, flush_rows, max_queue_mb)
    if wrong:
        raise fail(wrong)
    token = _metrics_token(metrics_token_file, "kwire capture")
    ports = port or [9092]
    bpf = capture_filter or " or ".join(f"tcp port {p}" for p in ports)
    try:
        lock_fd, _ = claim(out)
    except OSError as exc:
        raise fail(str(exc)) from None
    from kwire.live import RING_DELAY_S, CaptureProgramError, capture_command

    try:
        capture_command(interface, bpf)  # tcpdump or dumpcap is there
    except CaptureProgramError as exc:
        raise fail(str(exc)) from None
    metrics = Metrics()
    # packets reach kwire up to RING_DELAY_S after their timestamps: that is not decoding's lag
    recorder = Recorder(
        out,
        metrics,
        flush_seconds=flush_seconds,
        flush_rows=flush_rows,
        max_queue_bytes=max_queue_mb << 20,
        feed_delay_seconds=RING_DELAY_S,
    )
    sidecar = Sidecar(interface, bpf, ports, recorder, metrics, wait_for_interface=wait_for_interface)
    try:
        code = asyncio.run(_serve(sidecar, recorder, metrics, metrics_host, metrics_port, token))
    except OSError as exc:
        raise fail(str(exc)) from None
    finally:
        os.close(lock_fd)
    if code:
        raise typer.Exit(code)
