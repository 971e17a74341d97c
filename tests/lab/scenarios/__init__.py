"""The incident lab's scenarios, one module each, named by the incident number in DESIGN.md.

Each module has ``NAME``, ``DESCRIPTION`` and ``run(out_dir, work_dir) -> truth``: it starts
its own cluster and clients, acts on the brokers, and writes ``capture.pcap.gz`` and
``truth.json`` into ``out_dir`` (see ``lab.run``). ``SCENARIOS`` maps names to modules.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

__all__ = ["SCENARIOS", "addresses", "scenario"]

#: The /24 of loopback a scenario's nodes live in; another value lets two runs share a machine.
NET_ENV = "KWIRE_LAB_NET"
DEFAULT_NET = "127.0.0"

#: scenario name -> module under lab.scenarios
SCENARIOS: dict[str, str] = {
    "000-old-broker": "s000_old_broker",
    "000-coordinator-load": "s000_coordinator_load",
    "001-broker-drops-out": "s001_broker_drops_out",
    "002-skew": "s002_skew",
    "003-jbod-disk-failure": "s003_jbod_disk_failure",
    "004-acks1-loss": "s004_acks1_loss",
    "upgrade-audit": "s005_upgrade_audit",
    "006-healthy": "s006_healthy",
}


def scenario(name: str) -> ModuleType:
    """The module of scenario *name*."""
    try:
        return importlib.import_module(f"lab.scenarios.{SCENARIOS[name]}")
    except KeyError:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})") from None


def addresses(kind: str = "kraft") -> dict[str, Any]:
    """Cluster keyword arguments placing nodes in ``$KWIRE_LAB_NET`` (default 127.0.0):
    brokers on .2-.4, controllers on .5-.7 (KRaft) or ZooKeeper on .10 (``kind="zk"``)."""
    net = os.environ.get(NET_ENV, DEFAULT_NET)
    found: dict[str, Any] = {"broker_ips": tuple(f"{net}.{i}" for i in (2, 3, 4))}
    if kind == "zk":
        found["zookeeper_ip"] = f"{net}.10"
    else:
        found["controller_ips"] = tuple(f"{net}.{i}" for i in (5, 6, 7))
    return found
