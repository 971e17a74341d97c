"""Both sides of a ``kwire proxy`` in tcpdump captures: connections paired, bytes and rows compared.

The near side is client <-> proxy, the far side proxy <-> broker. On loopback every
connection leaves from 127.0.0.1, so a far-side connection is told from a client's own by
what it carries, never by its address:

* **Pairing** (``pair_streams``): the proxy opens one upstream connection per client
  connection, right after accepting it, to a broker the listener stands for. A near stream
  and a far stream pair when the far one goes to a broker of that listener
  (``routes``), opened no earlier than the near one and within ``window_ns`` after it, and
  the far request bytes are the near request bytes or a prefix of them (the proxy forwards
  every byte it reads until the session ends; a refused upstream carries none). Among
  candidates an exact byte match wins, then the closest opening time.
* **Bytes** (``compare_pair``): requests identical (or the far side a prefix, when a side
  was reset); responses frame by frame: identical, except frames of responses that can
  carry broker addresses (``proxy.rewrite.has_endpoints``), which are decoded on both sides
  and must be equal once every endpoint's host and port are blanked, with each far endpoint
  (node N at its broker address) shown to the client as the proxy's listener for N.
* **Rows** (``compare_rows``, ``compare_connections``): the proxy's recorded exchanges and
  connections against ``kwire decode`` of the near capture, keyed by (connection,
  correlation id, api key) and by connection. A connection is its client port, unless
  ``same_connections`` names it: the kernel may give a client port to a new connection to
  another listener (another 4-tuple), even while the first is open, so on a long run a port
  alone does not name a connection.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from decoder import message_codec as mc
from decoder import protocol
from proxy import rewrite
from proxy.framing import RequestHead, parse_request_head
from proxy.streams import CapturedStream, split_frames

__all__ = [
    "ROW_FIELDS_THAT_DIFFER",
    "BytesReport",
    "Pair",
    "RowsReport",
    "compare_connections",
    "compare_pair",
    "compare_rows",
    "nearest_in_time",
    "pair_streams",
    "request_heads",
    "same_connections",
    "unread_requests",
]

Address = tuple[str, int]


def request_heads(data: bytes | bytearray) -> list[RequestHead]:
    """The head of every complete request frame of a client -> server stream."""
    heads = []
    for frame in split_frames(data):
        try:
            head = parse_request_head(frame, 0, len(frame))
        except ValueError:
            break
        if head is None:
            break
        heads.append(head)
    return heads


@dataclass
class Pair:
    """One client connection as the client saw it (near) and as the broker saw it (far)."""

    near: CapturedStream
    far: CapturedStream

    @property
    def exact(self) -> bool:
        return self.near.data[0] == self.far.data[0]


def pair_streams(
    near: Iterable[CapturedStream],
    far: Iterable[CapturedStream],
    routes: Callable[[Address], set[Address]],
    window_ns: int = 15_000_000_000,
) -> tuple[list[Pair], list[CapturedStream], list[CapturedStream]]:
    """(pairs, near streams left unpaired, far streams left unpaired); see the module docstring.

    ``routes(listener address)`` gives the broker addresses a connection to that proxy
    listener may go to.
    """
    left = sorted(far, key=lambda s: s.opened_ns)
    pairs: list[Pair] = []
    lonely: list[CapturedStream] = []
    for stream in sorted(near, key=lambda s: s.opened_ns):
        allowed = routes(stream.server)
        best: tuple[bool, int, int] | None = None
        for i, candidate in enumerate(left):
            delay = candidate.opened_ns - stream.opened_ns
            if delay < 0:
                continue
            if delay > window_ns:
                break
            if candidate.server not in allowed:
                continue
            sent = candidate.data[0]
            if stream.data[0][: len(sent)] != sent:
                continue
            score = (sent != stream.data[0], delay, i)
            if best is None or score < best:
                best = score
        if best is None:
            lonely.append(stream)
        else:
            pairs.append(Pair(stream, left.pop(best[2])))
    return pairs, lonely, left


@dataclass
class BytesReport:
    """What comparing the two sides of connections found (summed over pairs)."""

    pairs: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    frames_identical: int = 0
    #: response frames that may carry addresses, decoded and compared with endpoints blanked
    frames_decoded: int = 0
    #: ... of which the bytes differed (the proxy rewrote them)
    frames_rewritten: int = 0
    endpoints_rewritten: int = 0
    rewritten_apis: Counter[str] = field(default_factory=Counter)
    #: pairs where one side holds only a prefix of the other's bytes (a side was reset)
    cut_short: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: BytesReport) -> None:
        for name in (
            "pairs",
            "request_bytes",
            "response_bytes",
            "frames_identical",
            "frames_decoded",
            "frames_rewritten",
            "endpoints_rewritten",
            "cut_short",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rewritten_apis.update(other.rewritten_apis)
        self.problems += other.problems


def _blank(tree: Any) -> list[tuple[int, str, int]]:
    """Every endpoint's (node, host, port) in a decoded body, then host and port blanked."""
    found = []
    for endpoint in rewrite._tree_endpoints(tree):
        node = endpoint.get("NodeId", endpoint.get("BrokerId"))
        found.append((node, endpoint["Host"], endpoint["Port"]))
        endpoint["Host"], endpoint["Port"] = "*", 0
    return found


