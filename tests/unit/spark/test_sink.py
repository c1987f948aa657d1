"""The Spark sink without Spark: id derivation, schema checks, one partition published
through memory:// with faults, the per-process producer cache and the batch report.

memory:// brokers live in one process and Spark's Python workers are other processes,
so these tests call the executor-side function directly; tests/integration/spark runs
the sink through a real SparkSession against real brokers.
"""

from __future__ import annotations

import datetime
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from msgsafe.errors import (
    ConfigurationError,
    ConnectionLost,
    InvalidMessage,
    Refused,
    Rejected,
)
from msgsafe.spark import (
    ContentIds,
    PartitionPlan,
    PartitionResult,
    SparkBatchFailed,
    SparkBatchReport,
    foreach_batch_sink,
    key_id,
    producers,
    publish_partition,
)
from msgsafe.testing import MemoryBroker


def plan_for(broker: MemoryBroker, **changes: object) -> PartitionPlan:
    fields: dict[str, object] = {
        "url": f"memory://{broker.name}",
        "target": f"memory://{broker.name}",
        "destination": "q",
        "value_index": 0,
        "value_is_text": True,
        "key_index": 1,
        "key_is_text": True,
        "headers": (("h", 2),),
    }
    fields.update(changes)
    return PartitionPlan(**fields)  # type: ignore[arg-type]


def rows(n: int) -> list[tuple[object, ...]]:
    return [(f"v{i}", f"k{i % 3}", f"h{i}") for i in range(n)]


# --- ids ---------------------------------------------------------------------------------


def test_content_ids_are_uuid8_and_repeat_on_replay() -> None:
    def ids() -> list[str]:
        gen = ContentIds("q", 7, 0)
        return [gen.next_id(f"v{i}".encode(), b"k", {"a": "1"}) for i in range(100)]

    first, again = ids(), ids()
    assert first == again
    assert len(set(first)) == 100
    assert all(uuid.UUID(i).version == 8 for i in first)


def test_identical_rows_get_distinct_ids_by_rank_independent_of_other_rows() -> None:
    a = ContentIds("q", 1, 0)
    same = [a.next_id(b"x", None, {}) for _ in range(3)]
    assert len(set(same)) == 3
    # Other rows in between do not change the rank of equal rows.
    b = ContentIds("q", 1, 0)
    mixed = [b.next_id(b"x", None, {}), b.next_id(b"y", None, {}), b.next_id(b"x", None, {})]
    b.next_id(b"z", None, {})
    assert [mixed[0], mixed[2], b.next_id(b"x", None, {})] == same


@pytest.mark.parametrize(
    "change",
    [
        ("q2", 7, 0, b"v", b"k", {}),
        ("q", 8, 0, b"v", b"k", {}),
        ("q", 7, 1, b"v", b"k", {}),
        ("q", 7, 0, b"w", b"k", {}),
        ("q", 7, 0, b"v", None, {}),
        ("q", 7, 0, b"v", b"k", {"h": "1"}),
    ],
)
def test_every_part_of_the_content_changes_the_id(change: tuple[object, ...]) -> None:
    base = ContentIds("q", 7, 0).next_id(b"v", b"k", {})
    dest, batch, part, value, key, headers = change
    other = ContentIds(dest, batch, part).next_id(value, key, headers)  # type: ignore[arg-type]
    assert other != base


def test_key_ids_depend_on_batch_destination_and_typed_values() -> None:
    base = key_id("q", 1, [1, "a"])
    assert key_id("q", 1, [1, "a"]) == base
    assert uuid.UUID(base).version == 8
    assert key_id("q", 2, [1, "a"]) != base
    assert key_id("r", 1, [1, "a"]) != base
    assert key_id("q", 1, ["1", "a"]) != base  # typed: 1 is not "1"
    assert key_id("q", 1, ["1a", ""]) != key_id("q", 1, ["1", "a"])  # length-prefixed
    stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert key_id("q", 1, [stamp]) == key_id("q", 1, [stamp])
    assert key_id("q", 1, [None]) != key_id("q", 1, ["N"])


# --- one partition ---------------------------------------------------------------------------


def test_partition_is_published_with_derived_ids_and_counted(broker: MemoryBroker) -> None:
    plan = plan_for(broker)
    result = publish_partition(plan, 3, 0, rows(50))
    assert (result.rows, result.confirmed, result.stored) == (50, 50, 0)
    messages = broker.messages("q")
    assert [m.body for m in messages] == [f"v{i}".encode() for i in range(50)]
    assert messages[4].key == b"k1" and messages[4].headers["h"] == "h4"
    gen = ContentIds("q", 3, 0)
    assert [m.message_id for m in messages] == [
        gen.next_id(f"v{i}".encode(), f"k{i % 3}".encode(), {"h": f"h{i}"}) for i in range(50)
    ]
    # A replay publishes the very same ids.
    publish_partition(plan, 3, 0, rows(50))
    assert broker.ids("q")[50:] == broker.ids("q")[:50]


