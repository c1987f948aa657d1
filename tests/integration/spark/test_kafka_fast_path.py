"""The Spark sink's Kafka fast path (:mod:`msgsafe.spark.kafka_fast`) on the suite's Apache
Kafka, without Spark: the executor function is called in this process with Arrow record
batches, as ``mapInArrow`` calls it.

Counted: every row sent arrives under the id the row path derives for it (lost 0,
unknown 0), a replayed batch repeats exactly those ids, a client whose queue holds a
few dozen messages still publishes everything (it waits for room), and a client with no
broker to answer fails the task with a typed error within its confirm_timeout.
"""

from __future__ import annotations

import collections
import socket
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from msgsafe.errors import MsgsafeError
from msgsafe.spark import ContentIds, foreach_batch_sink, kafka_fast, key_id
from msgsafe.spark.arrow import publish_batches
from tests.integration.spark._support import consume, tally
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration

BATCH_ID = 11
PARTITION = 1


def _schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("value", StringType()),
            StructField("key", StringType()),
            StructField("n", LongType()),
        ]
    )


def _rows(count: int) -> list[tuple[str, str | None, int]]:
    # Every 10th value repeats an earlier one (ranked ids), every 7th key is null.
    return [
        (f"row-{i % (count - count // 10)}", None if i % 7 == 0 else f"k{i % 5}", i)
        for i in range(count)
    ]


def _batches(rows: list[tuple[str, str | None, int]], size: int) -> list[Any]:
    out = []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([r[0] for r in part], pa.string()),
                    pa.array([r[1] for r in part], pa.string()),
                    pa.array([r[2] for r in part], pa.int64()),
                ],
                names=["value", "key", "n"],
            )
        )
    return out


def _content_ids(topic: str, rows: list[tuple[str, str | None, int]]) -> list[str]:
    ids = ContentIds(topic, BATCH_ID, PARTITION)
    return [
        ids.next_id(value.encode(), None if key is None else key.encode(), {})
        for value, key, _ in rows
    ]


def _publish(sink: Any, rows: list[tuple[str, str | None, int]], size: int) -> Any:
    names, plan = sink.plan(_schema())
    assert plan.kafka_fast, "a Kafka sink without an outbox publishes through the client"
    schema_order = ["value", "key", "n"]
    batches = [b.select([schema_order.index(n) for n in names]) for b in _batches(rows, size)]
    return publish_batches(plan, BATCH_ID, PARTITION, iter(batches))


def _read(url: str, topic: str, rows: list[tuple[str, str | None, int]]) -> Any:
    group = f"client-{uuid.uuid4().hex[:8]}"
    start_group_at_zero(url, topic, group)
    return consume(url, topic, {r[0].encode() for r in rows}, deadline_s=60, group=group)


def test_fast_path_rows_arrive_under_the_row_paths_ids_and_a_replay_repeats_them(
    kafka_url: str, kafka_topic: str
) -> None:
    rows = _rows(5_000)
    sink = foreach_batch_sink(kafka_url, kafka_topic, key_col="key")
    first = _publish(sink, rows, 1_500)
    assert first.rows == first.confirmed == len(rows)
    replay = _publish(sink, rows, 700)  # other Arrow batch sizes: the same ids
    assert replay.confirmed == len(rows)

    expected_ids = _content_ids(kafka_topic, rows)
    assert len(set(expected_ids)) == len(rows)
    got = _read(kafka_url, kafka_topic, rows)
    counts = tally(collections.Counter(r[0].encode() for r in rows), got, set(expected_ids))
    # Bodies repeat on purpose (tally's lost counts bodies once): lost is counted by id.
    lost = len(set(expected_ids) - set(got.copies))
    print(
        f"[kafka client, written twice] sent={2 * len(rows)} received={counts.received} "
        f"unique={counts.unique} lost={lost} duplicates={counts.duplicates} "
        f"unknown={counts.unknown}"
    )
    assert lost == 0
    assert counts.unknown == 0
    assert counts.wrong_rows == 0
    assert counts.duplicates == len(rows)  # the replay, every copy under a known id


@pytest.mark.parametrize(
    "small",
    [
        # 50 rows in flight: the client waits for room again and again.
        {"max_in_flight": 50},
        # 4 KB of librdkafka's queue: produce() refuses rows (BufferError) mid-chunk, and
        # the client goes on from the row refused.
        {"librdkafka": {"queue.buffering.max.kbytes": "4"}},
    ],
    ids=["window", "queue-bytes"],
)
def test_fast_path_with_id_cols_and_a_small_queue_publishes_every_row(
    kafka_url: str, kafka_topic: str, small: dict[str, Any]
) -> None:
    rows = _rows(3_000)
    sink = foreach_batch_sink(kafka_url, kafka_topic, id_cols="n", **small)
    result = _publish(sink, rows, 1_000)
    assert result.confirmed == len(rows)
    expected_ids = {key_id(kafka_topic, BATCH_ID, [r[2]]) for r in rows}
    got = _read(kafka_url, kafka_topic, rows)
    counts = tally(collections.Counter(r[0].encode() for r in rows), got, expected_ids)
    lost = len(expected_ids - set(got.copies))
    print(
        f"[kafka client, id_cols, {small}] sent={len(rows)} received={counts.received} "
        f"lost={lost} duplicates={counts.duplicates} unknown={counts.unknown}"
    )
    assert lost == 0
    assert counts.unknown == 0
    assert counts.duplicates == 0
    assert counts.wrong_rows == 0


def test_fast_path_without_a_broker_fails_the_task_in_time_and_is_dropped() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"kafka://127.0.0.1:{port}"
    sink = foreach_batch_sink(url, "nowhere", confirm_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(MsgsafeError) as failure:
        _publish(sink, _rows(100), 100)
    took = time.monotonic() - started
    print(f"[kafka client, no broker] failed in {took:.1f}s: {failure.value!r}")
    assert took < 15
    assert any("the task fails so that Spark retries it" in n for n in failure.value.__notes__)
    _, plan = sink.plan(_schema())
    assert (
        kafka_fast._key(plan.url, plan.options) not in kafka_fast._idle
        or not (kafka_fast._idle[kafka_fast._key(plan.url, plan.options)])
    ), "a failed client is not kept for the next task"
