"""004, acks=1 loss: the partition leader dies with acked writes its followers never fetched.

Incident 5 of DESIGN.md (there, a ZooKeeper session expiry moved leadership under acks=1
producers). Here a 3-broker KRaft cluster (Kafka 4.1) holds an RF=3 topic with
min.insync.replicas=1; acks=1 producers write fast, and the brokers' followers fetch with
``replica.fetch.min.bytes`` high and ``replica.fetch.wait.max.ms`` at 500 ms, so a follower
is up to half a second behind, as a busy one is. The leader of partition 0 is SIGKILLed;
the controller elects a follower, whose log lacks the last writes the old leader acked;
the old leader restarts and truncates to the new leader's log. Reading every partition back
to its end tells which acked messages were lost. An acks=all producer runs beside them as a
control: it must lose nothing. A consumer group reads the topic throughout (captured), so the
lost batches are also the acked batches no Fetch response ever returned.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses

NAME = "004-acks1-loss"
DESCRIPTION = "KRaft 4.1, RF=3 min.insync=1, acks=1 producers at 200 msg/s; partition 0's leader SIGKILLed"
KAFKA = "4.1"
TOPIC = "payments"
PARTITIONS = 3
MESSAGES = 4000
RATE = 200.0
LOSSY = ("java-4.1.1", "confluent-kafka")
CONTROL = "java-4.1.1"
CONSUMER = "java-4.1.1"
KILL_AT = 8.0
DOWN_FOR = 12.0


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    config = {
        "min.insync.replicas": 1,
        "replica.fetch.min.bytes": 1 << 20,
        "replica.fetch.wait.max.ms": 500,
        "unclean.leader.election.enable": False,
    }
    with KRaftCluster(
        KAFKA, **addresses(), brokers=3, controllers=1, base_dir=work_dir / "cluster", broker_config=config
    ) as cluster:
        cluster.start(timeout=180)
        before = cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3, configs={"min.insync.replicas": 1})
        victim = before[0]
        with LabRun(NAME, cluster, work_dir / "run") as run:
            duration = MESSAGES / RATE + 40
            for name in LOSSY:
                run.start_client(
                    name, f"{name}-acks1", TOPIC, produce=MESSAGES, rate=RATE, acks="1", duration_s=duration
                )
            run.start_client(
                CONTROL,
                f"{CONTROL}-acksall",
                TOPIC,
                produce=MESSAGES // 4,
                rate=RATE / 4,
                acks="all",
                duration_s=duration,
            )
            run.start_client(
                CONSUMER,
                f"{CONSUMER}-reader",
                TOPIC,
                consume=True,
                group="ledger",
                expect=MESSAGES * len(LOSSY) + MESSAGES // 4,
                idle_s=12,
                duration_s=duration + 15,
            )
            time.sleep(KILL_AT)
            run.mark("broker_killed", node=victim, ip=cluster.broker_ip(victim), signal="SIGKILL")
            cluster.kill(victim)
            time.sleep(DOWN_FOR)
            run.mark("broker_restarting", node=victim)
            cluster.restart(victim, timeout=90)
            run.mark("broker_started", node=victim, ip=cluster.broker_ip(victim))
            run.wait_clients()
            after = cluster.describe_leaders(TOPIC)
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "leaders_before": before,
                    "leaders_after": after,
                    "victim": victim,
                    "description": DESCRIPTION,
                },
            )
