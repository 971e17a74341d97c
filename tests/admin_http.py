"""Talking to a proxy's admin endpoint in tests: one HTTP request, every wait bounded."""

from __future__ import annotations

import http.client
import re
import ssl
import time
from typing import Any


def call(
    host: str,
    port: int,
    method: str = "GET",
    path: str = "/metrics",
    body: bytes | str | None = None,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request to the admin endpoint."""
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request(method, path, body=body.encode() if isinstance(body, str) else body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def metric(page: bytes, name: str, **labels: str) -> float | None:
    """The value of one series on a Prometheus page (None if it is not there)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)$"
    for line in page.decode().splitlines():
        match = re.match(pattern, line)
        if match:
            return float(match.group(1))
    return None


def wait_for(check: Any, timeout: float, every: float = 0.1) -> Any:
    """``check()``'s first truthy value within ``timeout`` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(every)
        value = check()
    return value
