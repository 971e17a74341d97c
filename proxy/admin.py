"""The admin HTTP endpoint of ``kwire proxy`` and ``kwire capture`` (the metrics port).

Routes (HTTP/1.0, one request per connection):

* ``GET``/``HEAD /metrics``: the Prometheus page (``proxy.metrics``);
* ``GET /healthz``: ``ok`` while the process runs (no token: it tells nothing);
* ``GET /ready``: 200 once it is listening and can reach a broker (the proxy) or its capture
  program runs (the sidecar), else 503; the one-line reason is the body (no token);
* ``GET /rules``: the fault rules in force, as JSON (``{"rules": [...]}``);
* ``PUT /rules``: replace them; the body is a rules list in YAML or JSON (the ``rules`` of the
  config file). 200 and the new rules, or 400 with a one-line error naming the line
  (``PUT /rules:3: unknown api 'Nope'``): the rules in force are then kept.

Any other path is 404, any other method on a known path 405 (with ``Allow``).

**Who may do what.** With a token (``--metrics-token-file``/``KWIRE_METRICS_TOKEN``), ``/metrics``
and both ``/rules`` need ``Authorization: Bearer <token>`` (401 otherwise). ``PUT /rules`` changes
what production traffic gets, so it needs an authenticated caller even when reads are open: the
token, or a client certificate when the endpoint does mutual TLS (``--admin-client-ca``); with
neither it answers 403, unless ``--admin-open`` says any local user may change the rules. With
mutual TLS, connections without a certificate signed by that CA fail the TLS handshake.

At most ``MAX_METRICS_CONNECTIONS`` requests are served at once; more are closed at once. A request
head is at most 16 KiB, a body at most ``MAX_BODY`` bytes, and each is read within 5 seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.metrics import MAX_METRICS_CONNECTIONS, PAGE_REUSE_SECONDS, Metrics

__all__ = ["MAX_BODY", "AdminAuth", "AdminRoutes", "admin_ssl_context", "serve_admin"]

#: Largest ``PUT /rules`` body taken.
MAX_BODY = 1 << 20
#: How long the endpoint waits for a request's head (and body), and for its answer to be taken.
_READ_SECONDS = 5.0

_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json"
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    411: b"Length Required",
    413: b"Content Too Large",
    503: b"Service Unavailable",
}


@dataclass
class AdminRoutes:
    """What the endpoint serves; a route whose callable is None answers 404."""

    metrics: Metrics
    #: (ready, one-line reason)
    ready: Callable[[], Awaitable[tuple[bool, str]]] | None = None
    #: the rules in force, JSON-ready
    get_rules: Callable[[], Any] | None = None
    #: replace the rules from a body; raises ValueError (one line: 400)
    put_rules: Callable[[str], Any] | None = None


@dataclass
class AdminAuth:
    """How callers are authenticated (see the module doc)."""

    token: str | None = None
    #: PUT /rules without a token or a client certificate
    open_writes: bool = False
    #: TLS for the endpoint; mutual when its ``verify_mode`` is ``CERT_REQUIRED``
    ssl: ssl.SSLContext | None = None

    @property
    def client_certs(self) -> bool:
        return self.ssl is not None and self.ssl.verify_mode == ssl.CERT_REQUIRED


def admin_ssl_context(
    cert: str | Path, key: str | Path, client_ca: str | Path | None = None
) -> ssl.SSLContext:
    """Server-side TLS for the admin endpoint; with ``client_ca``, clients must show a
    certificate it signed (mutual TLS). OSError naming the files if they cannot be loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except OSError as exc:
        raise OSError(f"cannot load admin TLS certificate {cert} with key {key}: {_reason(exc)}") from exc
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except OSError as exc:
            raise OSError(f"cannot load admin client CA {client_ca}: {_reason(exc)}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _reason(exc: OSError) -> str:
    return exc.strerror or getattr(exc, "reason", None) or str(exc)


class _Page:
    """The last metrics page rendered, served again within ``PAGE_REUSE_SECONDS``."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.body = b""
        self.at = float("-inf")
        self._rendering: asyncio.Future[bytes] | None = None

    async def get(self) -> bytes:
        if time.monotonic() - self.at < PAGE_REUSE_SECONDS:
            return self.body
        if self._rendering is None or self._rendering.done():  # scrapes meanwhile share it
            self._rendering = asyncio.ensure_future(asyncio.to_thread(self._render))
        return await asyncio.shield(self._rendering)

    def _render(self) -> bytes:
        body = self.metrics.render().encode()
        self.body, self.at = body, time.monotonic()
        return body


def _response(status: int, body: bytes, content_type: bytes = _TEXT, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n"
        % (status, _REASONS[status], content_type, len(body), extra)
    ) + body


def _text(status: int, line: str, extra: bytes = b"") -> bytes:
    one = " ".join(line.split())  # one line whatever the message held
    return _response(status, one.encode() + b"\n", extra=extra)


def _json(value: Any) -> bytes:
    return _response(200, json.dumps(value, indent=2).encode() + b"\n", _JSON)


def _headers(head: bytes) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _bearer(headers: dict[bytes, bytes]) -> bytes | None:
    """The bearer token of the Authorization header, if there is one."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


_ALLOWED = {
    b"/metrics": (b"GET", b"HEAD"),
    b"/healthz": (b"GET", b"HEAD"),
    b"/ready": (b"GET", b"HEAD"),
    b"/rules": (b"GET", b"HEAD", b"PUT"),
}
_UNAUTHORIZED = (401, "a bearer token is needed", b'WWW-Authenticate: Bearer realm="kwire"\r\n')


async def serve_admin(
    routes: AdminRoutes, host: str, port: int, auth: AdminAuth | None = None
) -> asyncio.Server:
    """Serve the admin routes over HTTP/1.0 (over TLS with ``auth.ssl``) on host:port."""
    auth = auth or AdminAuth()
    expected = auth.token.encode() if auth.token else None
    page = _Page(routes.metrics)
    active = 0
    served = {
        path
        for path, present in (
            (b"/metrics", True),
            (b"/healthz", True),
            (b"/ready", routes.ready is not None),
            (b"/rules", routes.get_rules is not None),
        )
        if present
    }

    def token_ok(headers: dict[bytes, bytes]) -> bool:
        if expected is None:
            return True
        given = _bearer(headers)
        return given is not None and hmac.compare_digest(given, expected)

    async def answer(head: bytes, reader: asyncio.StreamReader) -> bytes:
        line = head.split(b"\r\n", 1)[0].split(b" ")
        if len(line) != 3:
            return _text(400, "bad request")
        method, target, _version = line
        path = target.split(b"?", 1)[0]
        headers = _headers(head)
        # a body is read before any answer: a close with unread bytes resets the connection,
        # and the client could lose the answer
        refused, text = (None, "")
        if method == b"PUT" or b"content-length" in headers:
            refused, text = await _body(headers, reader)
        if path not in served:
            return _text(
                404, f"not found: this endpoint serves {', '.join(p.decode() for p in sorted(served))}"
            )
        allowed = _ALLOWED[path] if path != b"/rules" or routes.put_rules else (b"GET", b"HEAD")
        if method not in allowed:
            return _text(
                405,
                f"{path.decode()} takes {' or '.join(a.decode() for a in allowed)}",
                extra=b"Allow: " + b", ".join(allowed) + b"\r\n",
            )
        if path == b"/healthz":
            return _text(200, "ok")
        if path == b"/ready":
            assert routes.ready is not None
            ok, why = await routes.ready()
            return _text(200 if ok else 503, why)
        if not token_ok(headers):
            return _text(*_UNAUTHORIZED)
        if path == b"/metrics":
            return _response(200, await page.get(), _METRICS_TYPE)
        if method != b"PUT":
            assert routes.get_rules is not None
            return _json(routes.get_rules())
        if expected is None and not auth.client_certs and not auth.open_writes:
            return _text(
                403,
                "PUT /rules needs an authenticated caller: give the proxy a token "
                "(--metrics-token-file or KWIRE_METRICS_TOKEN) or a client CA (--admin-client-ca), "
                "or start it with --admin-open",
            )
        if refused is not None:
            return refused
        assert routes.put_rules is not None
        try:
            return _json(routes.put_rules(text))
        except ValueError as exc:
            return _text(400, str(exc))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        if active >= MAX_METRICS_CONNECTIONS:
            writer.transport.abort()
            return
        active += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_SECONDS)
            response = await answer(head, reader)
            if head.startswith(b"HEAD "):
                response = response.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
            writer.write(response)
            await asyncio.wait_for(writer.drain(), _READ_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        except ssl.SSLError:
            pass
        finally:
            active -= 1
            writer.close()

    return await asyncio.start_server(
        handle,
        host,
        port,
        limit=16 << 10,
        ssl=auth.ssl,
        ssl_handshake_timeout=_READ_SECONDS if auth.ssl is not None else None,
    )


async def _body(headers: dict[bytes, bytes], reader: asyncio.StreamReader) -> tuple[bytes | None, str]:
    """(None, the request body as text), or (an error response, "") when the body has no
    length, is too large or is not UTF-8."""
    length = headers.get(b"content-length")
    if headers.get(b"transfer-encoding") or length is None or not length.isdigit():
        return _text(411, "PUT /rules needs a Content-Length (send the rules in one body)"), ""
    size = int(length)
    if size > MAX_BODY:
        return _text(413, f"PUT /rules: a body of at most {MAX_BODY} bytes"), ""
    data = await asyncio.wait_for(reader.readexactly(size), _READ_SECONDS)
    try:
        return None, data.decode("utf-8")
    except UnicodeDecodeError:
        return _text(400, "PUT /rules: the body is not UTF-8 text"), ""
