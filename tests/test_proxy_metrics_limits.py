"""``kwire proxy`` metrics that cannot be abused (issue 18, item 6).

* Bounded labels: 200k distinct client ids give a page of a fixed size (at most
  ``--metrics-client-ids`` ids shown, the rest as ``other``, totals kept); the busiest ids win
  their slots back from a flood of one-shot ids; one id cannot mint more than
  ``SERIES_PER_CLIENT`` series nor a label longer than ``CLIENT_ID_CHARS``; the largest page
  the bounds allow is stated.
* Rendering holds no lock: a page is rendered from a snapshot while the forwarding lock is
  held by someone else.
* Through a real proxy in front of Tansu (both I/O paths): 200k distinct client ids sent as
  pipelined ApiVersions requests over raw sockets, then the page scraped; then request round
  trips measured with and without a scrape every 0.5 s (the figures are printed at the end of
  the run, not asserted: tests never assert on wall-clock time).
* The endpoint: the real ``kwire proxy`` command with a token from a file and from the
  environment (401 without it or with a wrong one, never in argv, the page, or the log),
  ``/healthz``, 404 for other paths, 405 for other methods, and a bound on open connections.

Proxies listen on 127.0.6.1 (this suite's loopback range); every wait is bounded.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import coverage_report
import pytest
from realkafka import TansuBroker

from decoder import protocol
from proxy import metrics as metrics_module
from proxy.embedded import ProxyProcess, ProxyThread
from proxy.metrics import CLIENT_ID_CHARS, OTHER, SERIES_PER_CLIENT, Metrics, render
from proxy.server import ProxyConfig

HOST = "127.0.6.1"
FLOOD_IDS = 200_000
#: Every (api key, version) the protocol table knows.
KNOWN = [(key, v) for key in protocol.API_NAMES for v in range(128) if protocol.is_known(key, v)]

_SERIES = re.compile(r'^kwire_proxy_requests_total\{.*client_id="((?:[^"\\]|\\.)*)"\} (\d+)$', re.M)


def requests_by_client(page: str) -> dict[str, int]:
    """The page's request counts summed by client id label."""
    totals: dict[str, int] = defaultdict(int)
    for client, n in _SERIES.findall(page):
        totals[client] += int(n)
    return dict(totals)


# ---- the bounds, on the counters themselves ----------------------------------------------------


def test_200k_client_ids_give_a_bounded_page() -> None:
    metrics = Metrics()
    for i in range(FLOOD_IDS):
        metrics.count_request(18, 3, f"flood-{i:06d}")
    started = time.perf_counter()
    page = metrics.render()
    elapsed = time.perf_counter() - started
    by_client = requests_by_client(page)
    assert len(by_client) == 51  # the default 50, and other
    assert sum(by_client.values()) == FLOOD_IDS  # nothing lost: the rest is under other
    assert by_client[OTHER] == FLOOD_IDS - 50
    assert len(page.encode()) < 16 << 10
    coverage_report.add("metrics page bytes at 200k client ids (counters)", len(page.encode()))
    coverage_report.add("metrics render us at 200k client ids (counters)", int(elapsed * 1e6))


