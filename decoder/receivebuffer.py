"""A per-direction receive buffer that remembers when each byte arrived.

Bytes are appended to one ``bytearray`` and consumed by advancing ``pos`` instead of
re-slicing: slicing the front off a buffer on every frame copies everything behind it, so a
peer sending many small frames (or a stream fed one byte at a time) would cost quadratic
time. The consumed prefix is dropped only when it is at least half the buffer, which keeps
the work per byte constant. Frames are decoded in place (``buf`` with offsets), never copied.
"""

from __future__ import annotations

from collections import deque

__all__ = ["ReceiveBuffer"]

_COMPACT_MIN = 1 << 16


class ReceiveBuffer:
    """Bytes of one direction of one connection, plus their arrival times."""

    __slots__ = ("base", "buf", "marks", "pos")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0  # first unconsumed byte in buf
        self.base = 0  # stream offset of buf[0]
        self.marks: deque[tuple[int, int]] = deque()  # (stream offset of a chunk, its time)

    def append(self, data: bytes, ts_ns: int) -> None:
        """Add a chunk that arrived at ``ts_ns``."""
        self.marks.append((self.base + len(self.buf), ts_ns))
        self.buf += data

    def available(self) -> int:
        return len(self.buf) - self.pos

    def time_at(self, index: int) -> int:
        """Arrival time of ``buf[index]`` (indexes must be asked for in increasing order)."""
        offset = self.base + index
        marks = self.marks
        while len(marks) > 1 and marks[1][0] <= offset:
            marks.popleft()
        return marks[0][1] if marks else 0

    def consume_to(self, index: int) -> None:
        """Mark everything before ``buf[index]`` consumed; compact when worthwhile."""
        self.pos = index
        size = len(self.buf)
        if index >= size:
            self.base += size
            self.buf.clear()
            self.pos = 0
            last = self.marks[-1] if self.marks else None
            self.marks.clear()
            if last is not None:
                self.marks.append((self.base, last[1]))
        elif index >= _COMPACT_MIN and index * 2 >= size:
            del self.buf[:index]
            self.base += index
            self.pos = 0

    def compact(self) -> None:
        """Drop the consumed prefix now, so ``buf[0]`` is the first unconsumed byte."""
        if self.pos:
            del self.buf[: self.pos]
            self.base += self.pos
            self.pos = 0

    def clear(self) -> None:
        """Discard everything buffered (after a gap)."""
        self.consume_to(len(self.buf))
