"""The proxy's admin endpoint (issue 19 item 6, issue 18 item 6): ``/metrics``, ``/healthz``,
``/ready``, ``GET``/``PUT /rules`` on a real ``kwire proxy`` process, the rules changed under a
client connection that stays open, who may change them (token, mutual TLS, ``--admin-open``),
and 404/405 for the rest."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from admin_http import call, metric, wait_for

from proxy.embedded import ProxyProcess

LAB = os.environ.get("KWIRE_LAB_NET", "127.0.21")
BROKER = (f"{LAB}.4", 41640)
HOST = f"{LAB}.5"  # the proxies' listeners and admin endpoints
PROXY_PORT, NODE_PORT, ADMIN_PORT, DEAD_PORT = 41641, 41642, 41643, 41699

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def broker() -> Any:
    from realkafka import started_tansu

    tansu = started_tansu(BROKER[0], BROKER[1])
    yield tansu
    tansu.close()


def _api_versions(sock: socket.socket, corr: int) -> int:
    """One ApiVersions v0 round trip on an open connection; the response's error code."""
    client = b"kwire-admin-test"
    payload = struct.pack(">hhih", 18, 0, corr, len(client)) + client
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    head = _exactly(sock, 4)
    body = _exactly(sock, struct.unpack(">i", head)[0])
    assert struct.unpack_from(">i", body)[0] == corr
    return struct.unpack_from(">h", body, 4)[0]


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the proxy")
        buf += chunk
    return bytes(buf)


def _proxy(tmp_path: Path, bootstrap: str, *extra: str) -> ProxyProcess:
    return ProxyProcess(
        ["--bootstrap", bootstrap, "--listen", f"{HOST}:{PROXY_PORT}", "--metrics-host", HOST, *extra],
        log_path=tmp_path / "proxy.log",
    ).start()


def test_routes_token_and_rules_replaced_under_an_open_connection(broker: Any, tmp_path: Path) -> None:
    token = "kw-admin-test-51a0"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    proxy = _proxy(
        tmp_path,
        broker.bootstrap,
        "--broker-port-base",
        str(NODE_PORT - broker.node_id),
        "--metrics-port",
        str(ADMIN_PORT),
        "--metrics-token-file",
        str(tmp_path / "token"),
    )
    admin = (HOST, ADMIN_PORT)
    try:
        assert call(*admin, path="/healthz")[::2] == (200, b"ok\n")
        status, _h, body = call(*admin, path="/ready")
        assert status == 200 and f"broker {broker.bootstrap} accepts connections" in body.decode()
        assert call(*admin)[0] == 401 and call(*admin, path="/rules")[0] == 401
        status, headers, body = call(*admin, path="/rules", token=token)
        assert status == 200 and headers["content-type"] == "application/json"
        assert json.loads(body) == {"rules": []}

        with socket.create_connection((HOST, PROXY_PORT), timeout=10) as client:
            assert _api_versions(client, 1) == 0
            # writing needs the token, and a bad body keeps the rules in force
            rules = "- api=ApiVersions,error=UNSUPPORTED_VERSION\n"
            assert call(*admin, "PUT", "/rules", rules)[0] == 401
            status, _h, body = call(*admin, "PUT", "/rules", rules + "- api=Nope,close\n", token=token)
            assert (status, body) == (400, b"PUT /rules:2: unknown api 'Nope'\n")
            status, _h, body = call(*admin, "PUT", "/rules", "{rules: [api=Fetch, error: 1]", token=token)
            assert status == 400 and body.startswith(b"PUT /rules:1: not valid YAML")
            assert _api_versions(client, 2) == 0

            status, _h, body = call(*admin, "PUT", "/rules", rules, token=token)
            assert status == 200
            [rule] = json.loads(body)["rules"]
            assert (
                rule["rule"] == "api=ApiVersions,error=UNSUPPORTED_VERSION"
                and rule["origin"] == "PUT /rules:1"
            )
            assert _api_versions(client, 3) == 35  # the same connection gets the new rule
            [rule] = json.loads(call(*admin, path="/rules", token=token)[2])["rules"]
            assert rule["applied"] == 1 and rule["active"] is True

            status, _h, body = call(*admin, "PUT", "/rules", "[]", token=token)
            assert (status, json.loads(body)) == (200, {"rules": []})
            assert _api_versions(client, 4) == 0

        page = call(*admin, token=token)[2]
        assert metric(page, "kwire_proxy_rule_reloads_total", source="admin", result="ok") == 2
        assert metric(page, "kwire_proxy_rule_reloads_total", source="admin", result="error") == 2
        assert metric(page, "kwire_proxy_fault_rules") == 0
        assert metric(page, "kwire_proxy_connections_total") == 1

        assert call(*admin, path="/nope")[0] == 404
        assert call(*admin, path="/")[0] == 404
        status, headers, _b = call(*admin, "POST", "/rules", "x", token=token)
        assert status == 405 and headers["allow"] == "GET, HEAD, PUT"
        assert call(*admin, "PUT", "/metrics", "x", token=token)[0] == 405
        assert call(*admin, "DELETE", "/healthz")[0] == 405
    finally:
        code = proxy.terminate()
    assert code == 0
    assert token not in proxy.log
    assert proxy.log.count("PUT /rules refused, the rules in force are kept") == 2


