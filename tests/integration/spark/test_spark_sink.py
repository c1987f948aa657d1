"""The Spark sink on a local SparkSession against the suite's real brokers.

- A streaming query (``rate-micro-batch`` source, two partitions per micro-batch)
  publishes through the sink to the Kafka-protocol brokers and to the RabbitMQ cluster;
  the consumer receives exactly the rows after dedup by id.
- A batch during which the broker is killed: the tasks fail, Spark retries them with the
  same ids; after dedup the consumer has every row exactly once; lost = 0.

Each run prints its counts (expected, received, unique, lost, duplicates, unknown).
"""

from __future__ import annotations

import collections
import functools
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.spark import ContentIds, ForeachBatchSink, foreach_batch_sink, key_id
from tests.integration.spark._support import (
    consume,
    gated_rows,
    retries_seen,
    tally,
    wait_for_file,
)
from tests.support.kafka_lab import heal, kill_all

pytestmark = pytest.mark.integration

BATCHES = 4
ROWS_PER_BATCH = 2_000


def _stream(spark: Any, sink: ForeachBatchSink, checkpoint: Path) -> list[int]:
    """Run a rate-micro-batch query through ``sink`` until BATCHES batches are published;
    later micro-batches are skipped so that the expected rows are exact."""
    published: list[int] = []

    def each(df: Any, batch_id: int) -> None:
        if batch_id < BATCHES:
            sink(df, batch_id)
            published.append(batch_id)

    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "cast(value AS string) AS value",
            "concat('k', cast(value % 5 AS string)) AS key",
            "cast(timestamp AS string) AS ts",
        )
    )
    query = (
        source.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while len(published) < BATCHES and time.monotonic() < deadline:
            if query.exception() is not None:
                break
            query.awaitTermination(0.1)
        error = query.exception()
    finally:
        query.stop()
    assert error is None, f"the streaming query failed: {error}"
    assert published == list(range(BATCHES)), f"only batches {published} were published"
    return published


def _expected_stream_rows() -> collections.Counter[bytes]:
    return collections.Counter(str(v).encode() for v in range(BATCHES * ROWS_PER_BATCH))


def _report(name: str, sink: ForeachBatchSink, counts: object, seconds: float) -> None:
    for report in sink.reports:
        print(f"[{name}] {report}")
    print(f"[{name}] {counts} in {seconds:.1f}s")


def test_streaming_query_publishes_every_row_to_kafka(
    spark: Any, kafka_url: str, kafka_topic: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    # Content ids (no id_cols): the rows' key, value and headers.
    sink = foreach_batch_sink(kafka_url, kafka_topic, key_col="key", header_cols=("ts",))
    _stream(spark, sink, tmp_path / "checkpoint")
    assert sum(r.rows for r in sink.reports) == BATCHES * ROWS_PER_BATCH
    assert all(r.failed == 0 and r.confirmed == r.rows for r in sink.reports)

    expected = _expected_stream_rows()
    got = consume(
        kafka_url,
        kafka_topic,
        set(expected),
        deadline_s=60,
        group=f"g-{uuid.uuid4()}",
    )
    counts = tally(expected, got)
    _report("spark stream -> kafka", sink, counts, time.monotonic() - started)
    assert counts.lost == 0
    assert counts.wrong_rows == 0
    assert counts.unique == BATCHES * ROWS_PER_BATCH
    assert all(uuid.UUID(i).version == 8 for i in got.copies)


def test_streaming_query_publishes_every_row_to_rabbitmq(
    spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    queue = f"spark-{uuid.uuid4().hex[:8]}"
    url = rabbit_cluster.cluster_url()
    sink = foreach_batch_sink(url, queue, key_col="key", id_cols="value", declare="quorum")
    _stream(spark, sink, tmp_path / "checkpoint")
    assert all(r.failed == 0 and r.confirmed == r.rows for r in sink.reports)

    expected = _expected_stream_rows()
    # NOTE: rate-micro-batch numbers rows on, batch after batch: batch b holds
    # values b*ROWS_PER_BATCH .. (b+1)*ROWS_PER_BATCH-1.
    known = {key_id(queue, v // ROWS_PER_BATCH, [str(v)]) for v in range(BATCHES * ROWS_PER_BATCH)}
    got = consume(url, queue, set(expected), deadline_s=60, prefetch=1000)
    counts = tally(expected, got, known)
    _report("spark stream -> rabbitmq", sink, counts, time.monotonic() - started)
    assert counts.lost == 0
    assert counts.unknown == 0
    assert counts.wrong_rows == 0


# --- a broker killed during a batch -------------------------------------------------------

PARTITIONS = 2
ROWS_PER_PARTITION = 10_000
BATCH_ID = 42


def _gated_batch(spark: Any, markers: Path) -> Any:
    rows = spark.sparkContext.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(
        lambda index, _: gated_rows(str(markers), index, ROWS_PER_PARTITION)
    )
    return spark.createDataFrame(rows, "value string, key string")


def _expected_kill_rows(destination: str) -> tuple[collections.Counter[bytes], set[str]]:
    bodies: collections.Counter[bytes] = collections.Counter()
    ids: set[str] = set()
    for p in range(PARTITIONS):
        gen = ContentIds(destination, BATCH_ID, p)
        for i in range(ROWS_PER_PARTITION):
            body, key = f"row-{p}-{i}".encode(), f"k{i % 8}".encode()
            bodies[body] += 1
            ids.add(gen.next_id(body, key, {}))
    return bodies, ids


def _kill_during_batch(
    spark: Any,
    sink: ForeachBatchSink,
    markers: Path,
    kill: functools.partial[None],
    heal: functools.partial[object],
) -> None:
    """Run the batch in a thread; kill when every partition is halfway, heal once Spark
    retried a task."""
    import threading

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            sink(_gated_batch(spark, markers), BATCH_ID)
            outcome.append(None)
        except BaseException as exc:  # reported by the test below
            outcome.append(exc)

    worker = threading.Thread(target=run, name="spark-batch")
    worker.start()
    try:
        for p in range(PARTITIONS):
            assert wait_for_file(markers / f"half-{p}", 120), "the batch never got halfway"
        kill()
        (markers / "killed").touch()
        deadline = time.monotonic() + 120
        while not retries_seen(markers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert retries_seen(markers), "Spark did not retry any task"
        heal()
    finally:
        # Let every gated task go on, whatever happened above.
        (markers / "killed").touch()
        (markers / "healed").touch()
        worker.join(240)
    assert outcome == [None], f"the batch failed: {outcome}"


def test_broker_killed_during_a_batch_kafka(
    spark: Any, kafka: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    markers = tmp_path / "markers"
    markers.mkdir()
    # Every node dies: with one left, librdkafka would fail over inside the attempt
    # (partitions are replicated 3 ways) and Spark would have nothing to retry.
    sink = foreach_batch_sink(kafka.url, kafka_topic, key_col="key", confirm_timeout=5.0)
    _kill_during_batch(
        spark,
        sink,
        markers,
        functools.partial(kill_all, kafka),
        functools.partial(heal, kafka),
    )
    report = sink.last_report
    assert report is not None
    assert report.rows == report.confirmed == PARTITIONS * ROWS_PER_PARTITION
    assert report.retried_partitions >= 1

    expected, known = _expected_kill_rows(kafka_topic)
    got = consume(kafka.url, kafka_topic, set(expected), deadline_s=90, group=f"g-{uuid.uuid4()}")
    counts = tally(expected, got, known)
    print(f"[spark kill -> kafka] retries: {retries_seen(markers)}")
    _report("spark kill -> kafka", sink, counts, time.monotonic() - started)
    assert counts.lost == 0
    assert counts.unknown == 0
    assert counts.wrong_rows == 0


def test_broker_killed_during_a_batch_rabbitmq(
    spark: Any, rabbit: RabbitCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    markers = tmp_path / "markers"
    markers.mkdir()
    queue = f"spark-kill-{uuid.uuid4().hex[:8]}"
    # The queue exists on the cluster before the kill; the producer knows only node 0.
    url = rabbit.cluster_url([0])
    sink = foreach_batch_sink(url, queue, key_col="key", declare="quorum", confirm_timeout=5.0)
    _kill_during_batch(
        spark,
        sink,
        markers,
        functools.partial(rabbit.kill, 0),
        functools.partial(rabbit.restart, 0),
    )
    report = sink.last_report
    assert report is not None
    assert report.rows == report.confirmed == PARTITIONS * ROWS_PER_PARTITION
    assert report.retried_partitions >= 1

    expected, known = _expected_kill_rows(queue)
    got = consume(rabbit.cluster_url([1, 2]), queue, set(expected), deadline_s=90, prefetch=1000)
    counts = tally(expected, got, known)
    print(f"[spark kill -> rabbitmq] retries: {retries_seen(markers)}")
    _report("spark kill -> rabbitmq", sink, counts, time.monotonic() - started)
    assert counts.lost == 0
    assert counts.unknown == 0
    assert counts.wrong_rows == 0
