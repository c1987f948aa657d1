"""PySpark: publish a batch DataFrame with the msgsafe promise.

Run:  python3 examples/spark_sink.py [URL]

Needs ``pip install 'msgsafe[spark]'`` and a Java runtime (Spark starts a local JVM,
which takes a few seconds). With the default ``memory://examples-spark`` each Spark
Python worker publishes to its own in-process broker, so the run shows the report
only; pass a ``kafka://`` or ``amqp://`` URL to publish for real.

Every row becomes one message whose id is derived from (destination, batch id, id
columns): running the same batch again publishes the same ids, and consumers with
``dedup=True`` drop the repeats. A partition that cannot make every row safe fails its
task, Spark retries it, and ``sink(df, batch_id)`` raises ``SparkBatchFailed`` only when the
retries are exhausted — it never returns with a row unaccounted for.
"""

from __future__ import annotations

import sys
from typing import Any

from msgsafe.spark import SparkBatchReport, foreach_batch_sink

DEFAULT_URL = "memory://examples-spark"
ORDERS = [(f"order-{n}", f"customer-{n % 5}", n * 10) for n in range(100)]


def publish_orders(spark: Any, url: str, topic: str, batch_id: int = 20261122) -> SparkBatchReport:
    """Publish ``ORDERS`` as JSON to ``topic``, keyed by customer; returns the report."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(ORDERS, "order_id string, customer string, amount int")
    batch = df.select(
        "order_id",
        F.col("customer").alias("key"),
        F.to_json(F.struct("order_id", "customer", "amount")).alias("value"),
    ).repartition(4)
    sink = foreach_batch_sink(
        url,
        topic,
        key_col="key",  # per-customer order on Kafka
        id_cols="order_id",  # stable ids: a re-run of this batch deduplicates
    )
    # For a streaming query: df.writeStream.foreachBatch(sink).start(); here one batch.
    return sink(batch, batch_id)


def local_session() -> Any:
    """A small local SparkSession (2 cores, UI off) for running the example."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("msgsafe-example")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )


def main(url: str = DEFAULT_URL, topic: str = "orders") -> int:
    spark = local_session()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        report = publish_orders(spark, url, topic)
    finally:
        spark.stop()
    print(report)  # batch 20261122 to 'orders': 100 rows, 100 confirmed, 0 stored, 0 failed ...
    return 0 if report.failed == 0 and report.rows == len(ORDERS) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
