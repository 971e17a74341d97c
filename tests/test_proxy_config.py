"""``kwire proxy --config FILE`` (issue 19 item 6): the file runs the proxy, the command line
overrides it, SIGHUP swaps the rules under a real client that stays connected (a bad file keeps
the rules in force, in one log line, counted), the startup log lists the rules and says
"listening" once, and every mistake in a file is one line naming the file and the line."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from admin_http import call, metric, wait_for
from typer.testing import CliRunner

from kwire.cli import app
from proxy.config_file import load_config
from proxy.embedded import ProxyProcess

LAB = os.environ.get("KWIRE_LAB_NET", "127.0.21")
BROKER_PORT, PROXY_PORT, ADMIN_PORT, ADMIN_OVERRIDE, NODE_PORT = 41610, 41611, 41612, 41613, 41620
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker() -> Any:
    from realkafka import started_tansu

    tansu = started_tansu(f"{LAB}.2", BROKER_PORT)
    tansu.create_topics(["cfg-t"], partitions=1)
    yield tansu
    tansu.close()


def _config(broker: Any, rules: str) -> str:
    return f"""\
listen: {LAB}.3:{PROXY_PORT}
bootstrap: [{broker.bootstrap}]
broker_port_base: {NODE_PORT - broker.node_id}
recording:
  out: ds
  flush_seconds: 500ms
admin:
  listen: {LAB}.3:{ADMIN_PORT}
  token_file: token
{rules}"""


def _produce(producer: Any, topic: str, timeout: float = 15.0) -> str | None:
    """Produce one record; the delivery error's name, or None once it is written."""
    box: list[Any] = []
    producer.produce(topic, b"kwire", on_delivery=lambda err, _msg: box.append(err))
    deadline = time.monotonic() + timeout
    while not box and time.monotonic() < deadline:
        producer.poll(0.1)
    assert box, "no delivery report in time"
    return None if box[0] is None else box[0].name()


@pytest.mark.real
def test_config_file_runs_the_proxy_and_sighup_swaps_rules_under_a_connected_client(
    broker: Any, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    token = "kw-config-test-7c1d"
    (tmp_path / "token").write_text(token)
    (tmp_path / "token").chmod(0o600)
    config = tmp_path / "kwire-proxy.yaml"
    config.write_text(
        _config(broker, "rules:\n  - {api: Produce, topic: cfg-t, error: KAFKA_STORAGE_ERROR}\n")
    )
    # the command line wins over the file: the admin port is the flag's, its host the file's
    proxy = ProxyProcess(
        ["--config", str(config), "--metrics-port", str(ADMIN_OVERRIDE)], log_path=tmp_path / "log"
    )
    proxy.start()
    admin = (f"{LAB}.3", ADMIN_OVERRIDE)

    def scrape() -> bytes:
        status, _headers, page = call(*admin, token=token)
        assert status == 200
        return page

    def reloads(result: str) -> float | None:
        return metric(scrape(), "kwire_proxy_rule_reloads_total", source="signal", result=result)

    producer = Producer(
        {
            "bootstrap.servers": f"{LAB}.3:{PROXY_PORT}",
            "client.id": "kwire-config-test",
            "acks": 1,
            "retries": 0,
            "linger.ms": 0,
            "enable.idempotence": False,
            "message.timeout.ms": 10000,
        }
    )
    try:
        assert proxy.port == PROXY_PORT and proxy.metrics_port == ADMIN_OVERRIDE
        assert _produce(producer, "cfg-t") == "KAFKA_STORAGE_ERROR"  # the file's rule
        connections = metric(scrape(), "kwire_proxy_connections_total")

        # SIGHUP with no rules in the file: the same producer's next record goes through
        config.write_text(_config(broker, "rules: []\n"))
        proxy.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: reloads("ok") == 1, 10)
        assert metric(scrape(), "kwire_proxy_fault_rules") == 0
        assert _produce(producer, "cfg-t") is None

        # a file that does not parse: the rules in force are kept, one log line says where
        bad = _config(
            broker, "rules:\n  - api=Produce,topic=cfg-t,error=KAFKA_STORAGE_ERROR\n  - api=Nope,close\n"
        )
        config.write_text(bad)
        bad_line = bad.splitlines().index("  - api=Nope,close") + 1
        proxy.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: reloads("error") == 1, 10)
        [line] = [line for line in proxy.log.splitlines() if "SIGHUP: the rules in force are kept" in line]
        assert line.endswith(f"{config}:{bad_line}: unknown api 'Nope'")
        assert _produce(producer, "cfg-t") is None  # still none

        # fixed: the rule is back, for the same connections
        config.write_text(_config(broker, "rules:\n  - api=Produce,topic=cfg-t,error=POLICY_VIOLATION\n"))
        proxy.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: reloads("ok") == 2, 10)
        assert _produce(producer, "cfg-t") == "POLICY_VIOLATION"
        page = scrape()
        assert metric(page, "kwire_proxy_connections_total") == connections, "the client kept its connections"
        assert metric(page, "kwire_proxy_fault_rules") == 1
    finally:
        producer.flush(5)
        code = proxy.terminate()
    assert code == 0
    log = proxy.log
    # startup: the rules listed once, "listening" once for the clients' listener
    start = log[: log.index("kwire proxy: listening on")]
    assert start.count("fault rules: 1 from") == 1
    assert start.count("rule 1: api=Produce,topic=cfg-t,error=KAFKA_STORAGE_ERROR") == 1
    assert len(re.findall(rf"listening on {re.escape(LAB)}\.3:{PROXY_PORT}\b", log)) == 1
    assert len(re.findall(rf"listening on {re.escape(LAB)}\.3:{NODE_PORT}\b", log)) == 1
    assert token not in log
    assert list((tmp_path / "ds").rglob("*.parquet")), "recording.out was used"