def compare_pair(
    pair: Pair,
    proxy_address: Callable[[int], Address],
    broker_address: Callable[[int], Address],
) -> BytesReport:
    """Compare one pair's bytes (see the module docstring).

    ``proxy_address(node)`` is where the proxy tells clients broker ``node`` is;
    ``broker_address(node)`` where that broker really is.
    """
    near, far = pair.near, pair.far
    report = BytesReport(pairs=1)
    name = f"{near.client[0]}:{near.client[1]}->{near.server[1]} / {far.server[0]}:{far.server[1]}"
    reset = "rst" in (near.how, far.how)
    # requests: the far side is the near side, or a prefix of it when a side was reset
    if far.data[0] != near.data[0]:
        report.cut_short = 1
        if not reset:
            report.problems.append(
                f"{name}: {len(near.data[0]) - len(far.data[0])} request bytes not forwarded"
            )
    report.request_bytes += len(far.data[0])
    apis = {h.correlation_id: (h.api_key, h.api_version) for h in request_heads(near.data[0])}
    near_frames = list(split_frames(near.data[1]))
    far_frames = list(split_frames(far.data[1]))
    if len(near_frames) > len(far_frames):
        report.problems.append(
            f"{name}: the client got {len(near_frames)} responses, the broker sent {len(far_frames)}"
        )
        return report
    for near_frame, far_frame in zip(near_frames, far_frames, strict=False):
        report.response_bytes += len(near_frame)
        corr = struct.unpack_from(">i", far_frame, 4)[0]
        key_version = apis.get(corr)
        if struct.unpack_from(">i", near_frame, 4)[0] != corr:
            report.problems.append(f"{name}: response to {corr} arrived as another correlation id")
            return report
        if key_version is None or not rewrite.has_endpoints(*key_version):
            if near_frame == far_frame:
                report.frames_identical += 1
            else:
                report.problems.append(f"{name}: response {corr} {key_version} changed on the way")
            continue
        report.frames_decoded += 1
        try:
            near_header, near_body = mc.decode_frame("response", near_frame, *key_version)
            far_header, far_body = mc.decode_frame("response", far_frame, *key_version)
        except Exception as exc:  # a frame that does not decode is a finding, not a crash
            report.problems.append(f"{name}: response {corr} {key_version} does not decode: {exc}")
            continue
        told, real = _blank(near_body), _blank(far_body)
        if (near_header, near_body) != (far_header, far_body) or len(told) != len(real):
            report.problems.append(f"{name}: response {corr} {key_version} differs beyond broker addresses")
            continue
        for (node, host, port), (real_node, real_host, real_port) in zip(told, real, strict=True):
            if real_node is None or real_node < 0 or not real_host or real_port <= 0:
                if (host, port) != (real_host, real_port):  # no broker named: nothing to rewrite
                    report.problems.append(f"{name}: {real_host}:{real_port} of no node became {host}:{port}")
            elif node != real_node or (real_host, real_port) != broker_address(node):
                report.problems.append(
                    f"{name}: the broker named node {real_node} at {real_host}:{real_port}"
                )
            elif (host, port) != proxy_address(node):
                report.problems.append(f"{name}: node {node} shown to the client as {host}:{port}")
        if near_frame != far_frame:
            report.frames_rewritten += 1
            report.endpoints_rewritten += sum(1 for t, r in zip(told, real, strict=True) if t != r)
            report.rewritten_apis[f"{protocol.api_name(key_version[0])} v{key_version[1]}"] += 1
    # what the client got beyond the last whole frame is the start of the broker's next frame
    done = sum(len(f) for f in near_frames)
    tail = bytes(near.data[1][done:])
    if tail:
        following = far_frames[len(near_frames)] if len(far_frames) > len(near_frames) else b""
        if not following.startswith(tail):
            report.problems.append(f"{name}: {len(tail)} trailing response bytes differ")
    if len(far_frames) > len(near_frames):
        report.cut_short = 1
        # a reset on either side, or a client connection still open when the client-side capture
        # stopped (the last responses were on their way), explains responses the client lacks
        if not (reset or near.how == "open_at_end"):
            report.problems.append(
                f"{name}: {len(far_frames) - len(near_frames)} responses never reached the client"
            )
    return report


