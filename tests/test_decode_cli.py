"""``kwire decode`` as a user meets it: bad input, damaged captures, output handling, exit codes.

Every failure must be one line on stderr (no traceback) with exit code 2 (130 for Ctrl-C), and a
damaged capture must keep, in the Parquet, every row decoded before the damage. Captures are the
bundled real ones, cut or wrapped, and small conversations built packet by packet
(``test_decode_reassembly.Conversation``) carrying garbage, TLS, or absurd frame lengths.
"""

from __future__ import annotations

import bz2
import gzip
import os
import shutil
import ssl
import struct
import subprocess
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from kafka_frames import heartbeat_v0, heartbeat_v0_response, request
from realkafka import self_signed_certificate
from test_decode_reassembly import _HEADER, Conversation, write
from typer.testing import CliRunner

import kwire.decode_command as decode_command
from kwire.cli import app
from kwire.dataset import DEFAULT_ROW_GROUP_ROWS, DatasetWriter
from kwire.decode_command import decode_captures

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
KAFKA_PYTHON = CAPTURES / "tansu-kafka-python.pcap"
AIOKAFKA = CAPTURES / "tansu-aiokafka.pcap"


def run(*args: Any) -> Any:
    return CliRunner().invoke(app, ["decode", *map(str, args)])