def test_an_empty_partition_opens_no_producer(broker: MemoryBroker) -> None:
    plan = plan_for(broker, url="memory://never-opened")
    result = publish_partition(plan, 0, 3, iter([]))
    assert (result.partition, result.rows, result.confirmed) == (3, 0, 0)
    assert not producers._producers


def test_binary_values_null_keys_and_null_headers(broker: MemoryBroker) -> None:
    plan = plan_for(broker, value_is_text=False, key_is_text=False)
    publish_partition(plan, 0, 0, [(bytearray(b"\x00\xff"), None, None), (b"b", b"k", "x")])
    first, second = broker.messages("q")
    assert (first.body, first.key, dict(first.headers)) == (b"\x00\xff", None, {})
    assert (second.body, second.key, second.headers["h"]) == (b"b", b"k", "x")


def test_id_cols_give_the_same_id_for_the_same_key_values(broker: MemoryBroker) -> None:
    plan = plan_for(broker, id_indexes=(3,))
    publish_partition(plan, 9, 0, [("a", None, None, 1), ("b", None, None, 2)])
    publish_partition(plan, 9, 5, [("a-again", None, None, 1)])  # other partition, same id
    ids = broker.ids("q")
    assert ids == [key_id("q", 9, [1]), key_id("q", 9, [2]), key_id("q", 9, [1])]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ((None, None, None), "is null"),
        ((5, None, None), "must be bytes or a string, not int"),
        (("v", 5, None), "key column must be bytes or a string"),
    ],
)
def test_bad_values_fail_the_partition(
    broker: MemoryBroker, row: tuple[object, ...], message: str
) -> None:
    with pytest.raises(InvalidMessage, match=message) as info:
        publish_partition(plan_for(broker), 0, 2, [("ok", None, None), row])
    assert "partition 2" in "".join(info.value.__notes__)


@pytest.mark.parametrize(
    ("inject", "error"),
    [
        (lambda b: b.refuse_writes(), Refused),
        (lambda b: b.reject_next(1), Rejected),
        (lambda b: b.drop_before_confirm(1), ConnectionLost),
    ],
)
def test_a_broker_failure_fails_the_partition_after_the_rest_settled(
    broker: MemoryBroker, inject: object, error: type[Exception]
) -> None:
    plan = plan_for(broker, max_in_flight=4)
    publish_partition(plan, 0, 0, rows(1))  # producer open and cached
    inject(broker)  # type: ignore[operator]
    with pytest.raises(error) as info:
        publish_partition(plan, 0, 0, rows(20))
    note = "".join(info.value.__notes__)
    assert "failed; the task fails so that Spark retries it" in note
    assert "memory://" in note


def test_retry_after_failure_completes_and_duplicates_carry_known_ids(
    broker: MemoryBroker,
) -> None:
    plan = plan_for(broker, max_in_flight=8)
    broker.drop_after_confirm(1)  # the broker holds it, the producer hears nothing
    with pytest.raises(ConnectionLost):
        publish_partition(plan, 1, 0, rows(30))
    result = publish_partition(plan, 1, 0, rows(30), attempt=1)  # Spark's task retry
    assert (result.rows, result.confirmed, result.attempt) == (30, 30, 1)
    expected = {m.message_id for m in broker.messages("q")[-30:]}
    assert set(broker.ids("q")) == expected  # every copy has one of the 30 ids
    assert len(expected) == 30


def test_outbox_stores_when_the_broker_refuses(broker: MemoryBroker, tmp_path: Path) -> None:
    plan = plan_for(broker, outbox=str(tmp_path / "box.sqlite3"), receipt_timeout=10)
    broker.refuse_writes()
    result = publish_partition(plan, 0, 0, rows(10))
    assert (result.confirmed, result.stored) == (0, 10)
    assert (tmp_path / "box.spark-0.sqlite3").exists()
    broker.accept_writes()
    producer = producers.producer_for(plan.url, plan.outbox, plan.options)
    assert producer.drain(10) == 0
    assert len(set(broker.ids("q"))) == 10


def test_outbox_slots_are_per_process(broker: MemoryBroker, tmp_path: Path) -> None:
    url = f"memory://{broker.name}"
    base = tmp_path / "box.sqlite3"
    # Another process (an executor next door) holds slot 0: this one takes slot 1.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from msgsafe.outbox import SqliteOutbox; "
            f"s = SqliteOutbox({str(tmp_path / 'box.spark-0.sqlite3')!r}); "
            "print('held', flush=True); sys.stdin.read(); s.close()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        first = producers.producer_for(url, base, {})
        assert producers.producer_for(url, base, {}) is first  # cached
        assert (tmp_path / "box.spark-1.sqlite3").exists()
        assert not (tmp_path / "box.spark-2.sqlite3").exists()
    finally:
        holder.communicate("", timeout=30)
    assert producers.outbox_slot(url, True, 3) is not None
    assert producers.outbox_slot(url, False, 0) is None


