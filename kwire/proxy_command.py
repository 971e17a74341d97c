"""``kwire proxy``: a recording Kafka sidecar proxy that can also rehearse failures.

Settings come from the command line and, with ``--config FILE``, from a YAML file
(``proxy.config_file``); an option given on the command line wins over the file. Fault rules
come from ``--inject``/``--rules`` if either is given, else from the file's ``rules``; SIGHUP
re-reads them from the ``--rules`` file, else from the config file (``Proxy.reload_rules``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["METRICS_TOKEN_ENV", "proxy"]

#: Environment variable holding the metrics bearer token (when no --metrics-token-file is given).
METRICS_TOKEN_ENV = "KWIRE_METRICS_TOKEN"


def _fail(message: str, command: str = "kwire proxy") -> None:
    print(f"{command}: {message}", file=sys.stderr)
    raise typer.Exit(2)


def _bare_port(text: str) -> str:
    """A bare number is a port (on 127.0.0.1), never a host name: ``--listen 41300``."""
    return f"127.0.0.1:{text.strip()}" if text.strip().isdigit() else text


def recording_bounds_error(
    flush_seconds: float, flush_rows: int, max_queue_mb: int, max_pending_rows: int | None = None
) -> str | None:
    """What is wrong with the recorder's bounds as given on the command line, in one line (None:
    nothing). Each must be more than 0, and the flush window finite: it bounds what a SIGKILL
    loses (the config file's ``recording:`` section checks the same)."""
    for flag, value in (
        ("--flush-seconds", flush_seconds),
        ("--flush-rows", flush_rows),
        ("--max-queue-mb", max_queue_mb),
        ("--max-pending-rows", max_pending_rows),
    ):
        if value is not None and not (value > 0 and math.isfinite(value)):  # NaN fails both
            return f"{flag} {value}: must be a finite number more than 0"
    return None


def _metrics_token(path: Path | None, command: str = "kwire proxy") -> str | None:
    """The metrics token: from ``path`` if given, else from the environment; None for none.
    A token file that cannot be used: one line on stderr (``command: ...``), exit 2."""
    if path is None:
        token = os.environ.get(METRICS_TOKEN_ENV, "").strip()
        return token or None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"--metrics-token-file {path}: {exc}", command)
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        _fail(f"--metrics-token-file {path}: the token must be one word of printable characters", command)
    if path.stat().st_mode & 0o077:
        logging.getLogger("kwire").warning(
            "--metrics-token-file %s can be read by other users (chmod 600 it)", path
        )
    return token