#: Exchange columns compared loosely or not at all, and why.
ROW_FIELDS_THAT_DIFFER = {
    "source": "proxy:<listen address> vs the capture file's name",
    "connection_id": "each side numbers its own connections",
    "client_ip": "the same (127.0.0.1) but not compared: pairing is by port",
    "broker_ip": "the proxy records the broker it forwarded to, the capture shows the proxy listener",
    "broker_port": "as broker_ip",
    "request_time": "proxy clock at read vs tcpdump's packet time: within the tolerance",
    "response_time": "proxy clock at write vs tcpdump's packet time: within the tolerance",
    "latency_us": "follows from the two times",
    "date": "from request_time (equal unless a run straddles midnight UTC)",
    "injected": "proxy only: false in the proxy's rows unless a fault rule answered (null in a capture's)",
}


@dataclass
class RowsReport:
    recorded: int = 0
    decoded: int = 0
    compared: int = 0
    max_time_delta_us: int = 0
    #: client-side rows the proxy never read (sent after it had ended the connection), by connection
    unread: dict[Any, list[dict[str, Any]]] = field(default_factory=dict)
    #: client-side rows of a connection whose recorder said it skipped bytes, that it has not
    #: (their bytes were skipped), by connection
    skipped: dict[Any, list[dict[str, Any]]] = field(default_factory=dict)
    #: compared rows recorded with status ``gap`` (the recorder saw part of the exchange, and says so)
    gap_rows: int = 0
    #: rows recorded with status ``gap`` that pair with none (the part it saw named no exchange)
    unpaired_gap_rows: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def micros(value: Any) -> int | None:
    """A timestamp (a ``datetime`` or an integer of µs) as µs since the epoch; None stays None."""
    if value is None:
        return None
    return int(value.timestamp() * 1_000_000) if hasattr(value, "timestamp") else int(value)