def test_a_producer_closed_elsewhere_is_replaced(broker: MemoryBroker) -> None:
    plan = plan_for(broker)
    producer = producers.producer_for(plan.url, plan.outbox, plan.options)
    producer.close()
    with pytest.raises(Exception, match="closed"):
        publish_partition(plan, 0, 0, rows(1))
    assert publish_partition(plan, 0, 0, rows(1)).confirmed == 1


# --- driver side ------------------------------------------------------------------------------

SCHEMA = StructType(
    [
        StructField("value", StringType()),
        StructField("payload", BinaryType()),
        StructField("user", StringType()),
        StructField("n", LongType()),
        StructField("trace", StringType()),
        StructField("code", IntegerType()),
    ]
)


def test_plan_selects_each_column_once_and_maps_positions() -> None:
    sink = foreach_batch_sink(
        "memory://x",
        "q",
        value_col="payload",
        key_col="user",
        header_cols=("trace", "user"),
        id_cols=("n", "user"),
    )
    names, plan = sink.plan(SCHEMA)
    assert names == ["payload", "user", "trace", "n"]
    assert (plan.value_index, plan.value_is_text, plan.key_index, plan.key_is_text) == (
        0,
        False,
        1,
        True,
    )
    assert plan.headers == (("trace", 2), ("user", 1))
    assert plan.id_indexes == (3, 1)
    assert "secret" not in repr(plan)


@pytest.mark.parametrize(
    ("url", "kwargs", "fast"),
    [
        ("kafka://b:9092", {}, True),
        ("kafka://b:9092", {"key_col": "user", "id_cols": "n", "linger_ms": 5.0}, True),
        ("kafka://b:9092", {"outbox": True}, False),  # failed rows are stored one by one
        ("kafka://b:9092", {"telemetry": True}, False),  # spans need the Producer
        ("kafka://b:9092", {"header_cols": ("trace",)}, False),  # an envelope per row
        ("amqp://b:5672", {}, False),
        ("memory://x", {}, False),
    ],
)
def test_plan_takes_the_kafka_lane_only_where_it_keeps_the_promise(
    url: str, kwargs: dict[str, object], fast: bool
) -> None:
    """Without an outbox a Kafka sink needs counted confirms, not receipts per row."""
    sink = foreach_batch_sink(url, "q", value_col="payload", **kwargs)  # type: ignore[arg-type]
    assert sink.plan(SCHEMA)[1].kafka_fast is fast


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"value_col": "n"}, InvalidMessage, "value_col 'n' has type bigint"),
        ({"key_col": "code"}, InvalidMessage, "key_col 'code' has type int"),
        ({"header_cols": ("payload",)}, InvalidMessage, "header values must be strings"),
        ({"value_col": "nope"}, ConfigurationError, "not a column of the batch"),
        ({"id_cols": ("nope",)}, ConfigurationError, "id column 'nope'"),
    ],
)
def test_wrong_column_types_raise_before_anything_is_sent(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    sink = foreach_batch_sink("memory://x", "q", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        sink.plan(SCHEMA)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"destination": ""},
        {"url": "nope://x"},
        {"id_cols": ()},
        {"max_in_flight": 0},
        {"outbox": 3},
    ],
)
def test_bad_configuration_is_refused_at_once(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"url": "memory://x", "destination": "q"}
    args.update(kwargs)
    with pytest.raises(ConfigurationError):
        foreach_batch_sink(**args)  # type: ignore[arg-type]


def test_the_protocols_bulk_defaults_apply_under_the_callers_options() -> None:
    kafka = foreach_batch_sink("kafka://b:9092", "t", linger_ms=5.0)
    assert kafka.plan(SCHEMA)[1].options == {"linger_ms": 5.0, "batch_num_messages": 100_000}
    rabbit = foreach_batch_sink("amqp://h1/%2F", "q", heartbeat=2)
    assert rabbit.plan(SCHEMA)[1].options == {"heartbeat": 2}


def test_sink_repr_and_plan_hide_credentials() -> None:
    sink = foreach_batch_sink("amqp://user:s3cret@h1:5672/%2F", "q")
    assert "s3cret" not in repr(sink)
    _, plan = sink.plan(SCHEMA)
    assert "s3cret" not in repr(plan)


