"""002, skew: many single-partition topics, all led by broker 1, beside balanced topics.

Incident 3 of DESIGN.md (broker 1 ran out of file handles). A 3-broker KRaft cluster
(Kafka 4.1) gets 24 one-partition topics placed on broker 1 alone and one 6-partition
topic spread evenly. Producers write to some of each, a consumer reads the balanced one,
and an operator lists the cluster with ``kcat -L`` (a full Metadata request), so the
placement is on the wire. The truth is the placement itself, read back from the cluster.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "002-skew"
DESCRIPTION = (
    "KRaft 4.1: 24 one-partition topics all on broker 1, one 6-partition topic spread over 3 brokers"
)
KAFKA = "4.1"
SKEWED = [f"logs-{i:02d}" for i in range(24)]
BALANCED = "metrics"
BALANCED_ASSIGNMENT = [[1, 2], [2, 3], [3, 1], [1, 3], [2, 1], [3, 2]]
MESSAGES = 60


def create_topics(bootstrap: str) -> None:
    """All topics in one CreateTopics request, with explicit replica placement."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "lab-admin"})
    topics = [NewTopic(name, num_partitions=1, replica_assignment=[[1]]) for name in SKEWED]
    topics.append(
        NewTopic(BALANCED, num_partitions=len(BALANCED_ASSIGNMENT), replica_assignment=BALANCED_ASSIGNMENT)
    )
    for future in admin.create_topics(topics, request_timeout=60).values():
        future.result(timeout=60)  # raises with the broker's reason if a topic was refused


def kcat_list(bootstrap: str, log: Path) -> int:
    """``kcat -L``: the cluster's full metadata, as an operator asks for it."""
    kcat = shutil.which("kcat")
    if kcat is None:
        raise RuntimeError("kcat not installed (run scripts/install-system-deps)")
    with log.open("wb") as out:
        return subprocess.run(
            [kcat, "-L", "-b", bootstrap, "-X", "client.id=ops-kcat"], stdout=out, stderr=out, timeout=30
        ).returncode


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    with KRaftCluster(
        KAFKA, **addresses(), brokers=3, controllers=1, base_dir=work_dir / "cluster"
    ) as cluster:
        cluster.start(timeout=180)
        create_topics(cluster.bootstrap)
        leaders = {t: cluster.wait_for_leaders(t) for t in [*SKEWED, BALANCED]}
        with LabRun(NAME, cluster, work_dir / "run") as run:
            for topic in SKEWED[:4]:
                run.start_client(
                    "confluent-kafka", f"app-{topic}", topic, produce=MESSAGES, rate=30, duration_s=30
                )
            run.start_client(
                "java-4.1.1", "metrics-producer", BALANCED, produce=MESSAGES * 3, rate=60, duration_s=30
            )
            run.start_client(
                "java-4.1.1",
                "metrics-consumer",
                BALANCED,
                consume=True,
                group="dash",
                expect=MESSAGES * 3,
                idle_s=8,
                duration_s=40,
            )
            run.wait_clients()
            rc = kcat_list(cluster.bootstrap, run.clients_dir / "ops-kcat.log")
            run.mark("kcat_list", rc=rc)
            per_broker: dict[str, int] = {}
            for partitions in leaders.values():
                for leader in partitions.values():
                    per_broker[str(leader)] = per_broker.get(str(leader), 0) + 1
            return run.finish(
                out_dir,
                extra={
                    "leaders": {t: {str(p): n for p, n in ps.items()} for t, ps in leaders.items()},
                    "partitions_led_by_broker": per_broker,
                    "skewed_topics": SKEWED,
                    "balanced_topic": BALANCED,
                    "description": DESCRIPTION,
                },
            )