def nearest_in_time(
    left: Iterable[Any],
    right: Iterable[Any],
    left_key: Callable[[Any], tuple[Any, int]],
    right_key: Callable[[Any], tuple[Any, int]] | None = None,
) -> list[tuple[Any, Any]]:
    """Pairs of a ``left`` and a ``right`` item of the same group: the keys give an item's
    (group, time in µs) (``right_key`` defaults to ``left_key``), and each left item in time
    order takes the right one of its group nearest in time. Items left over pair with nothing."""
    right_key = right_key or left_key
    groups: dict[Any, list[tuple[int, Any]]] = {}
    for item in right:
        group, at = right_key(item)
        groups.setdefault(group, []).append((at, item))
    pairs = []
    for group, at, item in sorted(((*left_key(item), item) for item in left), key=lambda t: t[1]):
        candidates = groups.get(group)
        if candidates:
            best = min(candidates, key=lambda candidate: abs(candidate[0] - at))
            candidates.remove(best)
            pairs.append((item, best[1]))
    return pairs


def same_connections(recorded: list[dict[str, Any]], decoded: list[dict[str, Any]]) -> dict[str, str]:
    """The ``kwire decode`` connection id of each recorded connection id: the same client
    port, the first packets nearest in time. For ``compare_rows`` and ``compare_connections``
    (``recorded_as``)."""

    pairs = nearest_in_time(
        recorded, decoded, lambda c: (c["client_port"], micros(c["first_packet_time"]) or 0)
    )
    return {mine["connection_id"]: other["connection_id"] for mine, other in pairs}