def proxy(
    ctx: typer.Context,
    bootstrap: Annotated[
        list[str] | None,
        typer.Option(
            "--bootstrap", "-b", help="broker HOST:PORT to forward to (repeatable; or bootstrap: in --config)"
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="YAML file with listeners, brokers, TLS, recording, admin and fault rules "
            "(README: 'The proxy's config file'); options given here override it",
        ),
    ] = None,
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
        Path | None,
        typer.Option(
            help="YAML or JSON file with a list of fault rules (strings or objects); SIGHUP re-reads it"
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="random seed for rule rates")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            "--admin-port",
            help="serve the admin endpoint (/metrics, /healthz, /ready, /rules) on this port",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", "--admin-host", help="address the admin endpoint binds")
    ] = "127.0.0.1",
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            "--metrics-token-file",
            "--admin-token-file",
            help="file holding a token /metrics and /rules then ask for (Authorization: Bearer TOKEN); "
            f"or set {METRICS_TOKEN_ENV} (never pass a token on the command line: ps shows it)",
        ),
    ] = None,
    admin_open: Annotated[
        bool,
        typer.Option(
            help="let PUT /rules change the rules with no token and no client certificate "
            "(any local user could then inject faults)"
        ),
    ] = False,
    admin_tls_cert: Annotated[
        Path | None, typer.Option(help="serve the admin endpoint over TLS with this certificate (PEM)")
    ] = None,
    admin_tls_key: Annotated[Path | None, typer.Option(help="private key of --admin-tls-cert (PEM)")] = None,
    admin_client_ca: Annotated[
        Path | None,
        typer.Option(help="mutual TLS: admin clients need a certificate signed by this CA (PEM)"),
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
            help="how connections are forwarded: auto or asyncio, both the event loop, the only I/O "
            "model (threads was removed: it stalled other clients when many connections closed)"
        ),
    ] = "auto",
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Forward Kafka clients to brokers, record every exchange, optionally inject faults."""
    arguments = dict(locals())  # the options as converted for this call (ctx.params may hold raw text)
    from proxy.config_file import ConfigError, FileConfig, load_config
    from proxy.inject import RuleError, load_rules, parse_rule
    from proxy.server import Proxy, ProxyConfig, check_io, parse_address

    given = {name: arguments[name] for name in ctx.params}
    file: FileConfig | None = None
    if config_file is not None:
        try:
            file = load_config(config_file)
        except ConfigError as exc:
            _fail(str(exc))
        assert file is not None
        given.update(_from_file(ctx, file))
    o = _Options(given)
    logging.basicConfig(
        level=getattr(logging, str(o.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s kwire proxy %(levelname)s %(message)s",
    )
    try:
        check_io(str(o.io))  # before anything else: a removed --io is the first thing to say
    except ValueError as exc:
        _fail(str(exc))
    if not o.bootstrap:
        _fail("give the brokers: --bootstrap HOST:PORT, or bootstrap: in --config")
    try:
        targets = [parse_address(_bare_port(b), 9092) for b in o.bootstrap]
        listen_address = parse_address(_bare_port(str(o.listen)), 9092)
    except ValueError as exc:
        _fail(str(exc))
    if o.out is not None and str(o.out) == "-":
        _fail(
            "-o -: the proxy records a dataset directory; to watch exchanges live, use kwire decode -i IFACE"
        )
    if o.metrics_port is not None and not 0 <= o.metrics_port <= 65535:
        _fail(f"--metrics-port {o.metrics_port}: the port must be a number from 0 to 65535")
    if bool(o.tls_cert) != bool(o.tls_key):
        _fail("--tls-cert and --tls-key go together (tls.cert and tls.key in --config)")
    if bool(o.admin_tls_cert) != bool(o.admin_tls_key):
        _fail(
            "--admin-tls-cert and --admin-tls-key go together (admin.tls.cert and admin.tls.key in --config)"
        )
    if o.admin_client_ca is not None and o.admin_tls_cert is None:
        _fail("--admin-client-ca needs --admin-tls-cert and --admin-tls-key (mutual TLS is TLS)")
    if o.metrics_client_ids < 0:
        _fail(f"--metrics-client-ids {o.metrics_client_ids}: must be 0 or more")
    if o.max_memory_mb < 0:
        _fail(f"--max-memory-mb {o.max_memory_mb}: must be 0 (no limit) or more")
    if o.header_timeout_s < 0:
        _fail(f"--header-timeout-s {o.header_timeout_s}: must be 0 (off) or more")
    wrong = recording_bounds_error(o.flush_seconds, o.flush_rows, o.max_queue_mb, o.max_pending_rows)
    if wrong:
        _fail(wrong)
    metrics_token = _metrics_token(o.metrics_token_file)
    from_command_line = bool(inject) or rules is not None
    try:
        fixed = [parse_rule(text, origin="--inject") for text in inject or []]
    except RuleError as exc:
        _fail(f"bad fault rule: {exc}")
    reloader: Any = None
    origin = None
    try:
        if rules is not None:
            rules_path = rules

            def reloader() -> list[Any]:
                return [parse_rule(r.text, origin="--inject") for r in fixed] + load_rules(rules_path)

            origin = str(rules)
            fault_rules = reloader()
        elif not from_command_line and file is not None:
            config_path = file.path

            def reloader() -> list[Any]:
                return load_config(config_path).rules or []

            origin = str(config_path)
            fault_rules = file.rules or []
        else:
            fault_rules = fixed
    except (ConfigError, RuleError, ValueError) as exc:
        _fail(f"bad fault rule: {exc}")
    config = ProxyConfig(
        bootstrap=targets,
        listen=listen_address,
        out_dir=o.out,
        advertise=o.advertise,
        broker_port_base=o.broker_port_base,
        flush_seconds=o.flush_seconds,
        flush_rows=o.flush_rows,
        max_queue_bytes=o.max_queue_mb << 20,
        max_memory_bytes=o.max_memory_mb << 20,
        max_pending_rows=o.max_pending_rows,
        tls_cert=o.tls_cert,
        tls_key=o.tls_key,
        upstream_tls=o.upstream_tls or o.upstream_ca is not None,
        upstream_ca=o.upstream_ca,
        upstream_verify=not o.upstream_insecure,
        rules=fault_rules,
        seed=o.seed,
        metrics_port=o.metrics_port,
        metrics_host=o.metrics_host,
        metrics_client_ids=o.metrics_client_ids,
        metrics_token=metrics_token,
        admin_open=o.admin_open,
        admin_tls_cert=o.admin_tls_cert,
        admin_tls_key=o.admin_tls_key,
        admin_client_ca=o.admin_client_ca,
        rules_reloader=reloader,
        rules_origin=origin,
        header_timeout=o.header_timeout_s or None,
        io=o.io,
    )
    try:
        config.check()
    except ValueError as exc:
        _fail(str(exc))

    def ready(running: Proxy) -> None:
        # the one "listening" line for the clients' listener (each broker's gets a log line as it opens)
        extra = f", metrics on {o.metrics_host}:{running.metrics_port}" if running.metrics_port else ""
        brokers = ", ".join(f"{h}:{p}" for h, p in targets)
        print(
            f"kwire proxy: listening on {listen_address[0]}:{running.listen_port}{extra} (brokers {brokers})",
            file=sys.stderr,
            flush=True,
        )

    # A thread beside the loop (the admin endpoint renders /metrics in one; the recorder and its
    # Parquet writer run in a process of their own) hands the GIL back to the forwarding loop
    # every millisecond rather than every 5 (Python's default).
    sys.setswitchinterval(0.001)
    try:
        running = Proxy(config)
        asyncio.run(running.serve(ready))
    except OSError as exc:
        _fail(str(exc))


class _Options:
    """The merged option values, as attributes (``o.listen``)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _from_file(ctx: typer.Context, file: Any) -> dict[str, Any]:
    """The config file's values for every option not given on the command line."""
    out = {}
    for name, value in file.values.items():
        source = ctx.get_parameter_source(name)  # click's ParameterSource (typer vendors click)
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            out[name] = value
    return out
