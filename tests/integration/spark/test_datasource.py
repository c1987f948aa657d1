"""``format("msgsafe")`` on the suite's local SparkSession against real brokers.

- ``df.write.format("msgsafe")`` to Kafka (content ids), to RabbitMQ (``id_cols``) and
  over AMQP 1.0 to a RabbitMQ quorum queue:
  every row arrives with the id the sink's id functions give for the write's
  ``batch_id``; ``commit`` writes the batch's report into ``report_dir``.
- ``df.writeStream.format("msgsafe")`` over a finite stream, stopped and started again
  from its checkpoint: the second run continues with the next micro-batch id, and every
  row arrives once, with the id of its micro-batch.
- A task that cannot publish (the broker refuses the destination) fails the write with
  the msgsafe error in the driver's exception, and ``abort`` reports the batch.
- A short outage (the one node a write knows, SIGKILLed before its tasks start and
  restarted while they run) is absorbed inside each task: Spark retries nothing, every
  row arrives (as Spark's Kafka sink absorbs one through its producer's retries).

The executor-loss and driver-restart stories run on a standalone cluster
(``test_datasource_cluster.py``).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.spark import ContentIds, MsgsafeDataSource, key_id, read_reports
from tests.integration.spark._support import consume, marked_rows, tally
from tests.support.rabbit_queues import declare_quorum

pytestmark = pytest.mark.integration

ROWS = 3_000
PARTITIONS = 3
#: Tasks that run at once on the suite's local session (local[2]).
TASKS = 2


@pytest.fixture(scope="module")
def ds_spark(spark: Any) -> Any:
    """The session's SparkSession with the data source registered."""
    spark.dataSource.register(MsgsafeDataSource)
    return spark


def _frame(spark: Any, rows: int, partitions: int, offset: int = 0) -> Any:
    return spark.range(offset, offset + rows, numPartitions=partitions).selectExpr(
        "cast(id AS string) AS value", "concat('k', cast(id % 7 AS string)) AS key", "id"
    )


def _content_ids(df: Any, destination: str, batch_id: int) -> set[str]:
    """The ids the sink gives the rows of ``df`` (content ids: per partition)."""
    ids: set[str] = set()
    for index, rows in enumerate(df.select("value", "key").rdd.glom().collect()):
        gen = ContentIds(destination, batch_id, index)
        ids.update(gen.next_id(r.value.encode(), r.key.encode(), {}) for r in rows)
    return ids


def test_batch_write_to_kafka_with_content_ids_and_a_report(
    ds_spark: Any, kafka_url: str, kafka_topic: str, tmp_path: Path
) -> None:
    df = _frame(ds_spark, ROWS, PARTITIONS)
    reports = tmp_path / "reports"
    (
        df.select("value", "key")
        .write.format("msgsafe")
        .mode("append")
        .option("url", kafka_url)
        .option("destination", kafka_topic)
        .option("key_col", "key")
        .option("batch_id", 7)
        .option("report_dir", str(reports))
        .save()
    )
    (outcome, report), *more = read_reports(reports)
    print(f"[datasource batch -> kafka] {outcome}: {report}")
    assert not more and outcome == "committed"
    assert report.batch_id == 7 and report.rows == report.confirmed == ROWS
    assert report.partitions == PARTITIONS

    expected = collections.Counter(str(i).encode() for i in range(ROWS))
    known = _content_ids(df, kafka_topic, 7)
    got = consume(kafka_url, kafka_topic, set(expected), deadline_s=60, group=f"g-{uuid.uuid4()}")
    counts = tally(expected, got, known)
    print(f"[datasource batch -> kafka] {counts}")
    assert counts.lost == 0 and counts.unknown == 0 and counts.wrong_rows == 0
    assert counts.duplicates == 0


