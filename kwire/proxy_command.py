"""``kwire proxy``: a recording Kafka sidecar proxy that can also rehearse failures."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["METRICS_TOKEN_ENV", "proxy"]

#: Environment variable holding the metrics bearer token (when no --metrics-token-file is given).
METRICS_TOKEN_ENV = "KWIRE_METRICS_TOKEN"


def _fail(message: str) -> None:
    print(f"kwire proxy: {message}", file=sys.stderr)
    raise typer.Exit(2)


def _bare_port(text: str) -> str:
    """A bare number is a port (on 127.0.0.1), never a host name: ``--listen 41300``."""
    return f"127.0.0.1:{text.strip()}" if text.strip().isdigit() else text


def _metrics_token(path: Path | None) -> str | None:
    """The metrics token: from ``path`` if given, else from the environment; None for none."""
    if path is None:
        token = os.environ.get(METRICS_TOKEN_ENV, "").strip()
        return token or None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"--metrics-token-file {path}: {exc}")
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        _fail(f"--metrics-token-file {path}: the token must be one word of printable characters")
    if path.stat().st_mode & 0o077:
        logging.getLogger("kwire.proxy").warning(
            "--metrics-token-file %s can be read by other users (chmod 600 it)", path
        )
    return token


def proxy(
    bootstrap: Annotated[
        list[str], typer.Option("--bootstrap", "-b", help="broker HOST:PORT to forward to (repeatable)")
    ],
    listen: Annotated[str, typer.Option(help="address clients connect to")] = "127.0.0.1:9092",
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="dataset directory to record into (no recording without it)"),
    ] = None,
    advertise: Annotated[
        str | None, typer.Option(help="host clients are told to connect to (default: the listen host)")
    ] = None,
    broker_port_base: Annotated[
        int | None,
        typer.Option(
            help="broker N gets a listener on BASE + N (default: listen port + 1); 0: any free port"
        ),
    ] = None,
    flush_seconds: Annotated[float, typer.Option(help="close and publish Parquet files this often")] = 10.0,
    flush_rows: Annotated[int, typer.Option(help="... or once this many rows are waiting")] = 100_000,
    max_queue_mb: Annotated[
        int, typer.Option(help="recorder queue bound; chunks beyond it are not decoded (counted)")
    ] = 64,
    max_memory_mb: Annotated[
        int,
        typer.Option(
            help="memory the proxy may hold over all connections (held frames, recorder queue, "
            "rule-held requests); at the budget frames are forwarded without being held or "
            "decoded (counted, and a gap in the rows); 0: no limit"
        ),
    ] = 256,
    max_pending_rows: Annotated[
        int | None,
        typer.Option(
            help="rows waiting for the writer at most; more are dropped (counted) (default: 10 x flush-rows)"
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="terminate TLS for clients with this certificate (PEM)")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="private key of --tls-cert (PEM)")] = None,
    upstream_tls: Annotated[bool, typer.Option(help="speak TLS to the brokers")] = False,
    upstream_ca: Annotated[
        Path | None, typer.Option(help="CA bundle to verify brokers with (default: system CAs)")
    ] = None,
    upstream_insecure: Annotated[bool, typer.Option(help="do not verify the brokers' certificates")] = False,
    inject: Annotated[
        list[str] | None,
        typer.Option(
            "--inject",
            help="fault rule, e.g. api=Produce,topic=t,partition=0,error=KAFKA_STORAGE_ERROR,rate=1,after=5s,for=30s (repeatable)",
        ),
    ] = None,
    rules: Annotated[
        Path | None, typer.Option(help="JSON file with a list of fault rules (strings or objects)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="random seed for rule rates")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    metrics_host: Annotated[str, typer.Option(help="address the metrics endpoint binds")] = "127.0.0.1",
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            help="file holding a token /metrics then asks for (Authorization: Bearer TOKEN); "
            f"or set {METRICS_TOKEN_ENV} (never pass a token on the command line: ps shows it)"
        ),
    ] = None,
    metrics_client_ids: Annotated[
        int, typer.Option(help="client ids shown in the metrics (the busiest); the rest count as 'other'")
    ] = 50,
    header_timeout_s: Annotated[
        float,
        typer.Option(
            help="close a connection whose request header (or first request) is not complete this many "
            "seconds after it began (an idle connection, or one waiting for a response, is never closed); 0: off"
        ),
    ] = 30.0,
    io: Annotated[
        str,
        typer.Option(
            help="how connections are forwarded: asyncio (the event loop; holds up under many "
            "connections), threads (two per connection, plain TCP without rules: a little less CPU "
            "with a few busy connections), auto (asyncio)"
        ),
    ] = "auto",
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Forward Kafka clients to brokers, record every exchange, optionally inject faults."""
    from proxy.inject import RuleError, load_rules, parse_rule
    from proxy.server import Proxy, ProxyConfig, parse_address

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s kwire proxy %(levelname)s %(message)s",
    )
    try:
        targets = [parse_address(_bare_port(b), 9092) for b in bootstrap]
        listen_address = parse_address(_bare_port(listen), 9092)
    except ValueError as exc:
        _fail(str(exc))
    if out is not None and str(out) == "-":
        _fail(
            "-o -: the proxy records a dataset directory; to watch exchanges live, use kwire decode -i IFACE"
        )
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        _fail(f"--metrics-port {metrics_port}: the port must be a number from 0 to 65535")
    if bool(tls_cert) != bool(tls_key):
        _fail("--tls-cert and --tls-key go together")
    if metrics_client_ids < 0:
        _fail(f"--metrics-client-ids {metrics_client_ids}: must be 0 or more")
    if max_memory_mb < 0:
        _fail(f"--max-memory-mb {max_memory_mb}: must be 0 (no limit) or more")
    if header_timeout_s < 0:
        _fail(f"--header-timeout-s {header_timeout_s}: must be 0 (off) or more")
    metrics_token = _metrics_token(metrics_token_file)
    try:
        fault_rules = [parse_rule(text) for text in inject or []]
        if rules is not None:
            fault_rules += load_rules(rules)
    except (RuleError, OSError, ValueError) as exc:
        _fail(f"bad fault rule: {exc}")
    config = ProxyConfig(
        bootstrap=targets,
        listen=listen_address,
        out_dir=out,
        advertise=advertise,
        broker_port_base=broker_port_base,
        flush_seconds=flush_seconds,
        flush_rows=flush_rows,
        max_queue_bytes=max_queue_mb << 20,
        max_memory_bytes=max_memory_mb << 20,
        max_pending_rows=max_pending_rows,
        tls_cert=tls_cert,
        tls_key=tls_key,
        upstream_tls=upstream_tls or upstream_ca is not None,
        upstream_ca=upstream_ca,
        upstream_verify=not upstream_insecure,
        rules=fault_rules,
        seed=seed,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        metrics_client_ids=metrics_client_ids,
        metrics_token=metrics_token,
        header_timeout=header_timeout_s or None,
        io=io,
    )
    try:
        config.threaded()
    except ValueError as exc:
        _fail(str(exc))

    def ready(running: Proxy) -> None:
        extra = f", metrics on {metrics_host}:{running.metrics_port}" if running.metrics_port else ""
        print(
            f"kwire proxy: listening on {listen_address[0]}:{running.listen_port}{extra}",
            file=sys.stderr,
            flush=True,
        )

    # The Parquet writer thread holds the GIL while it converts rows; hand it back to the
    # forwarding loop every millisecond rather than every 5 (Python's default).
    sys.setswitchinterval(0.001)
    try:
        running = Proxy(config)
        asyncio.run(running.serve(ready))
    except OSError as exc:
        _fail(str(exc))
