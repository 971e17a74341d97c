"""000, coordinator load: a consumer group's coordinator restarts over a large offsets partition.

The second half of incident 1 of DESIGN.md: after the upgrade, offsets partitions took
long to load, and consumers got NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for as long.
Kafka 2.8.2 with ZooKeeper, 3 brokers, and one ``__consumer_offsets`` partition (RF 3)
filled beforehand, outside the capture, with FILL_GROUPS x FILL_PARTITIONS offset commits
from as many groups (the log cleaner is off, so every commit stays to be replayed). A consumer
group of four clients (Java 4.1.1, librdkafka, kafka-python, sarama 1.43.3) reads a
topic a Java producer writes to. Then the group's coordinator, the leader of
``__consumer_offsets-0``, is restarted (SIGTERM, controlled shutdown, start): another
replica becomes leader and loads the partition, and once the restarted broker is back the
controller's preferred-leader check moves leadership home and it loads the partition again.
While a coordinator loads, it answers the group's requests with COORDINATOR_LOAD_IN_PROGRESS;
a broker that no longer leads the partition answers NOT_COORDINATOR.

Kafka 2.8 rather than 0.9: the clients pinned to 0.9 use its group protocol too, but the
current clients this incident is about (Java 4.x needs 2.1+, sarama's groups 0.10.2+) cannot
join a 0.9 group at all; 2.8 is the newest ZooKeeper release and logs the load time
("Finished loading offsets and group metadata from __consumer_offsets-0 in N milliseconds").

The truth: each load's duration from the brokers' logs, when the coordinator stopped and came
back, and per client its own log's lines naming NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from lab.cluster import ZkCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "000-coordinator-load"
DESCRIPTION = (
    "Kafka 2.8.2 (ZooKeeper, 3 brokers): a 4-client consumer group's coordinator restarts over a "
    "__consumer_offsets partition filled with 1M offset commits"
)
KAFKA = "2.8"
TOPIC = "orders"
PARTITIONS = 6
GROUP = "loaders"
FILL_TOPIC = "fill"
FILL_GROUPS = 10000
FILL_PARTITIONS = 100
#: Fill requests in flight at once (each commits FILL_PARTITIONS offsets for one group).
FILL_WINDOW = 500
#: franz-go is left out: its only default balancer (cooperative-sticky) is not among these
#: clients' assignors, and the coordinator refuses it with INCONSISTENT_GROUP_PROTOCOL.
CONSUMERS = ("java-4.1.1", "confluent-kafka", "kafka-python", "sarama-1.43.3")
PRODUCER = "java-4.1.1"
MESSAGES = 1400
RATE = 20.0
RUN_S = 80.0
#: Seconds into the run when the coordinator is restarted (the group is formed by then).
RESTART_AT = 12.0
BROKER_CONFIG = {
    "offsets.topic.num.partitions": 1,
    "offsets.topic.replication.factor": 3,
    # keep every commit: the cleaner would otherwise compact rolled segments of the offsets topic
    "log.cleaner.enable": False,
    # the controller moves leadership back to the preferred replica within seconds, not 5 minutes
    "auto.leader.rebalance.enable": True,
    "leader.imbalance.check.interval.seconds": 5,
    # any imbalance counts (the fill topic's single-replica partitions would dilute the ratio)
    "leader.imbalance.per.broker.percentage": 0,
}


def fill_offsets(bootstrap: str, groups: int, partitions: int, timeout: float = 600.0) -> dict[str, Any]:
    """Commit offsets for *partitions* partitions of FILL_TOPIC from each of *groups* groups
    (AdminClient.alter_consumer_group_offsets, librdkafka); returns what was written and how long it took."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    quiet = logging.getLogger("kwire.lab.fill")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": quiet})
    started = time.monotonic()
    deadline = started + timeout
    pending: list[Any] = []
    for g in range(groups):
        request = ConsumerGroupTopicPartitions(
            f"fill-{g:05d}", [TopicPartition(FILL_TOPIC, p, g + 1) for p in range(partitions)]
        )
        pending += admin.alter_consumer_group_offsets([request], request_timeout=60).values()
        if len(pending) >= FILL_WINDOW or g == groups - 1:
            for future in pending:
                future.result(timeout=max(1.0, deadline - time.monotonic()))
            pending = []
    return {
        "groups": groups,
        "partitions_per_group": partitions,
        "offset_commits": groups * partitions,
        "seconds": round(time.monotonic() - started, 1),
    }


def offsets_leader(cluster: ZkCluster) -> int:
    """The broker leading ``__consumer_offsets-0``: every group's coordinator here."""
    return cluster.wait_for_leaders("__consumer_offsets", timeout=60)[0]


def _segment_bytes(cluster: ZkCluster, node: int) -> int:
    total = 0
    for log_dir in cluster.log_dirs(node):
        part = log_dir / "__consumer_offsets-0"
        if part.is_dir():
            total += sum(f.stat().st_size for f in part.glob("*.log"))
    return total


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    with ZkCluster(
        KAFKA, **addresses("zk"), brokers=3, base_dir=work_dir / "cluster", broker_config=BROKER_CONFIG
    ) as cluster:
        cluster.start(timeout=180)
        cluster.create_topic(FILL_TOPIC, partitions=FILL_PARTITIONS, rf=1)
        cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
        fill = fill_offsets(cluster.bootstrap, FILL_GROUPS, FILL_PARTITIONS)
        coordinator = offsets_leader(cluster)
        fill["offsets_log_bytes"] = _segment_bytes(cluster, coordinator)
        with LabRun(NAME, cluster, work_dir / "run") as run:
            t0 = time.monotonic()
            run.start_client(
                PRODUCER, f"{PRODUCER}-producer", TOPIC, produce=MESSAGES, rate=RATE, duration_s=RUN_S
            )
            for name in CONSUMERS:
                run.start_client(
                    name, f"{name}-consumer", TOPIC, consume=True, group=GROUP, idle_s=RUN_S, duration_s=RUN_S
                )
            time.sleep(max(0.0, t0 + RESTART_AT - time.monotonic()))
            run.mark(
                "coordinator_stopping", node=coordinator, ip=cluster.broker_ip(coordinator), signal="SIGTERM"
            )
            cluster.stop_node(coordinator)
            run.mark("coordinator_stopped", node=coordinator)
            moved_to = offsets_leader(cluster)
            run.mark("offsets_leader", node=moved_to)
            cluster.restart(coordinator, timeout=120)
            run.mark("coordinator_started", node=coordinator, ip=cluster.broker_ip(coordinator))
            # the controller's preferred-leader check moves leadership home within seconds
            deadline = time.monotonic() + 40
            back = offsets_leader(cluster)
            while back != coordinator and time.monotonic() < deadline:
                time.sleep(0.5)
                back = offsets_leader(cluster)
            run.mark("offsets_leader", node=back)
            run.wait_clients()
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "group": GROUP,
                    "description": DESCRIPTION,
                    "broker_config": BROKER_CONFIG,
                    "fill": fill,
                    "coordinator_before": coordinator,
                    "coordinator_during_restart": moved_to,
                    "coordinator_after": back,
                },
            )