def one_line_error(result: Any, code: int = 2) -> str:
    """The run failed with `code` and said why in exactly one line on stderr, without a traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (
        result.exception
    )
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kwire decode: ") and "Traceback" not in result.stderr + result.stdout
    return lines[0]


def read_table(out: Path, table: str = "exchanges") -> list[dict[str, Any]]:
    dataset = ds.dataset(out / table, format="parquet", partitioning="hive")
    return dataset.to_table().to_pylist()


def rows_of(path: Path, **kwargs: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    result = decode_captures([path], exchanges.append, connections.append, **kwargs)
    return exchanges, connections, result


def comparable(rows: list[dict[str, Any]], *drop: str) -> list[tuple]:
    """Rows as sortable tuples: Parquet gives timestamps back as datetimes and every column (None where
    the row had none), callbacks give microseconds and only the columns they set."""
    out = []
    for row in rows:
        items = []
        for key, value in sorted(row.items()):
            if key in drop or value is None:
                continue
            if hasattr(value, "timestamp"):
                value = round(value.timestamp() * 1_000_000)
            items.append((key, repr(value)))
        out.append(tuple(items))
    return sorted(out)


# ---------------------------------------------------------------------------------------------------------
# files that are not captures


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello, this is not a capture\n", "not a pcap or pcapng file (text, starts with b'hell')"),
        (bytes(range(256)), "not a pcap or pcapng file (starts with b'\\x00\\x01\\x02\\x03')"),
    ],
    ids=["empty", "text", "binary"],
)
def test_not_a_capture(content: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "input.pcap"
    path.write_bytes(content)
    line = one_line_error(run(path, "-o", tmp_path / "out"))
    assert line == f"kwire decode: {path}: {message}"
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["input.pcap"]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert (
        one_line_error(run(tmp_path / "nope.pcap")) == f"kwire decode: {tmp_path / 'nope.pcap'}: no such file"
    )
    line = one_line_error(run(tmp_path))
    assert line == f"kwire decode: {tmp_path}: is a directory, not a capture file"


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.pcap"
    shutil.copy(KAFKA_PYTHON, path)
    if os.geteuid() == 0:  # root reads anything: make open() refuse as the kernel would for others
        import decoder.pcap

        real_open = open

        def refuse(file: Any, *args: Any, **kwargs: Any) -> Any:
            if Path(file) == path:
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(decoder.pcap, "open", refuse, raising=False)
    else:
        path.chmod(0)
    line = one_line_error(run(path, "-o", tmp_path / "out"))
    assert line == f"kwire decode: {path}: cannot read: Permission denied"
    assert not (tmp_path / "out").exists()


def test_bad_second_file_stops_before_writing_anything(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("not a capture")
    line = one_line_error(run(KAFKA_PYTHON, bad, "-o", tmp_path / "out"))
    assert line == f"kwire decode: {bad}: not a pcap or pcapng file (text, starts with b'not ')"
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".*kwire-tmp*"))


def test_same_file_twice(tmp_path: Path) -> None:
    line = one_line_error(
        run(KAFKA_PYTHON, CAPTURES / ".." / "captures" / KAFKA_PYTHON.name, "-o", tmp_path / "o")
    )
    assert line.endswith(": given twice")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in (["--port", "70000"], ["--port", "0"], ["--frame-limit", "10"], ["--no-such-option"]):
        result = run(KAFKA_PYTHON, "-o", tmp_path / "o", *args)
        assert result.exit_code == 2 and "Traceback" not in result.stderr and not (tmp_path / "o").exists()
    assert run().exit_code == 2


# ---------------------------------------------------------------------------------------------------------
# damaged captures keep what came before the damage


@pytest.mark.parametrize("cut_in", ["record header", "packet data"])
def test_capture_cut_mid_packet_keeps_rows_before(cut_in: str, tmp_path: Path) -> None:
    data = KAFKA_PYTHON.read_bytes()
    boundaries = []  # offsets where records start
    at = 24
    while at < len(data):
        boundaries.append(at)
        at += 16 + struct.unpack_from("<I", data, at + 8)[0]
    start = boundaries[len(boundaries) * 2 // 3]  # two thirds in
    cut = start + (7 if cut_in == "record header" else 16 + 20)
    (tmp_path / "cut").mkdir()
    (tmp_path / "clean").mkdir()
    damaged = tmp_path / "cut" / KAFKA_PYTHON.name
    damaged.write_bytes(data[:cut])
    prefix = tmp_path / "clean" / KAFKA_PYTHON.name
    prefix.write_bytes(data[:start])

    result = run(damaged, "-o", tmp_path / "out")
    line = one_line_error(result)
    assert f"{damaged}: cut mid-record" in line and f"at byte {start}" in line and "kept the" in line
    assert "exchanges" in result.stdout  # the summary still comes
    expected, _, clean = rows_of(prefix)
    assert clean.error is None and len(expected) > 20
    got = read_table(tmp_path / "out")
    assert comparable(got) == comparable(expected)
    assert f"kept the {len(expected)} exchanges" in line


def test_corrupt_record_length(tmp_path: Path) -> None:
    """A record claiming 3 GB: reported, rows before it kept, nothing allocated by it."""
    data = bytearray(KAFKA_PYTHON.read_bytes())
    at, count = 24, 0
    while count < 60:
        at += 16 + struct.unpack_from("<I", data, at + 8)[0]
        count += 1
    struct.pack_into("<I", data, at + 8, 3 << 30)
    path = tmp_path / "corrupt.pcap"
    path.write_bytes(bytes(data))
    tracemalloc.start()
    result = run(path, "-o", tmp_path / "out")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    line = one_line_error(result)
    assert f"corrupt record length {3 << 30}" in line and f"at byte {at}" in line
    assert peak < 64 << 20
    assert len(read_table(tmp_path / "out")) > 5


def test_gzip_and_bzip2_captures_give_the_same_rows(tmp_path: Path) -> None:
    expected, expected_conns, _ = rows_of(KAFKA_PYTHON)
    for suffix, compress in ((".gz", gzip.compress), (".bz2", bz2.compress)):
        path = tmp_path / (KAFKA_PYTHON.name + suffix)
        path.write_bytes(compress(KAFKA_PYTHON.read_bytes()))
        out = tmp_path / f"out{suffix}"
        result = run(path, "-o", out)
        assert result.exit_code == 0, result.stderr
        assert comparable(read_table(out), "source") == comparable(expected, "source")
        assert comparable(read_table(out, "connections"), "source") == comparable(expected_conns, "source")
        assert {r["source"] for r in read_table(out)} == {path.name}


def test_gzip_cut_short_keeps_rows(tmp_path: Path) -> None:
    packed = gzip.compress(KAFKA_PYTHON.read_bytes())
    path = tmp_path / "cut.pcap.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    result = run(path, "-o", tmp_path / "out")
    one_line_error(result)
    assert len(read_table(tmp_path / "out")) > 10


# ---------------------------------------------------------------------------------------------------------
# traffic that is not (plain) Kafka


def _garbage_conversation(seed: int = 7) -> Conversation:
    import random

    rng = random.Random(seed)
    c = Conversation()
    for _ in range(20):
        c.send(0, rng.randbytes(rng.randint(1, 1400)))
        c.send(1, rng.randbytes(rng.randint(1, 200)))
    c.close()
    return c


def test_random_bytes_on_a_kafka_port(tmp_path: Path) -> None:
    path = write(tmp_path / "garbage.pcap", _HEADER, _garbage_conversation().kept())
    result = run(path, "-o", tmp_path / "auto")
    assert result.exit_code == 0 and result.stderr == ""
    assert "no Kafka traffic found" in result.stdout
    assert read_table(tmp_path / "auto") == []
    assert [c["protocol"] for c in read_table(tmp_path / "auto", "connections")] == ["other"]

    result = run(path, "-o", tmp_path / "forced", "--port", "9092")  # forced: decoded, all of it rejected
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    rows = read_table(tmp_path / "forced")
    (conn,) = read_table(tmp_path / "forced", "connections")
    assert conn["protocol"] == "kafka" and conn["broker_port"] == 9092
    assert all(r["status"] in ("malformed", "truncated", "unknown_api", "orphan_response") for r in rows)
    assert not any(r["status"] == "ok" for r in rows)


@pytest.fixture(scope="module")
def tls_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """A real TLS handshake start (ClientHello, then ServerHello ...), made with the ssl module in memory."""
    folder = tmp_path_factory.mktemp("tls")
    try:
        cert, key = self_signed_certificate(folder)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"openssl cannot make a test certificate: {exc}")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    hello = c_out.read()
    s_in.write(hello)
    with pytest.raises(ssl.SSLWantReadError):
        server.do_handshake()
    answer = s_out.read()
    assert hello[:1] == b"\x16" and answer[:1] == b"\x16"
    return hello, answer


@pytest.mark.parametrize("forced", [False, True], ids=["detected", "with --port"])
def test_tls_on_a_kafka_port(forced: bool, tls_bytes: tuple[bytes, bytes], tmp_path: Path) -> None:
    hello, answer = tls_bytes
    c = Conversation()
    c.send(0, hello)
    c.send(1, answer)
    c.send(0, b"\x17\x03\x03\x00\x20" + bytes(32))  # application data
    c.close()
    path = write(tmp_path / "tls.pcap", _HEADER, c.kept())
    result = run(path, "-o", tmp_path / "out", *(["--port", "9092"] if forced else []))
    assert result.exit_code == 0 and result.stderr == ""
    assert "no Kafka traffic found (1 TLS connections: kwire cannot read inside TLS)" in result.stdout
    assert read_table(tmp_path / "out") == []
    assert [c["protocol"] for c in read_table(tmp_path / "out", "connections")] == ["tls"]


def _huge_length(prefix: int, tmp_path: Path) -> Path:
    c = Conversation()
    c.send(0, heartbeat_v0(1))
    c.send(1, heartbeat_v0_response(1))
    c.send(0, struct.pack(">I", prefix) + bytes(20))  # a length prefix of about 2 GiB
    c.send(0, heartbeat_v0(2))
    c.send(1, heartbeat_v0_response(2))
    c.close()
    return write(tmp_path / "huge.pcap", _HEADER, c.kept())


def _check_huge_length(path: Path, tmp_path: Path, decode_error: str) -> None:
    tracemalloc.start()
    result = run(path, "-o", tmp_path / "out")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert peak < 64 << 20  # nothing allocated by the claimed length
    rows = sorted(read_table(tmp_path / "out"), key=lambda r: r["request_time"])
    assert [(r["correlation_id"], r["status"], r["decode_error"]) for r in rows] == [
        (1, "ok", None),
        (None, "malformed", decode_error),
        (2, "ok", None),
    ]
    (conn,) = read_table(tmp_path / "out", "connections")
    assert conn["resyncs"] == 1


def test_two_gib_length_prefix(tmp_path: Path) -> None:
    """A request whose length prefix reads 2 GiB (0x80000000, negative as an int32), between good ones:
    one malformed row, the next request found again."""
    _check_huge_length(_huge_length(0x80000000, tmp_path), tmp_path, "implausible frame length -2147483648")


def test_length_prefix_just_under_2_gib(tmp_path: Path) -> None:
    _check_huge_length(_huge_length(0x7FFFFFFF, tmp_path), tmp_path, "implausible frame length 2147483647")


def test_internal_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever breaks inside (here a simulated bug in the row builder), the user gets one line, exit 2,
    and no partial dataset or scraps."""
    import kwire.rows

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(kwire.rows.ExchangeRows, "row", broken)
    result = run(_huge_length(0x7FFFFFFF, tmp_path), "-o", tmp_path / "out")
    line = one_line_error(result)
    assert line.startswith("kwire decode: internal error: RuntimeError: simulated bug")
    assert "set KWIRE_DEBUG=1 for the traceback" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.pcap"]


