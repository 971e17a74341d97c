"""006, healthy: the control run. Nothing goes wrong, so kwire must find nothing wrong.

A 3-broker KRaft cluster (Kafka 4.1) with a 6-partition topic (replication 3,
min.insync.replicas 2). Producers with acks=all in four client libraries (Java, librdkafka,
sarama 1.43.3, franz-go) write to it while a two-member Java consumer group reads it back. No
fault is injected: the truth is every record sent, acked once and consumed, and the findings
for this capture may hold no warning and no critical finding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "006-healthy"
DESCRIPTION = "KRaft 4.1, no fault: acks=all producers in four libraries and a consumer group"
KAFKA = "4.1"
TOPIC = "orders"
PARTITIONS = 6
MESSAGES = 300
PRODUCERS = ("java-4.1.1", "confluent-kafka", "sarama-1.43.3", "franz-go")


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    with KRaftCluster(
        KAFKA, **addresses(), brokers=3, controllers=1, base_dir=work_dir / "cluster"
    ) as cluster:
        cluster.start(timeout=180)
        cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3, configs={"min.insync.replicas": 2})
        leaders = cluster.wait_for_leaders(TOPIC)
        with LabRun(NAME, cluster, work_dir / "run") as run:
            for member in ("a", "b"):
                run.start_client(
                    "java-4.1.1",
                    f"orders-reader-{member}",
                    TOPIC,
                    consume=True,
                    group="orders-readers",
                    idle_s=8,
                    duration_s=45,
                )
            for name in PRODUCERS:
                run.start_client(
                    name, f"{name}-producer", TOPIC, produce=MESSAGES, rate=20, acks="all", duration_s=40
                )
            run.wait_clients()
            return run.finish(
                out_dir,
                extra={
                    "leaders": {str(p): n for p, n in leaders.items()},
                    "description": DESCRIPTION,
                    "faults": [],
                },
            )