def _connection_of(recorded_as: Mapping[str, str] | None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(recorded row -> connection, decoded row -> connection): client ports, or the decoded
    connection ids when ``recorded_as`` maps recorded connection ids to them (a recorded
    connection it lacks gets a name of its own)."""
    if recorded_as is None:
        return (lambda row: row["client_port"]), (lambda row: row["client_port"])
    return (
        lambda row: recorded_as.get(row["connection_id"], f"recorded {row['connection_id']}"),
        lambda row: row["connection_id"],
    )


def unread_requests(sent: bytes | bytearray, read: int) -> set[tuple[int, int]]:
    """(correlation id, api key) of the request frames of a client's stream ``sent`` that
    start at or after byte ``read``: what a proxy that read ``read`` bytes never saw."""
    found = set()
    pos = 0
    for frame in split_frames(sent):
        if pos >= read and len(frame) >= 12:
            key, _version, corr = struct.unpack_from(">hhi", frame, 4)
            found.add((corr, key))
        pos += len(frame)
    if pos >= read and len(sent) - pos >= 12:  # a request cut short by the end of the connection
        key, _version, corr = struct.unpack_from(">hhi", sent, pos + 4)
        found.add((corr, key))
    return found


def compare_rows(
    recorded: list[dict[str, Any]],
    decoded: list[dict[str, Any]],
    broker_of: Callable[[int], set[Address]],
    tolerance_us: int = 1_000_000,
    unread: Mapping[Any, set[tuple[int, int]]] | None = None,
    skip_ports: Iterable[int] = (),
    recorded_as: Mapping[str, str] | None = None,
    gapped: Iterable[Any] = (),
) -> RowsReport:
    """Compare the proxy's exchange rows with ``kwire decode``'s rows of the near capture.

    Rows pair by (connection, correlation_id, api_key), a connection being its client port or,
    given ``recorded_as`` (``same_connections``), the decoded connection id; every column not in
    ``ROW_FIELDS_THAT_DIFFER`` must be equal, request and response times within
    ``tolerance_us``, and the recorded broker must be one the listener forwards to
    (``broker_of(listener port)``). A client-side row the proxy lacks is accepted only when
    it is an unanswered request the proxy never read: ``unread`` maps a connection to the
    (correlation id, api key) of the requests beyond the bytes the proxy read from that
    client (``unread_requests`` of the near stream and the recorded ``bytes_to_broker``); the
    proxy stops reading a connection once it has ended it (the broker reset it, or could not
    be reached) while the client may still be sending. ``skip_ports``: client ports left
    out (capture damage on that connection).

    ``gapped``: connections whose recorded connection row counts bytes the recorder skipped
    (``gap_bytes_to_*``: it fell behind, and says so). On those alone, a client-side row the
    proxy lacks is taken as skipped (``RowsReport.skipped``); a recorded row may have status
    ``gap``, and then each of its columns is null or equal to the client side's (it claims
    only what it saw); and the client software (``ExchangeRows`` carries it from an ApiVersions
    request, which may have been skipped) may be null. Anything else must be as anywhere.
    """
    report = RowsReport(recorded=len(recorded), decoded=len(decoded))
    skip = set(skip_ports)
    skipping = set(gapped)
    connections = dict(zip(("recorded", "decoded"), _connection_of(recorded_as), strict=True))

    def keyed(rows: list[dict[str, Any]], side: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        connection = connections[side]
        for row in rows:
            if row["client_port"] in skip:
                continue
            key = (connection(row), row["correlation_id"], row["api_key"])
            if key in out:
                report.problems.append(f"{side}: two rows for {key}")
            out[key] = row
        return out

    ours, theirs = keyed(recorded, "recorded"), keyed(decoded, "decoded")
    for key in sorted(theirs.keys() - ours.keys(), key=repr):
        row = theirs[key]
        never_read = (unread or {}).get(key[0], set())
        if (row["correlation_id"], row["api_key"]) in never_read and row["status"] == "unanswered":
            report.unread.setdefault(key[0], []).append(row)
        elif key[0] in skipping:
            report.skipped.setdefault(key[0], []).append(row)
        else:
            report.problems.append(f"only in the client capture: {key} {row['api_name']} {row['status']}")
    for key in sorted(ours.keys() - theirs.keys(), key=repr):
        if key[0] in skipping and ours[key]["status"] == "gap":
            report.unpaired_gap_rows += 1
            continue
        report.problems.append(
            f"only recorded by the proxy: {key} {ours[key]['api_name']} {ours[key]['status']}"
        )
    for key in sorted(ours.keys() & theirs.keys(), key=repr):
        mine, other = ours[key], theirs[key]
        report.compared += 1
        report.statuses[mine["status"]] += 1
        columns = (mine.keys() | other.keys()) - ROW_FIELDS_THAT_DIFFER.keys()
        differ = sorted(c for c in columns if mine.get(c) != other.get(c))
        gap_row = key[0] in skipping and mine["status"] == "gap"
        if key[0] in skipping:
            differ = _unexplained_by_a_gap(mine, differ, report)
        if differ:
            report.problems.append(
                f"{key}: " + ", ".join(f"{c}={mine.get(c)!r} vs {other.get(c)!r}" for c in differ[:4])
            )
        for column in ("request_time", "response_time"):
            a, b = micros(mine.get(column)), micros(other.get(column))
            if (a is None) != (b is None) and not (gap_row and a is None):
                report.problems.append(f"{key}: {column} {a} vs {b}")
            elif a is not None and b is not None:
                delta = abs(a - b)
                report.max_time_delta_us = max(report.max_time_delta_us, delta)
                if delta > tolerance_us:
                    report.problems.append(f"{key}: {column} {delta} µs apart")
        if (mine["broker_ip"], mine["broker_port"]) not in broker_of(other["broker_port"]):
            report.problems.append(
                f"{key}: recorded broker {mine['broker_ip']}:{mine['broker_port']} "
                f"behind listener {other['broker_port']}"
            )
    return report


#: Exchange columns a recorder that skipped an ApiVersions request leaves null (``compare_rows``).
CARRIED_FROM_EARLIER_FRAMES = frozenset({"client_software_name", "client_software_version"})


def _unexplained_by_a_gap(mine: dict[str, Any], differ: list[str], report: RowsReport) -> list[str]:
    """The columns of ``differ`` that a recorded row of a connection with skipped bytes cannot
    explain: a ``gap`` row may leave out (null) what it did not see, and says why; any row may
    lack the client software."""
    if mine["status"] == "gap":
        report.gap_rows += 1
        return [c for c in differ if c not in ("status", "decode_error") and mine.get(c) is not None]
    return [c for c in differ if not (c in CARRIED_FROM_EARLIER_FRAMES and mine.get(c) is None)]


#: Connection columns that must be equal on both sides (the rest: addresses, ids, times, end).
CONNECTION_FIELDS = (
    "client_id",
    "protocol",
    "bytes_to_broker",
    "bytes_to_client",
    "frames_to_broker",
    "frames_to_client",
    "gap_bytes_to_broker",
    "gap_bytes_to_client",
    "resyncs",
)


def skipped_bytes(connection: dict[str, Any]) -> int:
    """Bytes of a connection row that were not seen (a recorder that fell behind, a capture gap)."""
    return (connection["gap_bytes_to_broker"] or 0) + (connection["gap_bytes_to_client"] or 0)


def _explained_by_skipping(column: str, mine: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether a connection column that differs is what skipped bytes make of it."""
    if column.startswith(("gap_bytes", "resyncs")):
        return (mine[column] or 0) >= (other[column] or 0)
    if column.startswith("frames"):
        return (mine[column] or 0) <= (other[column] or 0)
    return column == "client_id" and mine[column] is None


