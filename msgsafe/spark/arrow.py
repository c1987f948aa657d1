"""What runs in an executor when the sink reads Arrow record batches (``df.mapInArrow``).

PySpark hands a ``mapInArrow`` function whole Arrow record batches (columns) instead of
pickling every row to the Python worker and back; for the small rows of a typical
stream that shipping was most of the sink's cost. :func:`publish_batches` turns each
record batch into columns of ``bytes`` (a string column is cast to binary, which Arrow
does without copying) and publishes them through the same
:class:`~msgsafe.spark.partition.PartitionSender` as the row path, so the promise is
the same: the task returns only when every row is CONFIRMED or STORED, and fails (for
Spark to retry it) otherwise.

The ids are the row path's, to the bit (a replay that switched paths still
deduplicates): the same :class:`~msgsafe.spark.ids.ContentIds` over the same bytes, the
same partition index (``mapInArrow`` keeps the DataFrame's partitions), and for
``id_cols`` the same :func:`~msgsafe.spark.ids.key_id` over values Arrow converts to the
Python objects the row path sees; the driver sends a batch through here only when its
id columns have such a type (:data:`ARROW_ID_TYPES`). A sink with header columns needs
an envelope per row; it reads rows from the record batches and takes the row path.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import Any

from msgsafe.errors import ClosedError, InvalidMessage
from msgsafe.spark import producers
from msgsafe.spark.ids import ContentIds, key_id
from msgsafe.spark.kafka_fast import publish_fast
from msgsafe.spark.partition import (
    PartitionPlan,
    PartitionResult,
    PartitionSender,
    empty_result,
    publish_partition,
)

__all__ = ["ARROW_ID_TYPES", "RESULT_SCHEMA", "publish_batches", "run_partition"]

#: The Spark type names (``simpleString()``) of id columns whose values Arrow hands to
#: Python as the same objects as a pickled row (str, bytes, int, bool, float,
#: datetime.date). Others (timestamps, decimals, structs, maps) come out differently,
#: so their ids would differ: such a sink reads rows.
ARROW_ID_TYPES = frozenset(
    {
        "string",
        "binary",
        "tinyint",
        "smallint",
        "int",
        "bigint",
        "boolean",
        "float",
        "double",
        "date",
    }
)

#: The one row each task returns to the driver: a :class:`PartitionResult`.
RESULT_SCHEMA = (
    "partition int, attempt int, rows bigint, confirmed bigint, stored bigint, seconds double"
)


def run_partition(plan: PartitionPlan, batch_id: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` function: publish this task's partition, yield its result."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.attemptNumber() if context is not None else 0
    result = publish_batches(plan, batch_id, partition, batches, attempt=attempt)
    schema = pa.schema(
        [
            ("partition", pa.int32()),
            ("attempt", pa.int32()),
            ("rows", pa.int64()),
            ("confirmed", pa.int64()),
            ("stored", pa.int64()),
            ("seconds", pa.float64()),
        ]
    )
    yield pa.RecordBatch.from_pylist([dataclasses.asdict(result)], schema=schema)


def _rows(batches: Iterable[Any]) -> Iterator[tuple[object, ...]]:
    for batch in batches:
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def _binary_column(column: Any, what: str, offset: int, nullable: bool) -> Any:
    """A string or binary Arrow column as binary (a cast without a copy), checked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(kind):
        column = column.cast(pa.large_binary())
    elif not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise InvalidMessage(f"{what} must be binary or string, not {kind}")
    if column.null_count and not nullable:
        first = pc.index(pc.is_null(column), True).as_py()
        raise InvalidMessage(f"row {offset + first}: {what} is null")
    return column


def _bytes_column(column: Any, what: str, offset: int, nullable: bool) -> list[Any]:
    """A string or binary Arrow column as a list of bytes (None where null)."""
    values: list[Any] = _binary_column(column, what, offset, nullable).to_pylist()
    return values


def publish_batches(
    plan: PartitionPlan,
    batch_id: int,
    partition: int,
    batches: Iterable[Any],
    *,
    attempt: int = 0,
) -> PartitionResult:
    """Publish every row of ``batches`` (Arrow record batches with the columns the
    driver selected, in the plan's positions) and wait until each is safe; raise as
    :func:`~msgsafe.spark.partition.publish_partition` does if any is not."""
    if plan.headers:
        return publish_partition(plan, batch_id, partition, _rows(batches), attempt=attempt)
    value_what = f"column {plan.value_name!r}"
    if plan.kafka_fast:

        def binary_columns(batch: Any, offset: int) -> tuple[Any, Any | None]:
            values = _binary_column(batch.column(plan.value_index), value_what, offset, False)
            if plan.key_index is None:
                return values, None
            keys = _binary_column(batch.column(plan.key_index), "the key column", offset, True)
            return values, keys

        return publish_fast(plan, batch_id, partition, batches, binary_columns, attempt)
    sender: PartitionSender | None = None
    destination = plan.destination
    content_ids = (
        None if plan.id_indexes is not None else ContentIds(destination, batch_id, partition)
    )
    chunk = max(1, plan.chunk_rows)
    offset = 0
    started = time.monotonic()
    try:
        for batch in batches:
            rows = batch.num_rows
            if not rows:
                continue
            if sender is None:
                # Opened with the first row: an empty partition opens no connection.
                sender = PartitionSender(plan, batch_id, partition, attempt)
                sender.started = started
            bodies = _bytes_column(batch.column(plan.value_index), value_what, offset, False)
            keys = None
            if plan.key_index is not None:
                keys = _bytes_column(batch.column(plan.key_index), "the key column", offset, True)
            if content_ids is not None:
                ids = content_ids.column_ids(bodies, keys)
            else:
                columns = [batch.column(i).to_pylist() for i in plan.id_indexes or ()]
                ids = [
                    key_id(destination, batch_id, values) for values in zip(*columns, strict=True)
                ]
            for start in range(0, rows, chunk):
                stop = start + chunk
                part_keys = None if keys is None else keys[start:stop]
                if not sender.submit(bodies[start:stop], ids[start:stop], part_keys):
                    return sender.finish()
            offset += rows
    except ClosedError:
        if sender is not None:
            # Someone closed the cached producer: the next attempt opens a fresh one.
            producers.discard(sender.producer)
            sender.settle_all()
        raise
    except BaseException as exc:
        if sender is None:
            raise
        sender.tally.fail(exc)
    if sender is None:
        return empty_result(partition, attempt, started)
    return sender.finish()
