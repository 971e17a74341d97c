"""003, JBOD disk failure: one of a broker's two log dirs fails under Produce load.

Incident 4 of DESIGN.md. A 3-broker KRaft cluster (Kafka 3.9, which still serves the old
request versions sarama 1.27.0 speaks) with two log dirs per broker. Four producers write
acks=all to one RF=2 topic: sarama 1.27.0 (the Filebeat 8.16 version, which does not
refresh metadata on KAFKA_STORAGE_ERROR), sarama 1.43.3 (which does), the Java client and
librdkafka. Mid-run, the log dir of broker 1 that holds a partition it leads fails the
way Kafka's own LogDirFailureTest makes one fail: the directory is deleted and a plain file
put at its path, so the next high-watermark checkpoint fails, the broker marks the dir
offline, answers Produce for its replicas there with KAFKA_STORAGE_ERROR, and the
controller moves leadership to the other replica.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "003-jbod-disk-failure"
DESCRIPTION = (
    "KRaft 3.9, 2 log dirs per broker; broker 1's dir holding a led partition fails under acks=all load"
)
KAFKA = "3.9"
TOPIC = "events"
#: Broker 1 leads partitions 0, 1, 3 and 5 and follows 2 and 4, so its second dir surely holds one it leads.
ASSIGNMENTS = [[1, 2], [1, 3], [2, 1], [1, 2], [3, 1], [1, 3]]
VICTIM = 1
MESSAGES = 600
RATE = 20.0
PRODUCERS = ("sarama-1.27.0", "sarama-1.43.3", "java-4.1.1", "confluent-kafka")
#: Seconds into the load when the log dir fails.
FAIL_AT = 8.0


def led_dir(cluster: KRaftCluster, node: int, topic: str, leaders: dict[int, int]) -> tuple[Path, int]:
    """A log dir of *node* that holds a partition of *topic* the node leads, and that partition.

    The first log dir also holds the KRaft metadata log, and a broker that loses it halts
    (connections refused, not KAFKA_STORAGE_ERROR), so only the others are candidates.
    """
    for partition, leader in sorted(leaders.items()):
        if leader != node:
            continue
        for log_dir in cluster.log_dirs(node)[1:]:
            if (log_dir / f"{topic}-{partition}").is_dir():
                return log_dir, partition
    raise RuntimeError(f"broker {node} leads no partition of {topic} in its log dirs ({leaders})")


def fail_log_dir(log_dir: Path) -> None:
    """Replace a log dir by a plain file (TestUtils.causeLogDirFailure, from outside the broker)."""
    shutil.rmtree(log_dir)
    log_dir.touch()


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    config = {
        "min.insync.replicas": 1,
        "replica.high.watermark.checkpoint.interval.ms": 1000,
    }
    with KRaftCluster(
        KAFKA,
        **addresses(),
        brokers=3,
        controllers=1,
        base_dir=work_dir / "cluster",
        broker_config=config,
        log_dirs_per_broker=2,
    ) as cluster:
        cluster.start(timeout=180)
        before = cluster.create_topic(TOPIC, assignments=ASSIGNMENTS)
        log_dir, partition = led_dir(cluster, VICTIM, TOPIC, before)
        with LabRun(NAME, cluster, work_dir / "run") as run:
            duration = MESSAGES / RATE + 30
            for name in PRODUCERS:
                run.start_client(
                    name,
                    f"{name}-producer",
                    TOPIC,
                    produce=MESSAGES,
                    rate=RATE,
                    acks="all",
                    duration_s=duration,
                )
            time.sleep(FAIL_AT)
            run.mark(
                "log_dir_failed",
                node=VICTIM,
                ip=cluster.broker_ip(VICTIM),
                dir=log_dir.name,
                partition=partition,
            )
            fail_log_dir(log_dir)
            run.wait_clients()
            after = cluster.describe_leaders(TOPIC)
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "leaders_before": before,
                    "leaders_after": after,
                    "victim": VICTIM,
                    "failed_dir_partition": partition,
                    "description": DESCRIPTION,
                },
            )
