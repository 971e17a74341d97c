"""What scraping ``kwire proxy``'s metrics costs the traffic, with a flood of client ids (issue 18 item 6).

Starts a Tansu broker and ``kwire proxy --metrics-port`` (run from ``--root``, a source tree:
the working tree by default, or an older tree for a before/after comparison), sends ``--ids``
ApiVersions requests each with its own client id (pipelined over 4 connections), then:

1. scrapes ``/metrics`` a few times: page size and time per scrape;
2. measures request round trips (ApiVersions, ``--connections`` connections, one request in
   flight each) for ``--seconds``, alternately without scraping and with a scrape every 0.5 s,
   ``--rounds`` times: how many, p50, p99, p99.9, max and how many took over 100 ms. (A scrape
   that stalls every connection for a second delays one request per connection per scrape:
   the max, the count over 100 ms and the number of round trips show it before p99 does.)

Usage: ``python bench/metrics_scrape.py [--root DIR] [--io auto] [--ids 200000]``.
For the tree before this change: ``git archive HEAD proxy decoder kwire spark_jobs | tar -x -C
/some/dir`` and ``--root /some/dir``. Proxies listen on 127.0.6.1.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realkafka import TansuBroker  # noqa: E402

from proxy.embedded import KWIRE_MAIN, ProxyProcess  # noqa: E402

HOST = "127.0.6.1"


def api_versions_v0(corr: int, client_id: bytes) -> bytes:
    payload = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


def drain(sock: socket.socket, frames: int, buf: bytearray) -> None:
    while frames:
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        del buf[: 4 + struct.unpack_from(">i", buf)[0]]
        frames -= 1


def flood(port: int, first: int, count: int, batch: int = 500) -> None:
    with socket.create_connection((HOST, port), timeout=120) as sock:
        buf = bytearray()
        for start in range(first, first + count, batch):
            ids = range(start, min(start + batch, first + count))
            sock.sendall(b"".join(api_versions_v0(i, b"flood-client-%07d" % i) for i in ids))
            drain(sock, len(ids), buf)


def scrape(port: int) -> tuple[int, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=120) as answer:
        size = len(answer.read())
    return size, time.perf_counter() - started


def load(port: int, seconds: float, connections: int, scrape_port: int | None) -> list[float]:
    times: list[float] = []
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        with socket.create_connection((HOST, port), timeout=120) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = bytearray()
            corr = 0
            while time.monotonic() < stop:
                started = time.perf_counter()
                sock.sendall(api_versions_v0(corr, b"load-%d" % index))
                drain(sock, 1, buf)
                times.append(time.perf_counter() - started)
                corr += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    while scrape_port is not None and time.monotonic() < stop:
        scrape(scrape_port)
        time.sleep(0.5)
    for thread in threads:
        thread.join(seconds + 120)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree the proxy runs from")
    parser.add_argument("--io", default="auto", help="passed to kwire proxy --io")
    parser.add_argument("--ids", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    with TansuBroker() as broker:
        command = ["--bootstrap", broker.bootstrap, "--listen", f"{HOST}:0", "--broker-port-base", "0"]
        command += ["--metrics-port", "0", "--metrics-host", HOST, "--io", args.io]
        code = f"import sys; sys.path.insert(0, {str(args.root.resolve())!r}); {KWIRE_MAIN}"
        proxy = ProxyProcess(command, launcher=[sys.executable, "-c", code]).start()
        try:
            assert proxy.port and proxy.metrics_port
            started = time.monotonic()
            workers = [
                threading.Thread(target=flood, args=(proxy.port, k * args.ids // 4, args.ids // 4))
                for k in range(4)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            print(
                f"{args.root} io={args.io}: {args.ids} client ids sent in {time.monotonic() - started:.1f} s"
            )
            scrapes = [scrape(proxy.metrics_port) for _ in range(3)]
            print(
                f"page {scrapes[-1][0] / 1e6:.3f} MB, scrape "
                + ", ".join(f"{seconds * 1000:.1f}" for _, seconds in scrapes)
                + " ms"
            )
            quiet: list[float] = []
            scraped: list[float] = []
            for _ in range(args.rounds):
                quiet += load(proxy.port, args.seconds, args.connections, None)
                scraped += load(proxy.port, args.seconds, args.connections, proxy.metrics_port)
            for name, times in (("no scrapes", quiet), ("a scrape every 0.5 s", scraped)):
                cuts = statistics.quantiles(times, n=1000)
                slow = sum(t > 0.1 for t in times)
                print(
                    f"round trips, {name}: n={len(times)} p50 {cuts[499] * 1000:.2f} ms "
                    f"p99 {cuts[989] * 1000:.2f} ms p99.9 {cuts[998] * 1000:.1f} ms "
                    f"max {max(times) * 1000:.1f} ms, {slow} over 100 ms"
                )
        finally:
            proxy.terminate()


if __name__ == "__main__":
    main()
