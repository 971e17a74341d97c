"""Job 8: every client seen, with a protocol fingerprint.

One row per client (client_id, client_ip): software name/version when it announced them
(ApiVersions v3+), client ports and brokers used, first/last seen, requests, and
``fingerprint``: the highest version it used of each API, as ``key:version`` sorted by key
(e.g. ``0:9,1:13,3:12,18:3``). Clients of one library (and broker version) share it, so
``same_fingerprint_clients`` and ``fingerprint_software`` (the names announced by clients with
that fingerprint) suggest what a client that announced nothing is running.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import attach_software, client_key, event_time, ordered

__all__ = ["client_inventory", "run"]


def client_inventory(exchanges: DataFrame) -> DataFrame:
    req = exchanges.where(F.col("status") != "orphan_response").select(
        client_key().alias("client_key"),
        "client_port",
        "broker_ip",
        "broker_port",
        "api_key",
        "api_version",
        "client_software_name",
        event_time().alias("ts"),
    )
    per_api = (
        req.where(F.col("api_key").isNotNull() & F.col("api_version").isNotNull())
        .groupBy("client_key", "api_key")
        .agg(F.max("api_version").alias("v"))
        .groupBy("client_key")
        .agg(F.sort_array(F.collect_list(F.struct(F.col("api_key").cast("int").alias("k"), "v"))).alias("kv"))
        .select(
            "client_key",
            F.array_join(
                F.transform(
                    "kv", lambda x: F.concat(x["k"].cast("string"), F.lit(":"), x["v"].cast("string"))
                ),
                ",",
            ).alias("fingerprint"),
        )
    )
    basics = req.groupBy("client_key").agg(
        F.min("ts").alias("first_seen"),
        F.max("ts").alias("last_seen"),
        F.count(F.lit(1)).alias("requests"),
        F.countDistinct("client_port").alias("client_ports"),
        F.array_sort(
            F.collect_set(F.concat(F.col("broker_ip"), F.lit(":"), F.col("broker_port").cast("string")))
        ).alias("brokers"),
    )
    out = basics.join(per_api, "client_key", "left").withColumn(
        "fingerprint_id", F.substring(F.sha2(F.coalesce("fingerprint", F.lit("")), 256), 1, 12)
    )
    out = attach_software(out, exchanges, keep_key=True)
    groups = out.groupBy("fingerprint_id").agg(
        F.count(F.lit(1)).alias("same_fingerprint_clients"),
        F.array_join(
            F.array_sort(
                F.collect_set(
                    F.when(
                        F.col("client_software_name").isNotNull(),
                        F.concat_ws(" ", "client_software_name", "client_software_version"),
                    )
                )
            ),
            "; ",
        ).alias("fingerprint_software"),
    )
    out = out.join(groups, "fingerprint_id", "left").withColumn(
        "fingerprint_software", F.when(F.col("fingerprint_software") != "", F.col("fingerprint_software"))
    )
    return out.select(
        "source",
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
        "client_ports",
        "brokers",
        "first_seen",
        "last_seen",
        "requests",
        "fingerprint",
        "fingerprint_id",
        "same_fingerprint_clients",
        "fingerprint_software",
    )


def run(tables, **_):
    return {
        "client_inventory": ordered(
            client_inventory(tables.exchanges), "source", "fingerprint_id", "client_id", "client_ip"
        )
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="client_inventory"))