def test_put_rules_needs_a_caller_unless_admin_open(tmp_path: Path) -> None:
    dead = f"{LAB}.4:{DEAD_PORT}"  # nothing listens there: not ready
    proxy = _proxy(tmp_path, dead, "--metrics-port", str(ADMIN_PORT))
    try:
        status, _h, body = call(HOST, ADMIN_PORT, path="/ready")
        assert status == 503 and b"no broker accepts connections" in body
        status, _h, body = call(HOST, ADMIN_PORT, "PUT", "/rules", "[]")
        assert status == 403 and b"--admin-open" in body
        assert call(HOST, ADMIN_PORT, path="/rules")[0] == 200  # reading is open without a token
    finally:
        assert proxy.terminate() == 0
    proxy = _proxy(tmp_path, dead, "--metrics-port", str(ADMIN_PORT), "--admin-open")
    try:
        assert call(HOST, ADMIN_PORT, "PUT", "/rules", '["api=Fetch,close"]')[0] == 200
        status, _h, body = call(HOST, ADMIN_PORT, path="/rules")
        assert status == 200 and b"api=Fetch,close" in body
        assert call(HOST, ADMIN_PORT, "PUT", "/rules", "[]")[0] == 200
    finally:
        assert proxy.terminate() == 0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _certificates(folder: Path) -> None:
    """ca.pem, server.pem/key (for HOST), client.pem/key (signed by ca), stranger.pem/key (not)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
                 "-subj", f"/CN=kwire {ca}", cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text(f"subjectAltName=IP:{HOST}\n")
    for name, ca, ext in (
        ("server", "ca", ["-extfile", "san.ext"]),
        ("client", "ca", []),
        ("stranger", "other-ca", []),
    ):
        _openssl(
            "req",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=kwire {name}",
            cwd=folder,
        )
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext, cwd=folder)  # fmt: skip


def test_mutual_tls_admits_certified_clients_only(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    _certificates(tmp_path)
    proxy = _proxy(
        tmp_path,
        f"{LAB}.4:{DEAD_PORT}",
        "--metrics-port",
        str(ADMIN_PORT),
        "--admin-tls-cert",
        str(tmp_path / "server.pem"),
        "--admin-tls-key",
        str(tmp_path / "server.key"),
        "--admin-client-ca",
        str(tmp_path / "ca.pem"),
    )

    def context(name: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        if name:
            ctx.load_cert_chain(str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key"))
        return ctx

    try:
        status, _h, body = call(
            HOST, ADMIN_PORT, "PUT", "/rules", '["api=Fetch,close"]', context=context("client")
        )
        assert status == 200 and json.loads(body)["rules"][0]["rule"] == "api=Fetch,close"
        assert call(HOST, ADMIN_PORT, path="/healthz", context=context("client"))[0] == 200
        for name in (None, "stranger"):  # no certificate, or one another CA signed: no handshake
            with pytest.raises((ssl.SSLError, ConnectionError)):
                call(HOST, ADMIN_PORT, path="/healthz", context=context(name))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            call(HOST, ADMIN_PORT, path="/healthz")  # plain HTTP is no TLS handshake either
        # still serving after the failed handshakes
        assert wait_for(lambda: call(HOST, ADMIN_PORT, path="/rules", context=context("client"))[0] == 200, 5)
    finally:
        assert proxy.terminate() == 0
