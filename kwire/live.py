"""Capture streams: standard input, or a capture program reading an interface, decoded as packets arrive.

kwire does not open raw sockets itself: a live interface is read through a maintained capture
program, ``tcpdump`` (preferred) or Wireshark's ``dumpcap``, writing pcap/pcapng to a pipe
(``-w -``), which kwire reads with ``decoder.pcap.iter_stream_segments``. So capture filters are
the BPF filters users know (``-f 'tcp port 9092'``), compiled and run in the kernel by libpcap,
and the privilege needed is the capture program's (``CAP_NET_RAW`` and ``CAP_NET_ADMIN``, or root).
``KWIRE_CAPTURE_PROGRAM=tcpdump|dumpcap`` chooses one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from decoder.pcap import CaptureError, CaptureStats, TcpSegment, iter_stream_segments
from decoder.tcp import TcpReassembler
from kwire.pipeline import DecodeSummary, Row, StreamDecoder

__all__ = ["CaptureProgram", "CaptureProgramError", "EndOnInterrupt", "capture_command", "decode_stream"]

#: The script that runs the capture program and ends it when kwire dies.
_GUARD = Path(__file__).with_name("capture_guard.py")
#: Environment variable naming the capture program (tcpdump or dumpcap).
PROGRAM_ENV = "KWIRE_CAPTURE_PROGRAM"


class CaptureProgramError(Exception):
    """The capture program is missing, or stopped with an error; the message is one line."""


#: How long a packet can wait in tcpdump's kernel ring without ``--immediate-mode``: a block of the
#: TPACKET_V3 ring is handed over when full or after tcpdump's 1 s timeout (and some scheduling).
RING_DELAY_S = 1.5


def capture_command(
    interface: str, capture_filter: str | None, program: str | None = None, *, immediate: bool = False
) -> list[str]:
    """The command line that writes the interface's packets to stdout as they are captured.

    ``immediate``: hand each packet over at once, for a person watching rows appear. It costs
    capacity: libpcap then uses a TPACKET_V2 ring of fixed slots as large as the interface's
    largest packet (64 KiB on lo and on any interface with GRO), and loopback fills two slots per
    packet, so the 64 MiB ring holds about 500 packets (a quiet 2,000-message ping-pong on lo lost
    631 of them). Without it the TPACKET_V3 ring packs packets into blocks and held every packet
    (3,987) of a burst sent while tcpdump was stopped; packets then arrive up to ``RING_DELAY_S``
    late. A recorder (``-o``, ``kwire capture``) wants the capacity."""
    name = program or os.environ.get(PROGRAM_ENV) or ("tcpdump" if shutil.which("tcpdump") else "dumpcap")
    path = shutil.which(name)
    if path is None:
        raise CaptureProgramError(
            f"live capture needs tcpdump or dumpcap, and {name} is not installed (apt-get install tcpdump)"
        )
    base = os.path.basename(name)
    if base == "tcpdump":
        # -U: write each packet at once; -s 0: whole packets
        # -B: a 64 MiB kernel buffer (KiB), so a burst while kwire is busy is not dropped
        command = [path, "-i", interface, "-U", "-B", "65536", "-s", "0", "-n", "-w", "-"]
        command += ["--immediate-mode"] if immediate else []
        return command + ([capture_filter] if capture_filter else [])
    if base == "dumpcap":
        command = [path, "-i", interface, "-q", "-B", "64", "-s", "0", "-w", "-"]
        return command + (["-f", capture_filter] if capture_filter else [])
    raise CaptureProgramError(f"{PROGRAM_ENV}={name}: kwire knows how to drive tcpdump and dumpcap only")


class CaptureProgram:
    """A running capture program; ``stdout`` is its pcap stream. Stop it with ``stop`` (always)."""

    def __init__(
        self,
        interface: str,
        capture_filter: str | None = None,
        program: str | None = None,
        *,
        immediate: bool = False,
    ) -> None:
        self.interface = interface
        self.command = capture_command(interface, capture_filter, program, immediate=immediate)
        # Started through kwire.capture_guard, which ends it when kwire dies (even by SIGKILL;
        # when the thread starting it ends, which is when capturing ends). Its own process group:
        # Ctrl-C at the terminal reaches kwire, which stops it after reading what it already
        # wrote (and its "N packets captured" lines stay out of the way); signals to the group
        # reach the guard and the program.
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_GUARD), str(os.getpid()), *self.command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self.stdout: IO[bytes] = self.process.stdout

    @property
    def pid(self) -> int:
        return self.process.pid

    def end(self, timeout: float = 5.0, *, drain: float = 0.0) -> int | None:
        """End the program (SIGTERM, then SIGKILL after ``timeout`` s) and wait for it; its exit
        code. Its streams stay open: a reader on another thread reads what it wrote, then EOF.

        ``drain``: first wait that long, so that the reader gets the packets still in the
        kernel's ring (``RING_DELAY_S``)."""
        process = self.process
        if drain > 0 and process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(drain)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout)
        return process.returncode

    def stop(self, timeout: float = 5.0, *, drain: float = 0.0) -> int | None:
        """End the program (``end``) and close its streams; its exit code."""
        process = self.process
        self.end(timeout, drain=drain)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        return process.returncode

    def failure(self, timeout: float = 5.0) -> str:
        """After its stream ended: why it stopped, in one line (its last error line)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return f"{os.path.basename(self.command[0])} stopped writing"
        text = b""
        if self.process.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                text = self.process.stderr.read(1 << 16)
        lines = [
            line.strip()
            for line in text.decode(errors="replace").splitlines()
            if line.strip() and "listening on" not in line and "packets " not in line
        ]
        what = lines[0] if lines else f"exited with code {code}"
        name = os.path.basename(self.command[0])
        return what if what.startswith(name) else f"{name}: {what}"


class EndOnInterrupt:
    """While in use, Ctrl-C (SIGINT) ends ``program`` instead of interrupting the reader: after
    ``drain`` seconds (the kernel ring's delay, ``RING_DELAY_S``, or 0 in immediate mode) and in a
    thread of its own, so the reader goes on reading until the program's stream ends, with every
    packet it had captured. ``interrupted`` tells it happened; a second Ctrl-C interrupts at once
    (KeyboardInterrupt), as before. ``on_interrupt`` is called on the first (a notice)."""

    def __init__(self, program: CaptureProgram, drain: float, on_interrupt: Callable[[], None]) -> None:
        self.program = program
        self.drain = drain
        self.on_interrupt = on_interrupt
        self.interrupted = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        self.on_interrupt()
        threading.Thread(
            target=self.program.end, kwargs={"drain": self.drain}, name="kwire-capture-end", daemon=True
        ).start()

    def __enter__(self) -> EndOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def decode_stream(
    segments: Iterator[TcpSegment],
    source: str,
    on_exchange: Callable[[Row], None],
    on_connection: Callable[[Row], None],
    *,
    forced_ports: tuple[int, ...] | list[int] = (),
    frame_limit: int | None = None,
    after_segment: Callable[[], None] | None = None,
    reassembler: TcpReassembler | None = None,
    decoder: StreamDecoder | None = None,
) -> tuple[DecodeSummary, CaptureError | None]:
    """Decode segments as they arrive (``kwire.decode_command.decode_captures`` for one stream).

    ``after_segment`` is called after each segment's rows were handed over (a printer flushes
    there, so each exchange shows when its response arrives). Open connections are closed as
    ``open_at_end`` at the end of the stream, also when it ends with KeyboardInterrupt (which is
    then raised again). Damage in the stream is returned, like ``decode_captures`` does.
    """
    kwargs = {} if frame_limit is None else {"frame_limit": frame_limit}
    reassembler = reassembler or TcpReassembler()
    streams = decoder or StreamDecoder(
        source, on_exchange, on_connection, forced_ports=forced_ports, **kwargs
    )
    error: CaptureError | None = None
    last = 0
    rfeed = reassembler.feeder()
    try:
        for segment in segments:
            last = max(last, segment.ts_ns)
            for event in rfeed(segment):
                streams.feed(event)
            if after_segment is not None:
                after_segment()
    except CaptureError as exc:
        error = exc
    finally:
        for event in reassembler.finish(last):
            streams.feed(event)
    return streams.summary, error


def stdin_segments(stats: CaptureStats) -> Iterator[TcpSegment]:
    """The segments of a pcap/pcapng stream on standard input."""
    import sys

    return iter_stream_segments(sys.stdin.buffer, "-", stats)
