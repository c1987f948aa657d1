"""kafka-python's KafkaProducer and msgsafe.compat.kafka_python's side by side on the
session Kafka cluster: each scenario runs with each client and the wrapper must observe
what the real client observes (see ``differential.py``): metadata of ``get()``,
callbacks and errbacks, serializers, headers and tombstones as a consumer reads them,
``flush``, ``close``, ``partitions_for`` and the errors ``send()`` raises."""

from __future__ import annotations

import json
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import kafka
import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import kafka_python as wrapped_kp
from msgsafe.compat._kafka_python_config import KAFKA_PYTHON_3
from msgsafe.message import MESSAGE_ID_HEADER
from tests.integration.compat.differential import Side, differ, new_topic, sides
from tests.support.kafka_ledger import earliest_consumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    # kafka-python 3 warns (DeprecationWarning) for a plain-callable serializer, both sides.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _side(name: str, cluster: KafkaCluster, tmp_path: Path) -> Side:
    base: dict[str, Any] = {"bootstrap_servers": cluster.bootstrap, "max_block_ms": 30_000}
    if name == "real":
        return Side("real", kafka, lambda **extra: kafka.KafkaProducer(**base, **extra), base)
    outbox = str(tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3")
    return Side(
        "wrapper",
        wrapped_kp,
        lambda **extra: wrapped_kp.KafkaProducer(**base, msgsafe_outbox=outbox, **extra),
        base,
    )


side, real = sides(_side, "kafka_cluster")


def _topic(cluster: KafkaCluster, partitions: int = 3) -> str:
    return new_topic(cluster, "kpdiff", partitions)


def _consume(cluster: KafkaCluster, topic: str, count: int) -> list[Any]:
    """The first ``count`` records of ``topic`` as a real consumer sees them, sorted
    (value, key, headers without msgsafe's id header: see ``_without_id``)."""
    consumer = earliest_consumer(cluster.bootstrap, "kpdiff")
    consumer.subscribe([topic])
    records: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < count:
            assert time.monotonic() < deadline, f"only {len(records)} of {count} consumed"
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            records.append((msg.partition(), msg.value(), msg.key(), msg.headers() or []))
    finally:
        consumer.close()
    return sorted(records, key=repr)


def _without_id(records: list[Any]) -> list[Any]:
    """The wrapper's records carry msgsafe's ``msgsafe-id`` header first: dropped."""
    return [
        (p, v, k, [h for h in headers if h[0] != MESSAGE_ID_HEADER]) for p, v, k, headers in records
    ]


def _metadata(md: Any) -> Any:
    """What a RecordMetadata says, but the time stamp (a clock reading)."""
    return (
        type(md).__name__,
        md.topic_partition.partition,
        md.partition,
        md.offset,
        md.checksum,
        md.serialized_key_size,
        md.serialized_value_size,
        md.serialized_header_size,
        isinstance(md.timestamp, int) and md.timestamp > 0,
    )


def test_send_and_get_report_the_same_metadata(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """Keyed messages land on the same partitions at the same offsets (kafka-python's
    murmur2 placement), with the same sizes; headers and tombstones reach the consumer."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        producer = s.make()
        futures = [
            producer.send(
                topic,
                f"value-{i}".encode(),
                key=f"key-{i % 5}".encode(),
                headers=[("n", b"%d" % i)],
            )
            for i in range(20)
        ]
        futures.append(producer.send(topic, None, key=b"key-1"))  # a tombstone
        seen = [_metadata(f.get(timeout=30)) for f in futures]
        seen = [(t, p, o, *rest) for t, _tp, p, o, *rest in seen]
        producer.close()
        records = _consume(kafka_cluster, topic, 21)
        return seen, _without_id(records)

    differ(request, side, real, scenario)


def test_callbacks_errbacks_and_future_state(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        calls: list[Any] = []
        futures = []
        for i in range(10):
            f = producer.send(topic, b"v%d" % i)
            f.add_callback(lambda md, i=i: calls.append(("cb", i, md.offset)))
            f.add_errback(lambda exc, i=i: calls.append(("eb", i, type(exc).__name__)))
            futures.append(f)
        producer.flush()
        states = [(f.is_done, f.succeeded(), f.failed(), f.exception) for f in futures]
        late: list[Any] = []
        futures[0].add_callback(lambda md, extra: late.append((md.offset, extra)), "x")
        futures[0].add_both(lambda value: late.append(type(value).__name__))
        got = futures[3].get(timeout=1).offset
        producer.close()
        return sorted(calls), states, late, got

    differ(request, side, real, scenario)


def test_serializers_with_and_without_headers(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        # kafka-python 2.x has no serializer classes: a plain callable there.
        value_serializer = (
            kafka.serializer.JsonSerializer()
            if KAFKA_PYTHON_3
            else (lambda data: json.dumps(data).encode())
        )
        producer = s.make(key_serializer=str.encode, value_serializer=value_serializer)
        sizes = [
            producer.send(topic, {"n": i}, key=f"k{i}", headers=[("h", b"x")])
            .get(timeout=30)
            .serialized_value_size
            for i in range(3)
        ]
        producer.close()
        return sizes, _without_id(_consume(kafka_cluster, topic, 3))

    differ(request, side, real, scenario)


def test_flush_close_and_what_send_raises(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        seen: list[Any] = []
        futures = [producer.send(topic, b"v") for _ in range(50)]
        producer.flush(timeout=30)
        seen.append(all(f.is_done for f in futures))
        for call in (
            lambda: producer.send(topic),
            lambda: producer.send(topic, b"v", headers={"h": b"1"}),
            lambda: producer.send(topic, b"v", headers=[("h", "text")]),
            lambda: producer.send(topic, "text"),
            lambda: producer.send(topic, b"x" * 2_000_000),
        ):
            try:
                future = call()
                # kafka-python 2.x returns an oversize message as a failed future.
                failed = future.exception if future.failed() else None
                seen.append(f"future failed: {type(failed).__name__}" if failed else "no error")
            except Exception as exc:
                seen.append(type(exc).__name__)
        producer.close()
        producer.close()
        try:
            producer.send(topic, b"v")
        except Exception as exc:
            seen.append(type(exc).__name__)
        return seen

    differ(request, side, real, scenario)


def test_partitions_for(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        producer = s.make()
        known = producer.partitions_for(_topic(kafka_cluster, partitions=3))
        made = producer.partitions_for(f"kpdiff-new-{uuid.uuid4().hex[:8]}")  # auto-created
        producer.close()
        return sorted(known), len(made) >= 1

    differ(request, side, real, scenario)


def test_weak_settings_still_deliver(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """kafka-python 2.x's defaults (``acks=1``, no idempotence) written out: the wrapper
    overrides them (with a warning) and the code observes the same deliveries."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            producer = s.make(acks=1, enable_idempotence=False, linger_ms=5, retries=3)
        offsets = [producer.send(topic, b"v%d" % i).get(timeout=30).offset for i in range(5)]
        producer.close()
        return offsets

    differ(request, side, real, scenario)
