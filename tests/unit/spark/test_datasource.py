"""``format("msgsafe")`` (msgsafe.spark.datasource) without a JVM: the options, the
writers' column selection and ids, and the reports of commit and abort.

Spark's Python workers are other processes, so the writers' ``write`` is called here
directly with Arrow record batches (outside a Spark task: partition 0, attempt 0);
tests/integration/spark runs them through real SparkSessions and a standalone cluster.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from msgsafe.errors import ConfigurationError, InvalidMessage, Rejected, TransientError
from msgsafe.spark import ContentIds, MsgsafeDataSource, datasource, key_id, read_reports
from msgsafe.spark.datasource import (
    MsgsafeStreamWriter,
    MsgsafeWriter,
    PartitionCommit,
    SinkOptions,
)
from msgsafe.testing import MemoryBroker

SCHEMA = StructType(
    [
        StructField("n", LongType()),
        StructField("key", StringType()),
        StructField("value", StringType()),
    ]
)


def source(**options: str) -> MsgsafeDataSource:
    return MsgsafeDataSource(options)


def record_batches(rows: int, size: int = 40) -> list[pa.RecordBatch]:
    """Batches in Spark's column order (n, key, value): the writer picks its columns."""
    schema = pa.schema([("n", pa.int64()), ("key", pa.string()), ("value", pa.string())])
    return [
        pa.RecordBatch.from_pylist(
            [
                {"n": i, "key": None if i % 5 == 0 else f"k{i % 3}", "value": f"v{i}"}
                for i in range(start, min(rows, start + size))
            ],
            schema=schema,
        )
        for start in range(0, rows, size)
    ]


