"""Job 4: which acks each producer uses (incident 5: acks=1 lost messages on a leader change).

One row per (producer, acks): Produce requests, records, batches, bytes, the topics written,
first/last seen. ``data_loss_risk`` is true for acks 0 and 1: a write acknowledged by the
leader alone (or not at all) is lost when leadership moves before followers copy it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import attach_software, client_key, event_time, ordered

__all__ = ["producer_acks", "run"]

PRODUCE = 0


def producer_acks(exchanges: DataFrame) -> DataFrame:
    produce = exchanges.where((F.col("api_key") == PRODUCE) & (F.col("status") != "orphan_response"))
    grouped = (
        produce.select(
            client_key().alias("client_key"),
            "acks",
            "records",
            "record_batches",
            "request_size",
            "topics",
            "transactional_id",
            event_time().alias("ts"),
        )
        .groupBy("client_key", "acks")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.sum("records").alias("records"),
            F.sum("record_batches").alias("record_batches"),
            F.sum("request_size").alias("request_bytes"),
            F.array_sort(F.array_distinct(F.flatten(F.collect_set("topics")))).alias("topics"),
            F.max(F.col("transactional_id").isNotNull()).alias("transactional"),
            F.min("ts").alias("first_seen"),
            F.max("ts").alias("last_seen"),
        )
    )
    label = (
        F.when(F.col("acks") == -1, "all")
        .when(F.col("acks").isNull(), "unknown")
        .otherwise(F.col("acks").cast("string"))
    )
    risk = F.coalesce(F.col("acks").isin(0, 1), F.lit(False))
    out = grouped.select(
        "client_key",
        "acks",
        label.alias("acks_label"),
        "requests",
        "records",
        "record_batches",
        "request_bytes",
        "topics",
        "transactional",
        "first_seen",
        "last_seen",
        risk.alias("data_loss_risk"),
        F.when(F.col("acks") == 0, "no acknowledgement: lost on any broker failure")
        .when(
            F.col("acks") == 1, "leader-only acknowledgement: lost if leadership changes before replication"
        )
        .alias("risk_note"),
    )
    return attach_software(out, exchanges)


def run(tables, **_):
    return {
        "producer_acks": ordered(
            producer_acks(tables.exchanges),
            F.col("data_loss_risk").desc(),
            F.col("records").desc_nulls_last(),
        )
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="producer_acks"))