def test_frame_limit(tmp_path: Path) -> None:
    """A 311-byte request is fine by default and over a --frame-limit of 100: rejected by its length,
    not decoded, and the capture is still read to its end (exit 0)."""
    metadata = request(3, 1, 1, struct.pack(">i", 1) + struct.pack(">h", 280) + b"t" * 280)  # Metadata v1
    c = Conversation()
    c.send(0, metadata)
    c.send(0, heartbeat_v0(2))
    c.send(1, heartbeat_v0_response(2))
    c.close()
    path = write(tmp_path / "big.pcap", _HEADER, c.kept())
    result = run(path, "-o", tmp_path / "default")
    assert result.exit_code == 0
    rows = sorted(read_table(tmp_path / "default"), key=lambda r: r["correlation_id"])
    assert rows[0]["api_name"] == "Metadata" and rows[0]["request_size"] == len(metadata) == 311
    assert rows[0]["topics"] == ["t" * 280] and rows[1]["status"] == "ok"
    result = run(path, "-o", tmp_path / "limited", "--frame-limit", "100")
    assert result.exit_code == 0 and result.stderr == ""
    rows = read_table(tmp_path / "limited")
    assert any(
        r["status"] == "malformed" and r["decode_error"] == "implausible frame length 307" for r in rows
    )
    assert not any(r.get("api_name") == "Metadata" for r in rows)