def test_options_are_typed_and_producer_options_read_as_json() -> None:
    parsed = SinkOptions.parse(
        {
            "URL": "memory://x",
            "destination": "q",
            "key_col": "key",
            "header_cols": "a, b",
            "id_cols": "n",
            "max_in_flight": "100",
            "receipt_timeout": "2.5",
            "batch_id": "9",
            "outbox": "true",
            "producer.declare": "quorum",
            "producer.confirm_timeout": "5",
            "producer.forward": "false",
            "checkpointLocation": "/tmp/x",
            "path": "ignored",
        }
    )
    assert parsed.header_cols == ("a", "b") and parsed.id_cols == ("n",)
    assert (parsed.max_in_flight, parsed.receipt_timeout, parsed.batch_id) == (100, 2.5, 9)
    assert parsed.outbox is True
    assert dict(parsed.producer_options) == {
        "declare": "quorum",
        "confirm_timeout": 5,
        "forward": False,
    }


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"destination": "q"}, "needs .option\\('url'"),
        ({"url": "memory://x"}, "needs .option\\('destination'"),
        ({"url": "memory://x", "destination": "q", "keycol": "k"}, "unknown option.*keycol"),
        ({"url": "nope://x", "destination": "q"}, "scheme"),
        ({"url": "memory://x", "destination": "q", "batch_id": "x"}, "batch_id.*integer"),
        ({"url": "memory://x", "destination": "q", "id_cols": " , "}, "id_cols"),
        ({"url": "memory://x", "destination": "q", "max_in_flight": "0"}, "max_in_flight"),
    ],
)
def test_bad_options_are_refused_before_spark_plans(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SinkOptions.parse(options)


def test_options_repr_hides_the_url() -> None:
    parsed = SinkOptions.parse({"url": "amqp://user:secret@h/%2F", "destination": "q"})
    assert "secret" not in repr(parsed)


def test_the_source_is_named_msgsafe_and_only_appends() -> None:
    assert MsgsafeDataSource.name() == "msgsafe"
    ds = source(url="memory://x", destination="q")
    with pytest.raises(ConfigurationError, match="only appends"):
        ds.writer(SCHEMA, True)
    with pytest.raises(ConfigurationError, match="only appends"):
        ds.streamWriter(SCHEMA, True)
    with pytest.raises(InvalidMessage, match="value_col 'n'"):
        source(url="memory://x", destination="q", value_col="n").writer(SCHEMA, False)


def test_batch_write_publishes_the_sinks_content_ids(broker: MemoryBroker, tmp_path: Path) -> None:
    writer = source(
        url=f"memory://{broker.name}",
        destination="q",
        key_col="key",
        batch_id="5",
        report_dir=str(tmp_path),
    ).writer(SCHEMA, False)
    assert isinstance(writer, MsgsafeWriter) and writer.batch_id == 5
    # Spark pickles the writer to every task: the copy publishes the same ids.
    writer = pickle.loads(pickle.dumps(writer))
    message = writer.write(iter(record_batches(100)))
    assert isinstance(message, PartitionCommit)
    assert (message.batch_id, message.result.rows, message.result.confirmed) == (5, 100, 100)

    gen = ContentIds("q", 5, 0)
    expected = [
        gen.next_id(f"v{i}".encode(), None if i % 5 == 0 else f"k{i % 3}".encode(), {})
        for i in range(100)
    ]
    sent = broker.messages("q")
    assert [m.message_id for m in sent] == expected
    assert [m.body for m in sent] == [f"v{i}".encode() for i in range(100)]

    writer.commit([message])
    [(outcome, report)] = read_reports(tmp_path)
    assert outcome == "committed"
    assert (report.batch_id, report.rows, report.confirmed, report.partitions) == (5, 100, 100, 1)


def test_a_batch_write_without_batch_id_picks_one_per_write(broker: MemoryBroker) -> None:
    first = source(url=f"memory://{broker.name}", destination="q").writer(SCHEMA, False)
    assert first.batch_id > 1_700_000_000_000  # milliseconds since the epoch
    assert pickle.loads(pickle.dumps(first)).batch_id == first.batch_id


def test_id_cols_give_key_ids(broker: MemoryBroker) -> None:
    writer = source(url=f"memory://{broker.name}", destination="q", id_cols="n", batch_id="2")
    writer.writer(SCHEMA, False).write(iter(record_batches(30)))
    assert broker.ids("q") == [key_id("q", 2, [i]) for i in range(30)]


def test_a_failed_partition_raises_and_abort_reports_the_others(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    writer = source(
        url=f"memory://{broker.name}", destination="q", batch_id="4", report_dir=str(tmp_path)
    ).writer(SCHEMA, False)
    done = writer.write(iter(record_batches(20)))
    broker.reject_next(1)
    with pytest.raises(Rejected):
        writer.write(iter(record_batches(20)))
    writer.abort([done, None])
    [(outcome, report)] = read_reports(tmp_path)
    assert outcome == "aborted" and (report.batch_id, report.rows) == (4, 20)


def test_the_stream_writer_takes_the_micro_batch_id_from_spark(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    writer = source(
        url=f"memory://{broker.name}", destination="q", id_cols="n", report_dir=str(tmp_path)
    ).streamWriter(SCHEMA, False)
    assert isinstance(writer, MsgsafeStreamWriter)
    # Outside a streaming task there is no micro-batch id: nothing is sent.
    with pytest.raises(ConfigurationError, match="no micro-batch"):
        writer.write(iter(record_batches(3)))
    assert broker.ids("q") == []
    writer.commit([], 12)
    [(outcome, report)] = read_reports(tmp_path)
    assert (outcome, report.batch_id, report.rows) == ("committed", 12, 0)


def test_a_short_outage_is_absorbed_inside_the_task(broker: MemoryBroker) -> None:
    writer = source(
        url=f"memory://{broker.name}", destination="q", id_cols="n", batch_id="6"
    ).writer(SCHEMA, False)
    # The broker takes one chunk and the producer never hears back (a connection lost
    # after the broker acted): the task sends the partition again, same ids.
    broker.drop_after_confirm(1)
    message = writer.write(iter(record_batches(100)))
    assert (message.result.rows, message.result.confirmed) == (100, 100)
    ids = broker.ids("q")
    assert len(ids) > 100, "the outage made no duplicate"
    assert set(ids) == {key_id("q", 6, [i]) for i in range(100)}


def test_an_outage_longer_than_receipt_timeout_fails_the_task(broker: MemoryBroker) -> None:
    writer = source(
        url=f"memory://{broker.name}",
        destination="q",
        batch_id="6",
        receipt_timeout="1.2",
        **{"producer.confirm_timeout": "0.2"},
    ).writer(SCHEMA, False)
    broker.down()
    with pytest.raises(TransientError) as caught:
        writer.write(iter(record_batches(10)))
    assert any("tries within receipt_timeout=1.2s" in note for note in caught.value.__notes__)


def _write_as(monkeypatch: pytest.MonkeyPatch, writer: MsgsafeWriter, partition: int) -> Any:
    """``writer.write`` as the task of ``partition`` (attempt 0) would run it."""
    monkeypatch.setattr(datasource, "_task", lambda: (partition, 0, None))
    return writer.write(iter(record_batches(2_000, size=500)))


def _reporting_writer(broker: MemoryBroker, reports: Path, batch_id: int) -> MsgsafeWriter:
    return source(
        url=f"memory://{broker.name}",
        destination="q",
        batch_id=str(batch_id),
        report_dir=str(reports),
    ).writer(SCHEMA, False)


def _aborted(reports: Path, batch_id: int) -> tuple[Any, dict[str, Any]]:
    """The one report in ``reports`` (which must be the abort of ``batch_id``) and its
    file's record."""
    [(outcome, report)] = read_reports(reports)
    assert outcome == "aborted" and report.batch_id == batch_id
    record = json.loads((reports / f"batch-{batch_id}.aborted.json").read_text())
    return report, record


def test_abort_counts_a_partition_whose_message_never_reached_the_driver(
    broker: MemoryBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The story: 4,000 rows in two partitions; both tasks had every row confirmed, but
    # the write was aborted (its driver killed mid-batch) before partition 1's commit
    # message reached it, so Spark called abort([message of partition 0, None]). The
    # report said 2,000 confirmed and 1 partition failed while the topic held 4,000.
    writer = _reporting_writer(broker, tmp_path, 43)
    first = _write_as(monkeypatch, writer, 0)
    _write_as(monkeypatch, writer, 1)  # its message is lost with the driver
    assert len(broker.messages("q")) == 4_000

    writer.abort([first, None])
    report, record = _aborted(tmp_path, 43)
    assert (report.rows, report.confirmed, report.partitions) == (4_000, 4_000, 2)
    assert report.unknown_partitions == 0 and report.exact
    assert (record["failed_partitions"], record["confirmed_exact"]) == (0, True)


def test_abort_says_unknown_for_a_partition_nobody_recorded(
    broker: MemoryBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Partition 1's task published its rows but was killed before it finished: nothing
    # tells the driver what the broker confirmed of it. The report must not pass off
    # partition 0's 2,000 as the batch's exact count.
    writer = _reporting_writer(broker, tmp_path, 44)
    first = _write_as(monkeypatch, writer, 0)
    writer.abort([first, None])
    report, record = _aborted(tmp_path, 44)
    assert (report.confirmed, report.partitions, report.unknown_partitions) == (2_000, 1, 1)
    assert not report.exact and "unknown for 1 more partition" in str(report)
    assert (record["failed_partitions"], record["confirmed_exact"]) == (1, False)
    # Without report_dir nothing is recorded: every missing message is unknown too.
    assert datasource.partition_outcomes([first, None, None], 44, None)[1] == 2


def test_commit_drops_the_partition_records(
    broker: MemoryBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _reporting_writer(broker, tmp_path, 45)
    messages = [_write_as(monkeypatch, writer, p) for p in (0, 1)]
    assert sorted(p.name for p in (tmp_path / "batch-45.partitions").iterdir()) == [
        "0.json",
        "1.json",
    ]
    writer.commit(messages)
    assert [p.name for p in tmp_path.iterdir()] == ["batch-45.committed.json"]
