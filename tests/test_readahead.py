"""Reading a capture a chunk ahead (decoder/_readahead.c) and completing a straddling record from the
next chunk (``decoder.pcap``): the same bytes, the same segments, counters and errors as a plain read,
whatever the chunk size, on real captures and damaged copies."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from test_pcapscan import _read as _read_either_way

from decoder import pcap

REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "captures" / "tansu-mixed.pcap"
CAPTURES = sorted([*REPO.glob("captures/*.pcap"), *REPO.glob("captures/lab/**/capture.pcap")])

pytestmark = pytest.mark.skipif(pcap._read_ahead is None, reason="KWIRE_PURE_PYTHON=1: no read-ahead")


def _chunks(path: Path, offset: int, chunk: int) -> list[bytes]:
    with open(path, "rb") as f:
        ahead = pcap._read_ahead.ReadAhead(f.fileno(), offset, chunk)
    out = list(iter(ahead.next, b""))
    assert ahead.next() == b"" and ahead.next() == b""  # the end, as often as asked
    ahead.close()
    ahead.close()
    with pytest.raises(ValueError, match="closed"):
        ahead.next()
    return out


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
@pytest.mark.parametrize("offset", [0, 24, 1000])
def test_chunks_are_the_files_bytes_in_order(chunk: int, offset: int) -> None:
    """From ``offset`` on, in chunks of ``chunk`` bytes (the last shorter); the file it was given may
    be closed at once (the reader has a copy of its descriptor)."""
    data = SMALL.read_bytes()
    chunks = _chunks(SMALL, offset, chunk)
    assert b"".join(chunks) == data[offset:]
    assert all(len(c) == chunk for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk


def test_a_file_that_grows_is_read_on(tmp_path: Path) -> None:
    path = tmp_path / "growing"
    path.write_bytes(b"a" * 10)
    with open(path, "rb") as f:
        ahead = pcap._read_ahead.ReadAhead(f.fileno(), 0, 8)
        assert [ahead.next(), ahead.next(), ahead.next()] == [b"a" * 8, b"aa", b""]
        with open(path, "ab") as more:
            more.write(b"b" * 3)
        assert [ahead.next(), ahead.next()] == [b"bbb", b""]
        ahead.close()


def test_a_read_error_is_an_oserror_where_it_happened(tmp_path: Path) -> None:
    """(A directory cannot be read: EISDIR, as a failing disk gives EIO.)"""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        ahead = pcap._read_ahead.ReadAhead(fd, 0, 4096)
        for _ in range(2):  # and again, not a hang
            with pytest.raises(OSError) as caught:
                ahead.next()
            assert caught.value.errno == 21
        ahead.close()
    finally:
        os.close(fd)


def test_a_forked_process_reads_on_without_the_thread() -> None:
    """The thread is not copied into a child (``kwire decode -j N`` forks): it reads there itself."""
    data = SMALL.read_bytes()
    with open(SMALL, "rb") as f:
        ahead = pcap._read_ahead.ReadAhead(f.fileno(), 0, 4096)
    first = ahead.next()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if it read the rest right
        os._exit(0 if first + b"".join(iter(ahead.next, b"")) == data else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first + b"".join(iter(ahead.next, b"")) == data  # and the parent too
    ahead.close()


def _same_in_any_chunks(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def _read(path: Path) -> tuple[list[Any], Any, Any]:
        return _read_either_way(path, pcap._scan is not None, monkeypatch)

    """Segments, counters and error: the same read ahead in 4 MiB chunks, read plainly, and read
    ahead in chunks smaller than a record (every record then straddles, some several chunks)."""
    reference = _read(path)
    assert reference[0] or reference[2]
    with monkeypatch.context() as mp:
        mp.setattr(pcap, "_read_ahead", None)
        assert _read(path) == reference
    for chunk in (17, 200, 5000):
        with monkeypatch.context() as mp:
            mp.setattr(pcap, "_CHUNK", chunk)
            assert _read(path) == reference, chunk


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_captures_read_the_same_in_any_chunks(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_in_any_chunks(path, monkeypatch)


@pytest.mark.parametrize("seed", range(8))
def test_damaged_captures_read_the_same_in_any_chunks(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut anywhere, with garbage after the cut or bytes changed before it."""
    rng = random.Random(seed)
    data = bytearray(SMALL.read_bytes())
    cut = rng.randrange(24, len(data))
    damaged = data[:cut] + (bytes(rng.randrange(256) for _ in range(40)) if seed % 2 else b"")
    if seed % 3 == 0:
        at = rng.randrange(24, cut)
        damaged[at : at + 8] = bytes(rng.randrange(256) for _ in range(8))
    path = tmp_path / "damaged.pcap"
    path.write_bytes(bytes(damaged))
    _same_in_any_chunks(path, monkeypatch)