def test_busy_clients_win_their_slots_back_from_a_flood() -> None:
    metrics = Metrics(max_client_ids=3)
    for i in range(3):  # one-shot ids come first and fill every slot
        metrics.count_request(3, 12, f"early-{i}")
    for i in range(1000):  # then a flood of them fills the candidates
        metrics.count_request(3, 12, f"flood-{i}")
    # two busy clients arrive among the flood: above 1/13 of these requests each (3 slots keep
    # 12 candidates), which Misra-Gries guarantees to keep
    for i in range(10_000):
        metrics.count_request(3, 12, f"flood-late-{i}")
        if i % 5 == 0:
            metrics.count_request(3, 12, "app-a")
        if i % 8 == 0:
            metrics.count_request(0, 9, "app-b")
    before = requests_by_client(metrics.render())
    assert set(before) == {"early-0", "early-1", "early-2", OTHER}  # no re-rank yet
    assert metrics.rerank() == 2  # the two busy ids take two idle slots; one early id stays
    assert {"app-a", "app-b"} < set(metrics.clients.shown) and len(metrics.clients.shown) == 4
    page = metrics.render()
    after = requests_by_client(page)
    assert len(after) == 2  # the early id left, other; the new ones have no series until they count
    assert sum(after.values()) == sum(before.values()) == 3 + 1000 + 10_000 + 2000 + 1250
    assert "kwire_proxy_client_id_evictions_total 2" in page
    # from now on they are counted under their own names
    metrics.count_request(3, 12, "app-a")
    assert requests_by_client(metrics.render())["app-a"] == 1
    # a later flood of one-shot ids does not push out the ids that keep working
    for i in range(5_000):
        metrics.count_request(3, 12, f"flood2-{i}")
        if i % 500 == 0:
            metrics.count_request(3, 12, "app-a")
            metrics.count_request(0, 9, "app-b")
    metrics.rerank()
    assert {"app-a", "app-b"} < set(requests_by_client(metrics.render()))


def test_one_id_cannot_mint_more_than_its_share_of_series() -> None:
    metrics = Metrics()
    for key, version in KNOWN:
        metrics.count_request(key, version, "greedy")
    long_id = "x" * 10_000
    metrics.count_request(3, 12, long_id)
    page = metrics.render()
    greedy = [line for line in page.splitlines() if 'client_id="greedy"' in line]
    assert len(greedy) == SERIES_PER_CLIENT
    by_client = requests_by_client(page)
    assert by_client["greedy"] + by_client[OTHER] == len(KNOWN)
    assert f'client_id="{"x" * CLIENT_ID_CHARS}"' in page and "x" * (CLIENT_ID_CHARS + 1) not in page


def test_the_largest_page_the_bounds_allow() -> None:
    """What clients alone can make (50 ids, each asking every (api, version) there is, every api
    with an unknown version, unknown apis, 128-character ids), then with a broker answering
    every error code for every api: the largest page there can be."""
    metrics = Metrics()
    for n in range(200):
        client = f"{n:03d}-" + "y" * 200
        for key, version in KNOWN:
            metrics.count_request(key, version, client)
    for key in protocol.API_NAMES:
        metrics.count_request(key, 999, "z")
        metrics.observe_response(key, 0.003, [])
    metrics.count_request(9999, 0, "z")
    clients_only = metrics.render()
    requests = [line for line in clients_only.splitlines() if line.startswith("kwire_proxy_requests_total{")]
    assert len(requests) <= 50 * SERIES_PER_CLIENT + len(KNOWN) + len(protocol.API_NAMES) + 1
    assert len(requests_by_client(clients_only)) == 51
    for key in protocol.API_NAMES:
        metrics.observe_response(key, 0.003, list(protocol.ERRORS))
    started = time.perf_counter()
    snap = metrics.snapshot()
    copied = time.perf_counter() - started
    page = render(snap)
    rendered = time.perf_counter() - started
    assert len(page.encode()) < 4 << 20
    coverage_report.add("metrics largest page bytes clients can make", len(clients_only.encode()))
    coverage_report.add("metrics largest page bytes (and every error of every api)", len(page.encode()))
    coverage_report.add("metrics largest page: snapshot us (under the lock)", int(copied * 1e6))
    coverage_report.add("metrics largest page: snapshot+render us", int(rendered * 1e6))


def test_rendering_takes_no_lock() -> None:
    metrics = Metrics()
    for i in range(1000):
        metrics.count_request(3, 12, f"id-{i}")
        metrics.observe_response(3, i / 1000, [6])
    snap = metrics.snapshot()
    pages: list[str] = []
    copies: list[object] = []
    with metrics.lock:  # as a forwarding thread would hold it
        renderer = threading.Thread(target=lambda: pages.append(render(snap)))
        renderer.start()
        renderer.join(30)
        assert not renderer.is_alive() and pages
        # the snapshot itself does need the lock (so this test could fail): it waits
        copier = threading.Thread(target=lambda: copies.append(metrics.snapshot()))
        copier.start()
        copier.join(0.2)
        assert not copies
    copier.join(30)
    assert copies
    assert 'kwire_proxy_response_errors_total{api="Metadata",code="6"' in pages[0]
    # a snapshot does not change under later counts
    metrics.count_request(3, 12, "late-arrival")
    assert render(snap) == pages[0] and 'client_id="late-arrival"' not in pages[0]


