"""Job 7: partition and leader placement from the latest Metadata answers (incident 3: many
single-partition topics, all led by broker 1).

The latest state of each partition is taken from the most recent Metadata response that lists
it; the cluster's brokers from the most recent response that lists brokers.

* ``leader_skew_brokers`` (one row per broker): replicas and leaders it holds, its share of all
  leaders against a fair share (100 / brokers), topics it leads.
* ``leader_skew`` (one row per topic), kafka-manager's metrics over replicas:
  Brokers Spread % = brokers used / brokers in cluster; Brokers Skew % = brokers holding more
  than ceil(partitions x RF / brokers used) of its replicas / brokers used; Brokers Leader Skew %
  = brokers leading more than ceil(partitions / brokers used) of its partitions / brokers used.
  Integer percentages, as kafka-manager shows them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import broadcast, materialize, ordered

__all__ = ["broker_placement", "cluster_brokers", "latest_partitions", "run", "topic_skew"]

METADATA = 3


def latest_partitions(exchanges: DataFrame) -> DataFrame:
    """(topic, partition, leader, leader_epoch, replicas, isr, as_of) as last reported."""
    responses = exchanges.where(
        (F.col("api_key") == METADATA)
        & F.col("response_time").isNotNull()
        & (F.size("metadata_partitions") > 0)
    ).select("source", "response_time", "metadata_partitions")

    def listed(rows: DataFrame) -> DataFrame:
        return rows.select(
            "source", F.col("response_time").alias("as_of"), F.explode("metadata_partitions").alias("p")
        )

    # The latest time per partition with a hash aggregate over just the keys (a max_by of the
    # struct would sort every row); then only the responses holding a latest entry are
    # exploded whole, not every Metadata response again.
    latest = (
        listed(responses)
        .select(
            "source", F.coalesce(F.col("p.topic"), F.col("p.topic_id")).alias("topic"), "p.partition", "as_of"
        )
        .groupBy("source", "topic", "partition")
        .agg(F.max("as_of").alias("as_of"))
    )
    latest_times = latest.select("source", F.col("as_of").alias("response_time")).distinct()
    parts = listed(responses.join(broadcast(latest_times), ["source", "response_time"], "left_semi")).select(
        "source",
        F.coalesce(F.col("p.topic"), F.col("p.topic_id")).alias("topic"),
        F.col("p.partition").alias("partition"),
        F.col("p.leader").alias("leader"),
        F.col("p.leader_epoch").alias("leader_epoch"),
        F.coalesce(F.col("p.replicas"), F.array().cast("array<int>")).alias("replicas"),
        F.col("p.isr").alias("isr"),
        "as_of",
    )
    return parts.join(latest, ["source", "topic", "partition", "as_of"]).dropDuplicates(
        ["source", "topic", "partition"]
    )


def cluster_brokers(exchanges: DataFrame) -> DataFrame:
    """Per source: (node_id, host, port, rack) of its most recent Metadata response listing brokers."""
    listed = exchanges.where((F.col("api_key") == METADATA) & (F.size("metadata_brokers") > 0))
    latest = listed.groupBy("source").agg(F.max_by("metadata_brokers", "response_time").alias("brokers"))
    return latest.select("source", F.explode("brokers").alias("b")).select(
        "source", "b.node_id", "b.host", "b.port", "b.rack"
    )


def broker_placement(parts: DataFrame, brokers: DataFrame) -> DataFrame:
    replicas = parts.select("source", "topic", "partition", "leader", F.explode("replicas").alias("node_id"))
    per_broker = replicas.groupBy("source", "node_id").agg(
        F.count(F.lit(1)).alias("replicas"),
        F.countDistinct("topic").alias("topics"),
    )
    leaders = (
        parts.where(F.col("leader") >= 0)
        .groupBy("source", F.col("leader").alias("node_id"))
        .agg(F.count(F.lit(1)).alias("leaders"), F.countDistinct("topic").alias("topics_led"))
    )
    total_leaders = parts.where(F.col("leader") >= 0).groupBy("source").agg(F.count(F.lit(1)).alias("_total"))
    n_brokers = brokers.groupBy("source").agg(F.count(F.lit(1)).alias("_n"))
    listed = brokers.withColumn("in_cluster", F.lit(True))
    node = ["source", "node_id"]
    out = (
        listed.join(per_broker, node, "full")
        .join(leaders, node, "full")
        .join(total_leaders, "source", "left")
        .join(n_brokers, "source", "left")
    )
    return out.select(
        "source",
        "node_id",
        "host",
        "port",
        "rack",
        F.coalesce("in_cluster", F.lit(False)).alias("in_cluster"),
        F.coalesce("replicas", F.lit(0)).alias("replicas"),
        F.coalesce("leaders", F.lit(0)).alias("leaders"),
        F.coalesce("topics", F.lit(0)).alias("topics"),
        F.coalesce("topics_led", F.lit(0)).alias("topics_led"),
        F.when(F.col("_total") > 0, 100.0 * F.coalesce("leaders", F.lit(0)) / F.col("_total")).alias(
            "leader_share_pct"
        ),
        F.when(F.col("_n") > 0, 100.0 / F.col("_n")).alias("fair_share_pct"),
    )


def topic_skew(parts: DataFrame, brokers: DataFrame) -> DataFrame:
    topics = parts.groupBy("source", "topic").agg(
        F.count(F.lit(1)).alias("partitions"),
        F.max(F.size("replicas")).alias("replication_factor"),
        F.sort_array(F.collect_set(F.when(F.col("leader") >= 0, F.col("leader")))).alias("leaders"),
        F.max("as_of").alias("as_of"),
    )
    replicas = parts.select("source", "topic", "partition", "leader", F.explode("replicas").alias("node_id"))
    per_broker = replicas.groupBy("source", "topic", "node_id").agg(
        F.count(F.lit(1)).alias("n_replicas"),
        F.sum(F.when(F.col("node_id") == F.col("leader"), 1).otherwise(0)).alias("n_leaders"),
    )
    st = ["source", "topic"]
    used = per_broker.groupBy(*st).agg(F.count(F.lit(1)).alias("brokers_used"))
    judged = (
        per_broker.join(used, st)
        .join(topics.select(*st, "partitions", "replication_factor"), st)
        .withColumn("_avg", F.ceil(F.col("partitions") * F.col("replication_factor") / F.col("brokers_used")))
        .withColumn("_avg_leaders", F.ceil(F.col("partitions") / F.col("brokers_used")))
        .groupBy(*st, "brokers_used")
        .agg(
            F.sum(F.when(F.col("n_replicas") > F.col("_avg"), 1).otherwise(0)).alias("skewed"),
            F.sum(F.when(F.col("n_leaders") > F.col("_avg_leaders"), 1).otherwise(0)).alias("leader_skewed"),
        )
    )
    n_brokers = brokers.groupBy("source").agg(F.count(F.lit(1)).alias("brokers_in_cluster"))
    out = topics.join(judged, st, "left").join(n_brokers, "source", "left")
    used_n = F.coalesce(F.col("brokers_used"), F.lit(0))
    pct = lambda num, den: F.when(den > 0, F.floor(100 * num / den).cast("int"))  # noqa: E731
    return out.select(
        "source",
        "topic",
        "partitions",
        "replication_factor",
        used_n.alias("brokers_used"),
        "brokers_in_cluster",
        F.coalesce(pct(used_n, F.col("brokers_in_cluster")), F.lit(100)).alias("brokers_spread_pct"),
        F.coalesce(pct(F.col("skewed"), used_n), F.lit(0)).alias("brokers_skew_pct"),
        F.coalesce(pct(F.col("leader_skewed"), used_n), F.lit(0)).alias("brokers_leader_skew_pct"),
        "leaders",
        "as_of",
    )


def run(tables, **_):
    parts = materialize(latest_partitions(tables.exchanges))  # one row per partition, used twice
    brokers = materialize(cluster_brokers(tables.exchanges))
    return {
        "leader_skew": ordered(
            topic_skew(parts, brokers),
            F.col("brokers_leader_skew_pct").desc(),
            F.col("brokers_spread_pct"),
            "source",
            "topic",
        ),
        "leader_skew_brokers": ordered(broker_placement(parts, brokers), "source", F.col("leaders").desc()),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="leader_skew"))
