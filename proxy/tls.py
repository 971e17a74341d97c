"""TLS contexts: terminating TLS for clients, and speaking TLS to the brokers.

With ``--tls-cert/--tls-key`` clients talk TLS to the proxy and the proxy sees (and
records) plaintext Kafka. With ``--upstream-tls`` the proxy talks TLS to the brokers,
verifying them against ``--upstream-ca`` (or the system's CAs). SASL is not touched either
way: its frames pass through like any other and the decoder never keeps credentials.
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["client_side_context", "upstream_context"]


def client_side_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """Server-side context presented to clients."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except OSError as exc:  # ssl.SSLError too; neither names the files
        raise OSError(f"cannot load TLS certificate {cert} with key {key}: {_reason(exc)}") from exc
    return context


def upstream_context(ca: str | Path | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """Client-side context for connections to brokers."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
    except OSError as exc:
        raise OSError(f"cannot load CA bundle {ca}: {_reason(exc)}") from exc
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _reason(exc: OSError) -> str:
    return exc.strerror or getattr(exc, "reason", None) or str(exc)