def compare_connections(
    recorded: list[dict[str, Any]],
    decoded: list[dict[str, Any]],
    unread: Mapping[Any, list[dict[str, Any]]] | None = None,
    tolerance_us: int = 1_000_000,
    recorded_as: Mapping[str, str] | None = None,
) -> tuple[int, Counter[tuple[str, str]], list[str]]:
    """The proxy's connection rows against ``kwire decode``'s, by connection (client port, or
    the decoded connection id given ``recorded_as`` as in ``compare_rows``): the columns of
    ``CONNECTION_FIELDS`` equal, the first packet within ``tolerance_us``. ``unread``
    (``RowsReport.unread``): requests the client sent after the proxy ended the connection,
    which the capture counts and the proxy cannot (their frames and bytes, and the client id
    when they were all the connection carried). A connection whose recorder skipped bytes
    (``gap_bytes_to_*``) still counts every byte; it may count more gap bytes and resyncs, fewer
    frames, and no client id.

    Returns (connections compared, Counter of (recorded end_reason, decoded end_reason), problems).
    """
    problems: list[str] = []
    ends: Counter[tuple[str, str]] = Counter()
    my_connection, their_connection = _connection_of(recorded_as)
    theirs = {their_connection(c): c for c in decoded}
    compared = 0
    for mine in recorded:
        other = theirs.get(my_connection(mine))
        if other is None:
            problems.append(f"connection from port {mine['client_port']} not in the capture")
            continue
        compared += 1
        ends[(mine["end_reason"], other["end_reason"])] += 1
        late = (unread or {}).get(my_connection(mine), [])
        expected = dict(mine)
        if late:
            if mine["protocol"] == "other" and not mine["bytes_to_broker"] and not mine["bytes_to_client"]:
                # the proxy ended it before reading a byte ("other", no Kafka counts): the capture
                # sees a Kafka connection of the late requests alone
                expected.update(protocol="kafka", frames_to_broker=0, frames_to_client=0, resyncs=0)
            expected["bytes_to_broker"] += sum(r["request_size"] for r in late)
            expected["frames_to_broker"] += len(late)
            if mine["client_id"] is None:
                expected["client_id"] = late[0]["client_id"]
        differ = [c for c in CONNECTION_FIELDS if expected.get(c) != other.get(c)]
        if skipped_bytes(mine) > skipped_bytes(other):
            differ = [c for c in differ if not _explained_by_skipping(c, expected, other)]
        if differ:
            problems.append(
                f"connection {mine['client_port']}: "
                + ", ".join(f"{c}={mine.get(c)!r} vs {other.get(c)!r}" for c in differ)
            )
        delta = abs(micros(mine["first_packet_time"]) - micros(other["first_packet_time"]))
        if delta > tolerance_us:
            problems.append(f"connection {mine['client_port']}: first packet {delta} µs apart")
    if len(decoded) != compared:
        problems.append(f"{len(decoded)} connections in the capture, {compared} recorded")
    return compared, ends, problems
