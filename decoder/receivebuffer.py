"""A per-direction receive buffer that remembers when each byte arrived.

Two ways to hold bytes, because most bytes need neither copying nor scanning:

* ``parts``: the frame in progress of a direction that is in step with the framing. The
  decoder frames each chunk where it lies and decodes every frame wholly inside it in place;
  only the frame that runs past the chunk's end is held here, as references to the chunks
  (``bytes`` is immutable, so nothing is copied), and joined once, when its last byte
  arrives. Small pieces are copied into one ``bytearray`` instead, so a stream fed a byte at
  a time does not hold an object per byte.
* ``buf``: a ``bytearray`` for everything else (a direction hunting for a frame start, or
  the bytes of a frame in progress when a gap or the end needs them contiguous). Bytes are
  consumed by advancing ``pos`` instead of re-slicing: slicing the front off a buffer on
  every frame copies everything behind it, so a peer sending many small frames (or a stream
  fed one byte at a time) would cost quadratic time. The consumed prefix is dropped only
  when it is at least half the buffer, which keeps the work per byte constant.

``parts`` is only ever used while ``buf`` holds nothing unconsumed: the held frame comes
first in the stream, and ``spill`` moves it into ``buf`` when contiguous bytes are needed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["ReceiveBuffer"]

_COMPACT_MIN = 1 << 16
#: Pieces shorter than this are copied into the held frame rather than referenced.
_SMALL_PIECE = 8 << 10


class ReceiveBuffer:
    """Bytes of one direction of one connection, plus their arrival times."""

    __slots__ = ("base", "buf", "frame_ns", "held", "marks", "need", "parts", "pos")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0  # first unconsumed byte in buf
        self.base = 0  # stream offset of buf[0] (of the held frame's first byte while one is held)
        self.marks: deque[tuple[int, int]] = deque()  # (stream offset of a chunk, its time)
        self.parts: list[Any] = []  # pieces of the frame in progress (see the module docstring)
        self.held = 0  # bytes in parts
        self.need = 0  # size of the held frame, length prefix included (0: prefix not all in yet)
        self.frame_ns = 0  # arrival time of the held frame's first byte

    def append(self, data: Any, ts_ns: int) -> None:
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

    # ---- the held frame -----------------------------------------------------------------

    def hold(self, piece: Any) -> None:
        """Add the next piece of the frame in progress (``bytes``, or a view of one)."""
        self.held += len(piece)
        parts = self.parts
        if len(piece) >= _SMALL_PIECE:
            parts.append(piece)
        elif parts and type(parts[-1]) is bytearray:
            parts[-1] += piece
        else:
            parts.append(bytearray(piece))

    def take_frame(self) -> bytes | bytearray:
        """The held frame, now complete, in one piece (joined once); nothing is held after."""
        parts = self.parts
        frame = parts[0] if len(parts) == 1 and type(parts[0]) is not memoryview else b"".join(parts)
        self.drop_frame()
        return frame

    def drop_frame(self) -> None:
        """Forget the held frame, now complete and decoded from its pieces."""
        self.base += self.held
        self._release()

    def spill(self) -> None:
        """Move the held bytes into ``buf`` (empty until now), arrived when the frame's first did."""
        if self.held:
            parts = self._release()
            self.append(parts[0] if len(parts) == 1 else b"".join(parts), self.frame_ns)

    def spill_head(self, size: int) -> int:
        """Forget the held frame but for its first ``size`` bytes, moved into ``buf`` (enough to
        name the frame in a report, without joining the rest); returns how many bytes were held."""
        held = self.held
        head = bytearray()
        for part in self.parts:
            head += part[: size - len(head)]
            if len(head) >= size:
                break
        self._release()
        self.append(head, self.frame_ns)
        return held

    def _release(self) -> list[Any]:
        """Stop holding a frame; return its pieces."""
        parts = self.parts
        self.parts = []
        self.held = self.need = 0
        return parts

    def park(self) -> None:
        """Hold the unconsumed bytes of ``buf`` (a frame in progress) as the held frame."""
        pos = self.pos
        self.frame_ns = self.time_at(pos)
        self.base += pos
        del self.buf[:pos]  # cheap: a bytearray drops its front without moving the rest
        self.parts = [self.buf]
        self.held = len(self.buf)
        self.need = 0
        self.buf = bytearray()
        self.pos = 0
        self.marks.clear()
