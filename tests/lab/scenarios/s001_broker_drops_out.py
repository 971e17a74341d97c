"""001, a broker drops out: frozen for 30 s, then killed and restarted, under load.

Incident 2 of DESIGN.md: a broker silently fell out of the cluster; clients kept
connections half-open and the replica fetchers logged "disconnected before the response
was read". Here a 3-broker KRaft cluster (Kafka 4.1, three controllers) carries acks=all
producers and a consumer group; broker 2 is frozen with SIGSTOP (its sockets stay open and
silent), SIGKILLed 30 s later (the kernel then resets its connections), and restarted.
The truth says what each client sent, got acked and lost, when the broker stopped
answering and came back, and where partition leaders moved.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "001-broker-drops-out"
DESCRIPTION = "3-broker KRaft 4.1 under acks=all load; broker 2 SIGSTOPped 30 s, SIGKILLed, restarted"
KAFKA = "4.1"
TOPIC = "orders"
PARTITIONS = 6
VICTIM = 2
#: Per producer: this many messages at this rate, so producing lasts MESSAGES / RATE seconds.
MESSAGES = 900
RATE = 20.0
PRODUCERS = ("java-4.1.1", "confluent-kafka", "sarama-1.43.3")
CONSUMERS = ("java-4.1.1", "kafka-python")
#: Seconds into the load: freeze, then kill, then restart.
FREEZE_AT = 8.0
FROZEN_FOR = 30.0


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    config = {"min.insync.replicas": 2, "default.replication.factor": 3}
    with KRaftCluster(
        KAFKA, **addresses(), brokers=3, controllers=3, base_dir=work_dir / "cluster", broker_config=config
    ) as cluster:
        cluster.start(timeout=180)
        before = cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3, configs={"min.insync.replicas": 2})
        with LabRun(NAME, cluster, work_dir / "run") as run:
            total = MESSAGES * len(PRODUCERS)
            duration = MESSAGES / RATE + 40
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
            for name in CONSUMERS:
                run.start_client(
                    name,
                    f"{name}-consumer",
                    TOPIC,
                    consume=True,
                    group="orders-readers",
                    expect=total,
                    idle_s=15,
                    duration_s=duration + 10,
                )
            time.sleep(FREEZE_AT)
            run.mark("broker_paused", node=VICTIM, ip=cluster.broker_ip(VICTIM), signal="SIGSTOP")
            cluster.pause(VICTIM)
            time.sleep(FROZEN_FOR)
            run.mark("broker_killed", node=VICTIM, ip=cluster.broker_ip(VICTIM), signal="SIGKILL")
            cluster.kill(VICTIM)
            run.mark("broker_restarting", node=VICTIM)
            cluster.restart(VICTIM, timeout=90)
            run.mark("broker_started", node=VICTIM, ip=cluster.broker_ip(VICTIM))
            after = cluster.describe_leaders(TOPIC)
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "leaders_before": before,
                    "leaders_after": after,
                    "victim": VICTIM,
                    "description": DESCRIPTION,
                },
            )
