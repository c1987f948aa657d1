"""The Spark sink's Arrow path without Spark: record batches published through memory://
give the very ids, bodies and keys the row path gives for the same rows (a replay that
switched paths still deduplicates), and fail the same way.

Spark's Python workers are other processes, so these tests call the executor-side
function directly; tests/integration/spark runs it through a real SparkSession.
"""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from msgsafe.errors import InvalidMessage, Refused
from msgsafe.spark import PartitionPlan, foreach_batch_sink, producers
from msgsafe.spark.arrow import RESULT_SCHEMA, publish_batches, run_partition
from msgsafe.spark.ids import ContentIds
from msgsafe.spark.partition import publish_partition
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
        "chunk_rows": 7,
    }
    fields.update(changes)
    return PartitionPlan(**fields)  # type: ignore[arg-type]


ROWS: list[tuple[Any, ...]] = [
    (
        f"v{i % 17}",
        None if i % 5 == 0 else f"k{i % 3}",
        f"h{i}",
        i % 4,
        datetime.date(2026, 1, 1 + i % 9),
    )
    for i in range(60)
]


def batches(rows: list[tuple[Any, ...]], size: int = 25) -> list[pa.RecordBatch]:
    """``rows`` as record batches of ``size`` (columns: string, string, string, long, date)."""
    schema = pa.schema(
        [
            ("value", pa.string()),
            ("key", pa.string()),
            ("h", pa.string()),
            ("n", pa.int64()),
            ("day", pa.date32()),
        ]
    )
    return [
        pa.RecordBatch.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in rows[start : start + size]],
            schema=schema,
        )
        for start in range(0, len(rows), size)
    ]


def published(broker: MemoryBroker) -> list[tuple[str, bytes, bytes | None, dict[str, str]]]:
    return [(m.message_id, m.body, m.key, dict(m.headers)) for m in broker.messages("q")]


@pytest.mark.parametrize(
    "changes",
    [
        {},  # content ids, keys, chunked
        {"key_index": None},
        {"id_indexes": (3, 4)},  # id_cols: a long and a date
        {"headers": (("h", 2),)},  # header columns: the row path over Arrow's rows
    ],
)
def test_arrow_batches_publish_what_rows_publish(
    broker: MemoryBroker, changes: dict[str, object]
) -> None:
    plan = plan_for(broker, **changes)
    by_rows = publish_partition(plan, 5, 1, ROWS)
    by_arrow = publish_batches(plan, 5, 1, batches(ROWS))
    from_rows, from_arrow = published(broker)[:60], published(broker)[60:]
    assert from_arrow == from_rows
    assert (by_arrow.rows, by_arrow.confirmed, by_arrow.partition) == (60, 60, 1)
    assert (by_rows.rows, by_rows.confirmed) == (60, 60)
    if "id_indexes" not in changes:
        # Identical rows (v0 ... repeat) got distinct ids by rank, as on the row path.
        assert len({message_id for message_id, *_ in from_rows}) == len(from_rows)