def _bad(tmp_path: Path, text: str, *extra: str) -> tuple[int, list[str]]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["proxy", "--config", str(path), *extra])
    return result.exit_code, result.stderr.splitlines()


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("bootstrap: [127.0.0.1:1]\nrecordin:\n  out: ds\n", 2, "unknown key 'recordin'"),
        ("bootstrap: [127.0.0.1:1]\nadmin:\n  listen: 127.0.0.1:notaport\n", 3, "admin.listen"),
        ("bootstrap: [127.0.0.1:1]\nadmin:\n  colour: red\n", 3, "unknown key 'admin.colour'"),
        (
            "bootstrap: [127.0.0.1:1]\nrecording:\n  flush_rows: 0\n",
            3,
            "recording.flush_rows: expected a whole number 1 or more",
        ),
        ("bootstrap: [127.0.0.1:1]\nio: fibres\n", 2, "io: expected one of auto, asyncio"),
        ("bootstrap: [127.0.0.1:1]\nio: threads\n", 2, "io: --io threads was removed: "),
        ("bootstrap: [127.0.0.1:1]\nupstream:\n  tls: maybe\n", 3, "upstream.tls: expected true or false"),
        (
            "bootstrap: [127.0.0.1:1]\nrules:\n  - api=Produce,error=56\n  - {api: Fetch, latency: soon}\n",
            4,
            "not a duration",
        ),
        (
            "bootstrap: [127.0.0.1:1]\nrules:\n  - api: Fetch\n    colour: red\n    error: 1\n",
            4,
            "unknown rule key 'colour'",
        ),
        ("bootstrap: [127.0.0.1:1]\nrules:\n  - api=Produce\n", 3, "exactly one action"),
        ("bootstrap: [127.0.0.1:1\nlisten: 1\n", 2, "not valid YAML"),
        ("- a\n- b\n", 1, "must be a mapping"),
        ("bootstrap: [127.0.0.1:1]\nlisten: 1\nlisten: 2\n", 3, "listen is given twice"),
    ],
)
def test_a_bad_config_file_gets_one_line_naming_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    code, lines = _bad(tmp_path, text)
    assert code == 2
    [one] = lines
    assert one.startswith(f"kwire proxy: {tmp_path / 'bad.yaml'}:{line}: ") and message in one, one


def test_other_config_mistakes_are_one_line_too(tmp_path: Path) -> None:
    code, [one] = _bad(tmp_path, "listen: 127.0.0.1:0\n")
    assert code == 2 and "give the brokers: --bootstrap HOST:PORT, or bootstrap: in --config" in one
    result = CliRunner().invoke(app, ["proxy", "--config", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2
    [one] = result.stderr.splitlines()
    assert one == f"kwire proxy: {tmp_path / 'none.yaml'}: No such file or directory"
    rules = tmp_path / "rules.yaml"
    rules.write_text("- api=Produce,error=56\n- api=Nope,error=1\n")
    result = CliRunner().invoke(app, ["proxy", "-b", "127.0.0.1:1", "--rules", str(rules)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"kwire proxy: bad fault rule: {rules}:2: unknown api 'Nope'"]


def test_the_shipped_example_loads_and_is_the_readme_example() -> None:
    example = ROOT / "kwire-proxy.example.yaml"
    config = load_config(example)
    assert config.values["bootstrap"] == ["kafka-1.internal:9092", "kafka-2.internal:9092"]
    assert config.values["metrics_port"] == 9644 and config.values["admin_open"] is False
    assert config.values["tls_cert"] == ROOT / "certs/proxy.pem"  # relative to the file
    assert [r.action for r in config.rules or []] == ["error", "latency", "close"]
    readme = (ROOT / "README.md").read_text()
    assert example.read_text() in readme, "README shows the example file as it is"


def test_a_reload_keeps_the_clock_and_count_of_unchanged_rules() -> None:
    from proxy.inject import RuleSet, parse_rule

    rules = RuleSet([parse_rule("api=Fetch,error=6,after=1h")])
    [old] = rules.rules
    old.since -= 3600  # loaded an hour ago: in force now
    assert rules.decide(1, None, None, {}) is old and old.applied == 1
    kept = rules.replace(
        [parse_rule("api=Fetch,error=6,after=1h"), parse_rule("api=Produce,error=56,after=1h")]
    )
    assert (kept[0].since, kept[0].applied) == (old.since, 1) and rules.may_apply(1)
    assert not rules.may_apply(0)  # a new rule's clock starts at the reload
    rules.replace([])
    assert not rules and not rules.may_apply(1)