# ---------------------------------------------------------------------------------------------------------
# several files, output folder, layout


def test_multiple_files_merged(tmp_path: Path) -> None:
    result = run(KAFKA_PYTHON, AIOKAFKA, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "in 2 files" in result.stdout
    rows = read_table(tmp_path / "out")
    connections = read_table(tmp_path / "out", "connections")
    one, one_conns, _ = rows_of(KAFKA_PYTHON)
    two, two_conns, _ = rows_of(AIOKAFKA)
    assert len(rows) == len(one) + len(two) and len(connections) == len(one_conns) + len(two_conns)
    # each file keeps its own source, and its rows are exactly those of the file decoded alone
    for path, alone, alone_conns in ((KAFKA_PYTHON, one, one_conns), (AIOKAFKA, two, two_conns)):
        assert comparable([r for r in rows if r["source"] == path.name]) == comparable(alone)
        assert comparable([c for c in connections if c["source"] == path.name]) == comparable(alone_conns)


def test_files_with_one_name_and_the_same_connections_stay_apart(tmp_path: Path) -> None:
    """The same capture twice, from two folders: the same 4-tuples at the same times. Each copy is a
    run of its own (source = folder/name), no connection of one is taken for the other's, and the
    rows come out merged by time."""
    for run_dir in ("run-a", "run-b"):
        (tmp_path / run_dir).mkdir()
        shutil.copy(KAFKA_PYTHON, tmp_path / run_dir / "capture.pcap")
    paths = [tmp_path / "run-a" / "capture.pcap", tmp_path / "run-b" / "capture.pcap"]
    assert decode_command.source_names(paths) == ["run-a/capture.pcap", "run-b/capture.pcap"]
    assert decode_command.source_names([KAFKA_PYTHON, AIOKAFKA]) == [KAFKA_PYTHON.name, AIOKAFKA.name]
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    decode_captures(paths, exchanges.append, connections.append)
    alone, alone_conns, _ = rows_of(KAFKA_PYTHON)
    for source in ("run-a/capture.pcap", "run-b/capture.pcap"):
        assert comparable([r for r in exchanges if r["source"] == source], "source") == comparable(
            alone, "source"
        )
        assert comparable([c for c in connections if c["source"] == source], "source") == comparable(
            alone_conns, "source"
        )
    # a row comes out when its response is read: in response-time order across the two runs
    times = [r["response_time"] for r in exchanges if r["status"] == "ok"]
    assert times == sorted(times)
    assert [r["source"] for r in exchanges[:2]] == ["run-a/capture.pcap", "run-b/capture.pcap"]


def test_output_folder_default_overwrite_and_refusals(tmp_path: Path) -> None:
    capture = tmp_path / "traffic.pcap"
    shutil.copy(KAFKA_PYTHON, capture)
    result = run(capture)
    assert result.exit_code == 0 and f"dataset: {capture}.kwire" in result.stdout
    dataset = tmp_path / "traffic.pcap.kwire"
    first = sorted(dataset.rglob("*.parquet"))
    assert first

    line = one_line_error(run(capture))  # exists: refused, untouched
    assert line == f"kwire decode: {dataset} exists (use --overwrite to replace it)"
    assert sorted(dataset.rglob("*.parquet")) == first

    assert run(capture, "--overwrite").exit_code == 0  # replaced by a complete new dataset
    second = sorted(dataset.rglob("*.parquet"))
    assert len(second) == len(first) and set(second).isdisjoint(first)
    assert len(read_table(dataset)) == len(rows_of(KAFKA_PYTHON)[0])

    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    line = one_line_error(run(capture, "-o", precious, "--overwrite"))
    assert line == f"kwire decode: {precious} is not a kwire dataset (it holds thesis.tex); not replacing it"
    assert (precious / "thesis.tex").read_text() == "years of work"

    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert one_line_error(run(capture, "-o", a_file, "--overwrite")).endswith("exists and is not a directory")
    missing_parent = tmp_path / "no" / "such" / "dir"  # parent folders are created (issue 19)
    assert run(capture, "-o", missing_parent).exit_code == 0 and (missing_parent / "exchanges").is_dir()
    blocked = a_file / "sub" / "dir"  # a parent that cannot be created: one line
    assert "cannot create" in one_line_error(run(capture, "-o", blocked))
    assert not list(tmp_path.glob(".*kwire-tmp*"))


def test_unwritable_output_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up while writing: one line, exit 2, and neither a partial dataset nor scraps."""

    def full(self: Any, row: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kwire.dataset.TableWriter.append", full)
    line = one_line_error(run(KAFKA_PYTHON, "-o", tmp_path / "out"))
    assert line == f"kwire decode: writing {tmp_path / 'out'} failed: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_interrupted_keeps_rows_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kwire.pipeline import StreamDecoder

    real_feed = StreamDecoder.feed
    calls = {"n": 0}

    def feed(self: StreamDecoder, event: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 60:
            raise KeyboardInterrupt
        real_feed(self, event)

    monkeypatch.setattr(StreamDecoder, "feed", feed)
    result = run(KAFKA_PYTHON, "-o", tmp_path / "out")
    line = one_line_error(result, code=130)
    kept = read_table(tmp_path / "out")
    assert (
        line
        == f"kwire decode: interrupted; kept the {len(kept)} exchanges written so far in {tmp_path / 'out'}"
    )
    assert len(kept) > 5


def test_layout_partitions_and_row_groups(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(CAPTURES / "tansu-mixed.pcap", "-o", out).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["connections", "exchanges"]
    for table in ("exchanges", "connections"):
        folders = sorted(p.name for p in (out / table).iterdir())
        assert folders == ["date=2026-11-22"]
        files = list((out / table).rglob("*"))
        assert all(f.is_dir() or (f.suffix == ".parquet" and not f.name.startswith(".")) for f in files)
        for file in (out / table).rglob("*.parquet"):
            metadata = pq.ParquetFile(file).metadata
            assert all(
                metadata.row_group(i).num_rows <= DEFAULT_ROW_GROUP_ROWS
                for i in range(metadata.num_row_groups)
            )
            assert "date" not in pq.ParquetFile(file).schema_arrow.names  # only in the folder name
    rows = read_table(out)
    assert all(r["date"] == r["request_time"].strftime("%Y-%m-%d") for r in rows if r["request_time"])
    # with small row groups: several, each bounded, same rows
    writer = DatasetWriter(tmp_path / "small", row_group_rows=50)
    with writer:
        decode_captures([CAPTURES / "tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append)
    (file,) = (tmp_path / "small" / "exchanges").rglob("*.parquet")
    metadata = pq.ParquetFile(file).metadata
    assert metadata.num_row_groups >= 4
    assert all(metadata.row_group(i).num_rows <= 50 for i in range(metadata.num_row_groups))
    assert comparable(read_table(tmp_path / "small")) == comparable(rows)
    # converted 7 rows at a time as they come (as the proxy's recorder does), written in whole
    # row groups of 50: the same rows, and every row group but the last full
    writer = DatasetWriter(tmp_path / "batched", row_group_rows=50, batch_rows=7)
    with writer:
        decode_captures([CAPTURES / "tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append)
    (file,) = (tmp_path / "batched" / "exchanges").rglob("*.parquet")
    metadata = pq.ParquetFile(file).metadata
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [50] * (len(rows) // 50) + ([len(rows) % 50] if len(rows) % 50 else [])
    assert comparable(read_table(tmp_path / "batched")) == comparable(rows)
    # converted a few rows at a time (as the proxy's writer does): the same rows, in order
    writer = DatasetWriter(tmp_path / "sliced", convert_rows=7)
    with writer:
        decode_captures([CAPTURES / "tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append)
    assert len(rows) % 7 and len(rows) > 7  # a last, shorter slice is exercised
    assert comparable(read_table(tmp_path / "sliced")) == comparable(rows)
    assert read_table(tmp_path / "sliced", "connections") == read_table(out, "connections")
    # row groups written on a thread of their own (as kwire decode does), one at a time: the
    # same row groups, the same rows in the same order, as written in line
    for name, background in (("inline", False), ("background", True)):
        writer = DatasetWriter(tmp_path / name, row_group_rows=50, batch_rows=7, background=background)
        with writer:
            decode_captures(
                [CAPTURES / "tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append
            )
    (inline,), (background,) = (
        (tmp_path / n / "exchanges").rglob("*.parquet") for n in ("inline", "background")
    )
    assert (
        pq.ParquetFile(background).metadata.num_row_groups
        == pq.ParquetFile(inline).metadata.num_row_groups
        > 4
    )
    assert pq.read_table(background).equals(pq.read_table(inline))


def test_a_background_write_that_fails_fails_the_roll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a row group's write raised on the writer's thread is raised by the next write or the
    roll, in the caller's thread: a decode that cannot write says so, as it did writing in line."""

    def full(self: Any, table: Any, row_group_size: Any = None) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    writer = DatasetWriter(tmp_path / "out", row_group_rows=50, batch_rows=7, background=True)
    with pytest.raises(OSError, match="No space left"), writer:
        decode_captures([CAPTURES / "tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append)
    assert not list((tmp_path / "out").rglob("*.parquet"))  # no file was published


def test_quiet_and_no_progress_bar_off_a_terminal(tmp_path: Path) -> None:
    result = run(KAFKA_PYTHON, "-o", tmp_path / "a", "--quiet")
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == ""
    result = run(KAFKA_PYTHON, "-o", tmp_path / "b")
    assert result.exit_code == 0 and result.stderr == ""  # not a terminal: no progress bar
    assert "78 exchanges" not in result.stdout and "exchanges:" in result.stdout


def test_progress_bar_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    monkeypatch.setattr(decode_command, "_PROGRESS_EVERY", 10)
    result = run(KAFKA_PYTHON, "-o", tmp_path / "out")
    assert result.exit_code == 0
    assert "decoding" in result.stderr  # the bar, drawn on stderr


def test_the_installed_command(tmp_path: Path) -> None:
    """The console script itself: exit codes and streams as a shell sees them."""
    kwire = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "kwire"
    if not kwire.exists():
        pytest.skip("no .venv/bin/kwire (run scripts/bootstrap-venv)")
    ok = subprocess.run(
        [kwire, "decode", KAFKA_PYTHON, "-o", tmp_path / "out"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0 and ok.stderr == "" and "exchanges" in ok.stdout
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    bad = subprocess.run([kwire, "decode", empty], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr == f"kwire decode: {empty}: empty file\n"


# ---------------------------------------------------------------------------------------------------------
# --jobs: connections split among worker processes


def test_jobs_give_the_same_rows(tmp_path: Path) -> None:
    mixed = CAPTURES / "tansu-mixed.pcap"
    assert run(mixed, "-o", tmp_path / "one", "--jobs", "1").exit_code == 0
    result = run(mixed, "-o", tmp_path / "three", "--jobs", "3")
    assert result.exit_code == 0 and result.stderr == ""
    assert comparable(read_table(tmp_path / "three")) == comparable(read_table(tmp_path / "one"))
    assert comparable(read_table(tmp_path / "three", "connections")) == comparable(
        read_table(tmp_path / "one", "connections")
    )
    files = list((tmp_path / "three" / "exchanges").rglob("*.parquet"))
    assert len(files) == 3  # one file per worker
    # the workers share the work (kwire.shards' plan): 77, 77 and 79 exchanges; 17, 95 and 121 by the
    # assignment rule alone, which met the busy connections while bootstrap ones were still open
    assert min(pq.ParquetFile(f).metadata.num_rows for f in files) >= 60
    assert "233 exchanges" in result.stdout  # the summary adds up the parts


def test_jobs_default(tmp_path: Path) -> None:
    """Parallel for big captures of small frames; one process for small, compressed or bulk ones."""
    from kwire.decode_command import default_jobs

    assert default_jobs([KAFKA_PYTHON]) == 1  # small
    chatty = tmp_path / "chatty.pcap"  # the real small-frame capture, padded to 20 MB
    with open(chatty, "wb") as f:
        f.write(KAFKA_PYTHON.read_bytes())
        f.truncate(20 << 20)
    assert default_jobs([chatty]) == min(4, len(os.sched_getaffinity(0)))
    c = Conversation()  # bulk: 60 KB segments
    for i in range(4):
        c.send(0, heartbeat_v0(i) + bytes(60_000))
    bulk = write(tmp_path / "bulk.pcap", _HEADER, c.kept())
    with open(bulk, "ab") as f:
        f.truncate(20 << 20)
    assert default_jobs([bulk]) == 1
    packed = tmp_path / "big.pcap.gz"
    with open(packed, "wb") as f:
        f.write(b"\x1f\x8b")
        f.truncate(80 << 20)
    assert default_jobs([packed]) == 1


def test_jobs_interrupted_and_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kwire.pipeline import StreamDecoder

    real_feed = StreamDecoder.feed
    calls = {"n": 0}

    def feed(self: StreamDecoder, event: Any) -> None:
        calls["n"] += 1  # counted in each worker (forked)
        if calls["n"] == 60:
            raise KeyboardInterrupt
        real_feed(self, event)

    monkeypatch.setattr(StreamDecoder, "feed", feed)
    line = one_line_error(run(CAPTURES / "tansu-mixed.pcap", "-o", tmp_path / "out", "--jobs", "2"), code=130)
    assert line == (
        f"kwire decode: interrupted; kept the {len(read_table(tmp_path / 'out'))} exchanges "
        f"written so far in {tmp_path / 'out'}"
    )
    monkeypatch.setattr(StreamDecoder, "feed", real_feed)

    def interrupted_pass(*_args: Any) -> None:  # Ctrl-C while the parent weighs the connections
        raise KeyboardInterrupt

    monkeypatch.setattr(decode_command, "plan_shards", interrupted_pass)
    line = one_line_error(
        run(CAPTURES / "tansu-mixed.pcap", "-o", tmp_path / "early", "--jobs", "2"), code=130
    )
    assert line == f"kwire decode: interrupted; kept the 0 exchanges written so far in {tmp_path / 'early'}"
    monkeypatch.undo()

    def full(self: Any, row: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kwire.dataset.TableWriter.append", full)
    line = one_line_error(run(CAPTURES / "tansu-mixed.pcap", "-o", tmp_path / "full", "--jobs", "2"))
    assert line == f"kwire decode: writing {tmp_path / 'full'} failed: No space left on device"
    assert not (tmp_path / "full").exists() and not list(tmp_path.glob(".*kwire-tmp*"))


def test_jobs_internal_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kwire.rows

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(kwire.rows.ExchangeRows, "row", broken)  # forked workers inherit it
    result = run(_huge_length(0x7FFFFFFF, tmp_path), "-o", tmp_path / "out", "--jobs", "2")
    line = one_line_error(result)
    assert line.startswith("kwire decode: internal error: RuntimeError: simulated bug")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.pcap"]


def test_jobs_on_a_damaged_capture(tmp_path: Path) -> None:
    """Every worker meets the damage at the same byte: one message, the rows of all parts kept."""
    data = (CAPTURES / "tansu-mixed.pcap").read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    one = run(cut, "-o", tmp_path / "one", "--jobs", "1")
    two = run(cut, "-o", tmp_path / "two", "--jobs", "2")
    assert one_line_error(one) == one_line_error(two)
    assert comparable(read_table(tmp_path / "two")) == comparable(read_table(tmp_path / "one"))
    assert len(read_table(tmp_path / "one")) > 100


def test_output_next_to_a_read_only_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default dataset goes beside the capture; where that is not writable, say so and how."""
    capture = tmp_path / "ro.pcap"
    shutil.copy(KAFKA_PYTHON, capture)
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.parent == tmp_path:  # root ignores permissions: refuse as the kernel would for others
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    line = one_line_error(run(capture))
    assert line == (
        f"kwire decode: cannot create {capture}.kwire: Permission denied "
        "(use -o to write the dataset elsewhere)"
    )


def test_overwrite_through_a_symlink(tmp_path: Path) -> None:
    """-o names a link to a dataset elsewhere: the link is replaced by the new dataset, the old
    dataset it pointed to is left alone."""
    elsewhere = tmp_path / "elsewhere.kwire"
    assert run(KAFKA_PYTHON, "-o", elsewhere).exit_code == 0
    before = sorted(elsewhere.rglob("*.parquet"))
    link = tmp_path / "link.kwire"
    link.symlink_to(elsewhere)
    assert run(AIOKAFKA, "-o", link, "--overwrite").exit_code == 0
    assert not link.is_symlink() and link.is_dir()
    assert {r["source"] for r in read_table(link)} == {AIOKAFKA.name}
    assert sorted(elsewhere.rglob("*.parquet")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.kwire", "link.kwire"]