def test_column_ids_equal_row_ids() -> None:
    values = [b"a", b"b", b"a", b"", b"a"]
    keys = [None, b"k", None, b"", b"k"]
    rows = ContentIds("events", 7, 1)
    expected = [rows.next_id(v, k, {}) for v, k in zip(values, keys, strict=True)]
    assert ContentIds("events", 7, 1).column_ids(values, keys) == expected
    plain = ContentIds("events", 7, 1)
    assert ContentIds("events", 7, 1).column_ids(values, None) == [
        plain.next_id(v, None, {}) for v in values
    ]
    # The pinned id of the row path (tests/unit/spark/test_sink.py).
    assert ContentIds("events", 7, 1).column_ids([b"a"], None) == [
        "42ca3673-15ad-8670-bc08-6f2ba242ff19"
    ]


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.string()])
def test_arrow_ids_equal_row_ids_across_batches(kind: pa.DataType) -> None:
    """The Kafka client's ids (bytes, from Arrow columns) are the row path's, including
    ranks of identical rows that span two record batches and null keys."""
    values = [b"a", b"b", b"a", b"", b"a", b"b", b"a", b"c"]
    keys = [None, b"k", None, b"", b"k", b"k", None, None]
    rows = ContentIds("events", 7, 1)
    expected = [rows.next_id(v, k, {}) for v, k in zip(values, keys, strict=True)]
    bulk = ContentIds("events", 7, 1)
    got: list[bytes] = []
    for start, stop in ((0, 3), (3, 8)):
        column = pa.array(values[start:stop], pa.binary()).cast(kind)
        key_column = pa.array(keys[start:stop], pa.binary()).cast(kind)
        got += bulk.arrow_ids(column, key_column)
    assert [i.decode() for i in got] == expected
    no_keys = ContentIds("events", 7, 1).arrow_ids(pa.array([b"a"], kind), None)
    assert no_keys == [b"42ca3673-15ad-8670-bc08-6f2ba242ff19"]  # the pinned row-path id


def test_binary_columns_and_a_null_value_in_a_later_batch(broker: MemoryBroker) -> None:
    plan = plan_for(broker, value_is_text=False, key_is_text=False, key_index=None)
    schema = pa.schema([("value", pa.binary())])
    good = pa.RecordBatch.from_pylist([{"value": b"\x00\xff"}] * 3, schema=schema)
    bad = pa.RecordBatch.from_pylist([{"value": b"x"}, {"value": None}], schema=schema)
    with pytest.raises(InvalidMessage, match="row 4: column 'value' is null") as info:
        publish_batches(plan, 0, 2, [good, bad])
    assert "partition 2" in "".join(info.value.__notes__)
    assert [m.body for m in broker.messages("q")] == [b"\x00\xff"] * 3


def test_no_rows_opens_no_producer(broker: MemoryBroker) -> None:
    plan = plan_for(broker, url="memory://never-opened")
    empty = batches(ROWS[:1])[0].slice(0, 0)
    result = publish_batches(plan, 0, 3, [empty])
    assert (result.partition, result.rows, result.confirmed) == (3, 0, 0)
    assert not producers._producers


def test_a_broker_failure_fails_the_task_with_counts(broker: MemoryBroker) -> None:
    plan = plan_for(broker, max_in_flight=14)
    publish_batches(plan, 0, 0, batches(ROWS[:1]))  # producer open and cached
    broker.refuse_writes()
    with pytest.raises(Refused) as info:
        publish_batches(plan, 0, 0, batches(ROWS))
    assert "the task fails so that Spark retries it" in "".join(info.value.__notes__)


def test_run_partition_yields_one_result_row(broker: MemoryBroker) -> None:
    (out,) = list(run_partition(plan_for(broker), 1, iter(batches(ROWS))))
    assert out.num_rows == 1
    assert out.to_pylist()[0]["rows"] == 60
    assert [f"{f.name} {f.type}" for f in out.schema] == [
        "partition int32",
        "attempt int32",
        "rows int64",
        "confirmed int64",
        "stored int64",
        "seconds double",
    ]
    assert RESULT_SCHEMA.replace("bigint", "int64").split(", ")[2] == "rows int64"


def test_id_columns_arrow_would_convert_differently_keep_the_row_path() -> None:
    schema = StructType(
        [
            StructField("value", StringType()),
            StructField("n", LongType()),
            StructField("day", DateType()),
            StructField("at", TimestampType()),
        ]
    )
    assert foreach_batch_sink("memory://x", "q")._reads_arrow(schema)
    assert foreach_batch_sink("memory://x", "q", id_cols=("n", "day"))._reads_arrow(schema)
    assert not foreach_batch_sink("memory://x", "q", id_cols=("n", "at"))._reads_arrow(schema)
