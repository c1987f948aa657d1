"""examples/spark_sink.py: its publish function run on the suite's SparkSession (a
fresh JVM per subprocess would cost ~30 s), publishing to real Kafka brokers; the test
reads the topic back and re-runs the batch to show the repeat is deduplicated."""

from __future__ import annotations

import importlib.util
import time
from types import ModuleType
from typing import Any

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.message import new_message_id
from tests.support.commands import EXAMPLES
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_sink_example", EXAMPLES / "spark_sink.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(consumer: msgsafe.Consumer, want: int, seconds: float) -> list[str]:
    ids: list[str] = []
    deadline = time.monotonic() + seconds
    while len(ids) < want and time.monotonic() < deadline:
        for delivery in consumer.poll(max_messages=500, timeout=0.5):
            ids.append(delivery.message_id or "")
            delivery.ack()
    return ids


def test_spark_sink_publishes_and_a_rerun_deduplicates(
    spark: Any, kafka_cluster: KafkaCluster, kafka_url: str
) -> None:
    example = _example()
    topic = f"spark-{new_message_id()}"
    kafka_cluster.create_topic(topic, partitions=3)
    group = f"{topic}-check"
    start_group_at_zero(kafka_url, topic, group)

    report = example.publish_orders(spark, kafka_url, topic)
    print(report)
    assert (report.rows, report.failed) == (100, 0)
    assert report.confirmed + report.stored == 100

    with msgsafe.Consumer(kafka_url, group=group, dedup=True) as consumer:
        consumer.subscribe(topic)
        first = _read(consumer, 100, 60)
        assert len(first) == len(set(first)) == 100

        # The same batch id again (a replayed micro-batch, a re-run job): same ids,
        # all dropped by the consumer's dedup.
        again = example.publish_orders(spark, kafka_url, topic)
        assert (again.rows, again.failed) == (100, 0)
        deadline = time.monotonic() + 60
        extra: list[str] = []
        while consumer.duplicates_dropped < 100 and time.monotonic() < deadline:
            extra += _read(consumer, 1, 0.5)
        dropped = consumer.duplicates_dropped
        print(f"first run {len(first)} · re-run new {len(extra)} · dropped {dropped}")
        assert extra == []
        assert consumer.duplicates_dropped == 100