def test_batch_write_to_rabbitmq_with_id_cols(
    ds_spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"ds-{uuid.uuid4().hex[:8]}"
    url = rabbit_cluster.cluster_url()
    df = _frame(ds_spark, ROWS, PARTITIONS)
    (
        df.write.format("msgsafe")
        .mode("append")
        .option("url", url)
        .option("destination", queue)
        .option("id_cols", "id")
        .option("batch_id", 3)
        .option("producer.declare", "quorum")
        .option("report_dir", str(tmp_path))
        .save()
    )
    [(outcome, report)] = read_reports(tmp_path)
    assert outcome == "committed" and report.rows == report.confirmed == ROWS

    expected = collections.Counter(str(i).encode() for i in range(ROWS))
    known = {key_id(queue, 3, [i]) for i in range(ROWS)}
    got = consume(url, queue, set(expected), deadline_s=60, prefetch=1000)
    counts = tally(expected, got, known)
    print(f"[datasource batch -> rabbitmq] {counts}")
    assert counts.lost == 0 and counts.unknown == 0 and counts.wrong_rows == 0


def _run_stream(spark: Any, source: Path, checkpoint: Path, reports: Path, **options: str) -> int:
    """Run a query over the JSON files in ``source`` until it has processed them all
    (``availableNow``); return how many micro-batches this run committed."""
    before = len(read_reports(reports)) if reports.exists() else 0
    stream = (
        spark.readStream.schema("value string, key string, id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("msgsafe")
        .option("checkpointLocation", str(checkpoint))
        .option("report_dir", str(reports))
    )
    for name, value in options.items():
        stream = stream.option(name, value)
    query = stream.trigger(availableNow=True).start()
    finished = query.awaitTermination(180)
    assert finished, "the availableNow query did not finish"
    assert query.exception() is None, f"the streaming query failed: {query.exception()}"
    return len(read_reports(reports)) - before


def test_stream_restarted_from_its_checkpoint_continues_with_the_next_batch_id(
    ds_spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    queue = f"ds-stream-{uuid.uuid4().hex[:8]}"
    url = rabbit_cluster.cluster_url()
    source, checkpoint, reports = tmp_path / "in", tmp_path / "chk", tmp_path / "reports"
    per_file = 500

    def add_files(first: int, count: int) -> None:
        for f in range(first, first + count):
            _frame(ds_spark, per_file, 1, offset=f * per_file).coalesce(1).write.json(
                str(source / f"part-{f}")
            )

    options = {"url": url, "destination": queue, "id_cols": "id", "producer.declare": "quorum"}
    add_files(0, 2)
    source_glob = source / "*"
    assert _run_stream(ds_spark, source_glob, checkpoint, reports, **options) == 2
    add_files(2, 2)
    assert _run_stream(ds_spark, source_glob, checkpoint, reports, **options) == 2

    done = read_reports(reports)
    assert [r.batch_id for _, r in done] == [0, 1, 2, 3]
    assert all(o == "committed" and r.rows == r.confirmed == per_file for o, r in done)

    # File f is micro-batch f (one file per trigger, in name order).
    total = 4 * per_file
    known = {key_id(queue, i // per_file, [i]) for i in range(total)}
    expected = collections.Counter(str(i).encode() for i in range(total))
    got = consume(url, queue, set(expected), deadline_s=60, prefetch=1000)
    counts = tally(expected, got, known)
    print(f"[datasource stream -> rabbitmq] {counts} in {time.monotonic() - started:.1f}s")
    assert counts.lost == 0 and counts.unknown == 0 and counts.wrong_rows == 0
    assert counts.duplicates == 0


def test_a_failed_write_names_the_msgsafe_error_and_is_aborted(
    ds_spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    # A queue that does not exist (the producer declares none unless told): every task
    # is refused (a permanent error), Spark's retries too, and the write fails.
    missing = f"ds-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception) as caught:
        (
            _frame(ds_spark, 10, 1)
            .write.format("msgsafe")
            .mode("append")
            .option("url", rabbit_cluster.cluster_url())
            .option("destination", missing)
            .option("batch_id", 1)
            .option("report_dir", str(tmp_path))
            .save()
        )
    text = str(caught.value)
    assert "msgsafe.errors." in text, text[-2000:]
    [(outcome, report)] = read_reports(tmp_path)
    assert outcome == "aborted" and report.batch_id == 1 and report.rows == 0


def test_a_node_restart_during_a_write_is_absorbed_inside_the_task(
    ds_spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """The only node the write knows is SIGKILLed while its tasks run, before they
    produce a row, and restarted: each task waits for it (within ``receipt_timeout``)
    and publishes, Spark retries nothing, and every row arrives."""
    # NOTE: as many partitions as the session has cores: every task must run at once.
    queue = declare_quorum(rabbit_cluster.node_url(0), f"ds-restart-{uuid.uuid4().hex[:8]}")
    markers = tmp_path / "markers"
    markers.mkdir()
    reports = tmp_path / "reports"
    rows = ds_spark.sparkContext.parallelize(range(TASKS), TASKS)
    df = ds_spark.createDataFrame(
        rows.mapPartitionsWithIndex(lambda index, _: marked_rows(str(markers), index, ROWS)),
        "value string, key string, id long",
    )
    fault: list[BaseException | None] = []

    def kill_then_restart() -> None:
        # NOTE: the fault runs in this thread and the write in the test's own: a write
        # from another Python thread runs on a JVM thread that does not see the
        # session's registered data sources.
        try:
            started = [markers / f"started-{p}-0" for p in range(TASKS)]
            deadline = time.monotonic() + 120
            while not all(m.exists() for m in started):
                if time.monotonic() >= deadline:
                    raise AssertionError("a task never started")
                time.sleep(0.02)
            rabbit_cluster.kill(0)
            # The rows go while node 0 is down; its restart takes seconds, their publish not.
            (markers / "go").touch()
            rabbit_cluster.restart(0)
            fault.append(None)
        except BaseException as exc:  # reported below
            fault.append(exc)
        finally:
            (markers / "go").touch()

    faulting = threading.Thread(target=kill_then_restart, name="ds-fault")
    faulting.start()
    try:
        (
            df.write.format("msgsafe")
            .mode("append")
            .option("url", rabbit_cluster.cluster_url([0]))
            .option("destination", queue)
            .option("id_cols", "id")
            .option("batch_id", 5)
            .option("receipt_timeout", 90)
            .option("report_dir", str(reports))
            .save()
        )
    finally:
        faulting.join(240)
        if not rabbit_cluster.is_running(0):
            rabbit_cluster.restart(0)
    assert fault == [None], f"the kill and restart failed: {fault}"
    [(state, report)] = read_reports(reports)
    assert state == "committed" and report.rows == report.confirmed == TASKS * ROWS
    assert report.retried_partitions == 0, "Spark ran a task again: the outage was not absorbed"
    assert sorted(m.name for m in markers.iterdir()) == [
        "go",
        *(f"started-{p}-0" for p in range(TASKS)),
    ]

    total = TASKS * ROWS
    expected = collections.Counter(str(i).encode() for i in range(total))
    known = {key_id(queue, 5, [i]) for i in range(total)}
    got = consume(rabbit_cluster.cluster_url(), queue, set(expected), deadline_s=60, prefetch=1000)
    counts = tally(expected, got, known)
    print(f"[datasource, node restart -> rabbitmq] {counts}")
    assert counts.lost == 0 and counts.unknown == 0 and counts.wrong_rows == 0


def test_unknown_options_and_overwrite_are_refused(ds_spark: Any, tmp_path: Path) -> None:
    df = _frame(ds_spark, 1, 1)
    with pytest.raises(Exception, match="unknown option"):
        (
            df.write.format("msgsafe")
            .mode("append")
            .option("url", "kafka://127.0.0.1:1")
            .option("destination", "t")
            .option("key_column", "key")
            .save()
        )
    with pytest.raises(Exception, match="only appends"):
        (
            df.write.format("msgsafe")
            .mode("overwrite")
            .option("url", "kafka://127.0.0.1:1")
            .option("destination", "t")
            .save()
        )


def test_batch_write_over_amqp10_to_a_rabbitmq_quorum_queue(
    ds_spark: Any, rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    import pika

    queue = f"ds-amqp10-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(rabbit_cluster.node_url(0)))
    try:
        connection.channel().queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
    finally:
        connection.close()
    address = f"/amq/queue/{queue}"
    url = rabbit_cluster.amqp10_url(0)
    df = _frame(ds_spark, ROWS, PARTITIONS)
    (
        df.write.format("msgsafe")
        .mode("append")
        .option("url", url)
        .option("destination", address)
        .option("key_col", "key")
        .option("id_cols", "id")
        .option("batch_id", 5)
        .option("report_dir", str(tmp_path))
        .save()
    )
    [(outcome, report)] = read_reports(tmp_path)
    assert outcome == "committed" and report.rows == report.confirmed == ROWS

    expected = collections.Counter(str(i).encode() for i in range(ROWS))
    known = {key_id(address, 5, [i]) for i in range(ROWS)}
    got = consume(url, address, set(expected), deadline_s=60)
    counts = tally(expected, got, known)
    print(f"[datasource batch -> amqp10] {counts}")
    assert counts.lost == 0 and counts.unknown == 0 and counts.wrong_rows == 0