def test_report_sums_partitions_and_counts_retries() -> None:
    results = [
        PartitionResult(0, 0, rows=10, confirmed=10, stored=0, seconds=0.1),
        PartitionResult(1, 2, rows=5, confirmed=3, stored=2, seconds=0.1),
    ]
    report = SparkBatchReport.sum(4, "q", results, 0.5)
    assert (report.rows, report.confirmed, report.stored, report.failed) == (15, 13, 2, 0)
    assert (report.partitions, report.retried_partitions) == (2, 1)
    assert "15 rows, 13 confirmed, 2 stored, 0 failed" in str(report)


def test_errors_and_plans_cross_process_boundaries() -> None:
    err = pickle.loads(pickle.dumps(SparkBatchFailed("x", batch_id=3, endpoint="kafka://h:1")))
    assert (err.batch_id, err.endpoint) == (3, "kafka://h:1")
    plan = PartitionPlan(url="memory://x", target="memory://x", destination="q")
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_public_reexport() -> None:
    from msgsafe import spark

    assert spark.foreach_batch_sink is foreach_batch_sink
    assert spark.__all__ == sorted(spark.__all__)


# --- the chunked path (no header columns: rows go through Producer.submit_batch) ---------


def batch_plan(broker: MemoryBroker, **changes: object) -> PartitionPlan:
    return plan_for(broker, headers=(), chunk_rows=7, **changes)


def test_chunked_partition_is_published_in_order_with_derived_ids(broker: MemoryBroker) -> None:
    plan = batch_plan(broker)
    result = publish_partition(plan, 3, 0, rows(50))
    assert (result.rows, result.confirmed, result.stored) == (50, 50, 0)
    messages = broker.messages("q")
    assert [m.body for m in messages] == [f"v{i}".encode() for i in range(50)]
    assert [m.key for m in messages] == [f"k{i % 3}".encode() for i in range(50)]
    gen = ContentIds("q", 3, 0)
    assert [m.message_id for m in messages] == [
        gen.next_id(f"v{i}".encode(), f"k{i % 3}".encode(), {}) for i in range(50)
    ]
    publish_partition(plan, 3, 0, rows(50))
    assert broker.ids("q")[50:] == broker.ids("q")[:50]


@pytest.mark.parametrize(
    ("inject", "error"),
    [
        (lambda b: b.refuse_writes(), Refused),
        (lambda b: b.reject_next(1), Rejected),
        (lambda b: b.drop_before_confirm(1), ConnectionLost),
    ],
)
def test_a_broker_failure_fails_a_chunked_partition_with_counts(
    broker: MemoryBroker, inject: object, error: type[Exception]
) -> None:
    plan = batch_plan(broker, max_in_flight=14)
    publish_partition(plan, 0, 0, rows(1))  # producer open and cached
    inject(broker)  # type: ignore[operator]
    with pytest.raises(error) as info:
        publish_partition(plan, 0, 0, rows(40))
    note = "".join(info.value.__notes__)
    assert "failed; the task fails so that Spark retries it" in note


def test_chunked_retry_completes_and_duplicates_carry_known_ids(broker: MemoryBroker) -> None:
    plan = batch_plan(broker)
    broker.drop_after_confirm(1)
    with pytest.raises(ConnectionLost):
        publish_partition(plan, 1, 0, rows(30))
    result = publish_partition(plan, 1, 0, rows(30), attempt=1)
    assert (result.rows, result.confirmed) == (30, 30)
    expected = {m.message_id for m in broker.messages("q")[-30:]}
    assert set(broker.ids("q")) == expected and len(expected) == 30


def test_chunked_partition_stores_when_the_broker_refuses(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    plan = batch_plan(broker, outbox=str(tmp_path / "box.sqlite3"), receipt_timeout=10)
    broker.refuse_writes()
    result = publish_partition(plan, 0, 0, rows(20))
    assert (result.confirmed, result.stored) == (0, 20)
    broker.accept_writes()
    producer = producers.producer_for(plan.url, plan.outbox, plan.options)
    assert producer.drain(10) == 0
    assert len(set(broker.ids("q"))) == 20


def test_a_bad_value_in_a_later_chunk_fails_the_partition(broker: MemoryBroker) -> None:
    data = rows(20)
    data[15] = (None, None, None)
    with pytest.raises(InvalidMessage, match="row 15"):
        publish_partition(batch_plan(broker), 0, 1, data)


def test_content_ids_are_pinned_across_versions() -> None:
    # A replay after an upgrade must repeat the ids the old version sent: any change to
    # how ids are derived shows up here.
    gen = ContentIds("events", 7, 1)
    assert gen.next_id(b"a", None, {}) == "42ca3673-15ad-8670-bc08-6f2ba242ff19"
    assert gen.next_id(b"a", None, {}) == "c1b2d42b-ee90-8991-8e1d-90582a1729ca"
    assert gen.next_id(b"b", b"k", {"x": "1"}) == "a913723b-7b04-81b8-a05e-b82021239b2b"
