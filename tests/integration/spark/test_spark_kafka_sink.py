"""Differential: one micro-batch written twice (a replayed batch, as after a driver
restart between the write and the checkpoint commit) through Spark's own Kafka sink
(``df.write.format("kafka")``, spark-sql-kafka-0-10 from Maven Central, ``acks=all``)
and through msgsafe's ``foreach_batch_sink``, on the session's Apache Kafka.

What a consumer observes is counted: Spark's sink writes every row twice with nothing
to tell the copies apart; msgsafe's replay repeats the rows' message ids, so a
``Consumer(dedup=True)`` hands each row to the application once. Lost 0 on both.
"""

from __future__ import annotations

import collections
import time
import uuid
from typing import Any

import pytest

from msgsafe import Consumer
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.spark import foreach_batch_sink
from tests.integration.spark._support import consume
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration

ROWS = 2_000
BATCH_ID = 7


def _batch(spark: Any) -> Any:
    rows = [(f"row-{i}", f"k{i % 8}") for i in range(ROWS)]
    return spark.createDataFrame(rows, ["value", "key"]).repartition(2).cache()


def _dedup_read(url: str, topic: str, expected: set[bytes]) -> collections.Counter[bytes]:
    """Bodies the application sees through ``Consumer(dedup=True)``, with counts."""
    seen: collections.Counter[bytes] = collections.Counter()
    group = f"dedup-{uuid.uuid4().hex[:8]}"
    start_group_at_zero(url, topic, group)
    got = consume(url, topic, expected, deadline_s=90, group=group, dedup=True)
    for message_id, copies in got.copies.items():
        seen[got.bodies[message_id]] += copies
    return seen


def _spark_sink_copies(url: str, topic: str, expected: set[bytes]) -> collections.Counter[bytes]:
    """Records per body in ``topic`` (Spark's sink writes no msgsafe id: read raw)."""
    group = f"raw-{uuid.uuid4().hex[:8]}"
    start_group_at_zero(url, topic, group)
    copies: collections.Counter[bytes] = collections.Counter()
    missing_twice = set(expected)
    with Consumer(url, group=group) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 90
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = consumer.poll(max_messages=1000, timeout=0.25)
            for delivery in batch:
                copies[delivery.body] += 1
                if copies[delivery.body] >= 2:
                    missing_twice.discard(delivery.body)
                delivery.ack()
            if missing_twice:
                continue
            if batch or quiet_until is None:
                quiet_until = time.monotonic() + 1.0
            elif time.monotonic() >= quiet_until:
                break
    return copies


def test_a_replayed_batch_duplicates_rows_through_sparks_sink_and_not_through_msgsafes(
    spark: Any, kafka_cluster: KafkaCluster
) -> None:
    df = _batch(spark)
    expected = {f"row-{i}".encode() for i in range(ROWS)}
    spark_topic = f"spark-sink-{uuid.uuid4().hex[:8]}"
    msgsafe_topic = f"msgsafe-sink-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(spark_topic, partitions=3)
    kafka_cluster.create_topic(msgsafe_topic, partitions=3)

    for _ in range(2):  # the batch, then its replay
        (
            df.write.format("kafka")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap)
            .option("kafka.acks", "all")
            .option("kafka.enable.idempotence", "true")
            .option("topic", spark_topic)
            .save()
        )
    sink = foreach_batch_sink(kafka_cluster.url, msgsafe_topic, key_col="key")
    first, replay = sink(df, BATCH_ID), sink(df, BATCH_ID)

    spark_copies = _spark_sink_copies(kafka_cluster.url, spark_topic, expected)
    raw = consume(kafka_cluster.url, msgsafe_topic, expected, deadline_s=90)
    deduped = _dedup_read(kafka_cluster.url, msgsafe_topic, expected)
    spark_dups = sum(n - 1 for n in spark_copies.values())
    print(
        f"[spark sink] rows={ROWS} written twice: records={sum(spark_copies.values())} "
        f"distinct={len(spark_copies)} duplicates={spark_dups} "
        f"lost={len(expected - set(spark_copies))}; "
        f"[msgsafe sink] records={sum(raw.copies.values())} ids={len(raw.copies)} "
        f"duplicates={raw.duplicates} (same ids), after dedup={sum(deduped.values())} "
        f"lost={len(expected - set(deduped))}; reports {first} / {replay}"
    )
    # Spark's sink: every row twice, nothing tells a copy from a new row.
    assert set(spark_copies) == expected
    assert spark_copies == collections.Counter(dict.fromkeys(expected, 2))
    # msgsafe's sink: the replay repeats the same ids ...
    assert len(raw.copies) == ROWS and raw.duplicates == ROWS and not raw.conflicts
    assert set(raw.bodies.values()) == expected
    # ... so a dedup consumer hands each row over once.
    assert deduped == collections.Counter(dict.fromkeys(expected, 1))