# ---- through a real proxy ------------------------------------------------------------------------


def api_versions_v0(corr: int, client_id: bytes) -> bytes:
    payload = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


def _drain(sock: socket.socket, frames: int, buf: bytearray) -> None:
    """Read ``frames`` whole responses off ``sock`` (``buf`` keeps what is left over)."""
    while frames:
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the proxy closed the connection")
            buf += chunk
        del buf[: 4 + struct.unpack_from(">i", buf)[0]]
        frames -= 1


def flood(port: int, first: int, count: int, batch: int = 500) -> None:
    """``count`` ApiVersions requests, each with its own client id, pipelined ``batch`` at a time."""
    with socket.create_connection((HOST, port), timeout=60) as sock:
        buf = bytearray()
        for start in range(first, first + count, batch):
            ids = range(start, min(start + batch, first + count))
            sock.sendall(b"".join(api_versions_v0(i, b"flood-%07d" % i) for i in ids))
            _drain(sock, len(ids), buf)


def scrape(
    port: int, path: str = "/metrics", token: str | None = None, method: str = "GET"
) -> tuple[int, bytes]:
    """(status, body) of an HTTP request to the metrics endpoint."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def round_trips(
    port: int, seconds: float, connections: int, scrape_port: int | None
) -> tuple[list[float], int]:
    """Request round-trip times over ``connections`` connections for ``seconds``, with a scrape
    every 0.5 s when ``scrape_port`` is given; and how many scrapes answered 200."""
    times: list[float] = []
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds
    scrapes = 0

    def client(index: int) -> None:
        try:
            with socket.create_connection((HOST, port), timeout=30) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = bytearray()
                corr = 0
                while time.monotonic() < stop:
                    started = time.perf_counter()
                    sock.sendall(api_versions_v0(corr, b"load-%d" % index))
                    _drain(sock, 1, buf)
                    times.append(time.perf_counter() - started)
                    corr += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    while scrape_port is not None and time.monotonic() < stop:
        status, _ = scrape(scrape_port)
        scrapes += status == 200
        time.sleep(0.5)
    for thread in threads:
        thread.join(seconds + 30)
    assert not errors, errors[:3]
    return times, scrapes


def _p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98] if len(times) >= 100 else max(times)


@pytest.mark.real
def test_200k_client_ids_through_the_proxy_and_scraping_under_load(tansu: TansuBroker) -> None:
    config = ProxyConfig(
        bootstrap=[("127.0.0.1", tansu.port)],
        listen=(HOST, 0),
        broker_port_base=0,
        metrics_port=0,
        metrics_host=HOST,
    )
    with ProxyThread(config) as running:
        port, metrics_port = running.proxy.listen_port, running.proxy.metrics_port
        assert metrics_port is not None
        workers = [
            threading.Thread(target=flood, args=(port, k * FLOOD_IDS // 4, FLOOD_IDS // 4)) for k in range(4)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(300)
        started = time.perf_counter()
        status, page = scrape(metrics_port)
        scrape_seconds = time.perf_counter() - started
        assert status == 200
        text = page.decode()
        by_client = requests_by_client(text)
        assert len(by_client) == 51 and sum(by_client.values()) == FLOOD_IDS
        assert len(page) < 16 << 10
        coverage_report.add("metrics page bytes at 200k client ids through the proxy", len(page))
        coverage_report.add(
            "metrics scrape us at 200k client ids through the proxy", int(scrape_seconds * 1e6)
        )
        # round trips with and without a scrape every 0.5 s, alternating
        quiet: list[float] = []
        scraped: list[float] = []
        answered = 0
        for _ in range(2):
            quiet += round_trips(port, 3.0, 8, None)[0]
            times, scrapes = round_trips(port, 3.0, 8, metrics_port)
            scraped += times
            answered += scrapes
        assert answered >= 6  # the scrapes were served while traffic flowed
        assert len(quiet) > 100 and len(scraped) > 100
        for name, times in (("quiet", quiet), ("scraped every 0.5 s", scraped)):
            coverage_report.add(f"metrics round-trip p99 us, {name}", int(_p99(times) * 1e6))


def _token_proxy(tansu: TansuBroker, extra: list[str], env: dict[str, str] | None = None) -> ProxyProcess:
    args = ["--bootstrap", tansu.bootstrap, "--listen", f"{HOST}:0", "--broker-port-base", "0"]
    args += ["--metrics-port", "0", "--metrics-host", HOST, *extra]
    saved = dict(os.environ)
    try:
        os.environ.update(env or {})
        return ProxyProcess(args).start()
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.real
@pytest.mark.parametrize("source", ["file", "env"])
def test_the_metrics_endpoint_asks_for_its_token(source: str, tansu: TansuBroker, tmp_path: Path) -> None:
    token = f"kw-token-{source}-3f9c1e"
    if source == "file":
        (tmp_path / "token").write_text(token + "\n")
        (tmp_path / "token").chmod(0o644)
        proxy = _token_proxy(tansu, ["--metrics-token-file", str(tmp_path / "token")])
        assert "can be read by other users" in proxy.log
    else:
        proxy = _token_proxy(tansu, [], {"KWIRE_METRICS_TOKEN": token})
    try:
        port = proxy.metrics_port
        assert port is not None and proxy.proc is not None
        with socket.create_connection((HOST, proxy.port or 0), timeout=10) as sock:
            sock.sendall(api_versions_v0(1, b"token-test"))
            _drain(sock, 1, bytearray())
        assert token.encode() not in Path(f"/proc/{proxy.proc.pid}/cmdline").read_bytes()
        status, body = scrape(port)
        assert status == 401 and b"kwire_proxy" not in body
        assert scrape(port, token="wrong")[0] == 401
        assert scrape(port, token=token[:-1])[0] == 401
        status, body = scrape(port, token=token)
        assert status == 200 and b'client_id="token-test"' in body and token.encode() not in body
        assert scrape(port, "/metrics?x=1", token=token)[0] == 200
        assert scrape(port, "/healthz") == (200, b"ok\n")  # no numbers: no token needed
        assert scrape(port, "/")[0] == 404
        assert scrape(port, "/metrics/../metrics", token=token)[0] == 404
        assert scrape(port, "/metrics", token=token, method="POST")[0] == 405
        status, body = scrape(port, token=token, method="HEAD")
        assert status == 200 and body == b""
    finally:
        proxy.terminate()
    assert token not in proxy.log


@pytest.mark.real
def test_an_open_endpoint_and_its_connection_bound(tansu: TansuBroker) -> None:
    proxy = _token_proxy(tansu, [])
    idle: list[socket.socket] = []
    try:
        port = proxy.metrics_port
        assert port is not None
        assert scrape(port)[0] == 200 and scrape(port, "/nope")[0] == 404
        for _ in range(metrics_module.MAX_METRICS_CONNECTIONS):  # open, and never send a request
            idle.append(socket.create_connection((HOST, port), timeout=10))
        time.sleep(0.3)  # let the proxy accept them all
        with socket.create_connection((HOST, port), timeout=10) as extra:
            extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            try:
                refused = extra.recv(100) == b""
            except ConnectionResetError:
                refused = True
        assert refused
        for sock in idle:
            sock.close()
        idle.clear()
        deadline = time.monotonic() + 10
        status = 0
        while status != 200 and time.monotonic() < deadline:
            try:
                status = scrape(port)[0]
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert status == 200  # served again once the idle connections are gone
    finally:
        for sock in idle:
            sock.close()
        proxy.terminate()
