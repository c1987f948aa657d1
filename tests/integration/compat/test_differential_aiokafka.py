"""aiokafka's AIOKafkaProducer and msgsafe.compat.aiokafka's side by side on the session
Kafka cluster: each scenario runs with each client (the real one with ``acks="all"`` and
idempotence, the guarantees the wrapper enforces) and the wrapper must observe what the
real client observes (see ``differential.py``)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiokafka as real_aiokafka
import pytest
from aiokafka import errors
from aiokafka.structs import RecordMetadata

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import aiokafka as wrapped_aiokafka
from msgsafe.message import MESSAGE_ID_HEADER
from tests.integration.compat.differential import Side, differ, new_topic, sides

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _side(name: str, cluster: KafkaCluster, tmp_path: Path) -> Side:
    base: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "request_timeout_ms": 20_000,
    }
    if name == "real":
        return Side(
            "real",
            real_aiokafka,
            lambda **extra: real_aiokafka.AIOKafkaProducer(**{**base, **extra}),
            base,
        )
    outbox = str(tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3")
    return Side(
        "wrapper",
        wrapped_aiokafka,
        lambda **extra: wrapped_aiokafka.AIOKafkaProducer(
            **{**base, "msgsafe_outbox": outbox, **extra}
        ),
        base,
    )


side, real = sides(_side, "kafka_cluster")


def _topic(cluster: KafkaCluster, partitions: int = 3) -> str:
    return new_topic(cluster, "diff-ak", partitions)


async def _consume(cluster: KafkaCluster, topic: str, count: int) -> list[Any]:
    """The first ``count`` records of ``topic`` as a real consumer sees them (value, key,
    the user's headers), sorted: partitions are read in no fixed order."""
    consumer = real_aiokafka.AIOKafkaConsumer(
        topic, bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Any] = []
    try:
        while len(records) < count:
            msg = await asyncio.wait_for(consumer.getone(), 60)
            headers = [(k, v) for k, v in msg.headers if k != MESSAGE_ID_HEADER]
            records.append((msg.value, msg.key, headers))
    finally:
        await consumer.stop()
    return sorted(records, key=repr)


def _run(scenario: Callable[[Side], Awaitable[Any]]) -> Callable[[Side], Any]:
    return lambda s: asyncio.run(scenario(s))


def test_send_send_and_wait_and_what_a_consumer_reads(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    async def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        seen: list[Any] = []
        async with s.make() as producer:
            futures = [await producer.send(topic, b"v%d" % i, key=b"one-key") for i in range(10)]
            results = await asyncio.gather(*futures)
            seen.append(len({r.partition for r in results}))  # one key: one partition
            offsets = [r.offset for r in results]
            seen.append(offsets == list(range(offsets[0], offsets[0] + 10)))
            last = await producer.send_and_wait(
                topic, b"with headers", key=b"k2", headers=[("h", b"1"), ("h", b"2")]
            )
            seen.append((isinstance(last, RecordMetadata), last.topic == topic))
            seen.append(await producer.partitions_for(topic))
        seen.append(len(await _consume(kafka_cluster, topic, 11)))
        seen.append((await _consume(kafka_cluster, topic, 11))[-1])
        return seen

    differ(request, side, real, _run(scenario))


def test_serializers_refusals_and_stop(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    async def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        seen: list[Any] = []
        producer = s.make(
            key_serializer=lambda k: k.upper().encode(),
            value_serializer=lambda v: json.dumps(v).encode(),
            max_request_size=1000,
        )
        await producer.start()
        record = await producer.send_and_wait(topic, {"a": 1}, key="key")
        seen.append(record.topic == topic)
        try:
            await producer.send(topic, {"a": "x" * 2000}, key="key")
        except errors.MessageSizeTooLargeError:
            seen.append("MessageSizeTooLargeError")
        plain = s.make()
        await plain.start()
        try:
            await plain.send(topic, "not bytes")
        except TypeError:
            seen.append("TypeError")
        await plain.stop()
        await producer.stop()
        await producer.stop()  # again: nothing
        try:
            await producer.send(topic, {"a": 2}, key="key")
        except errors.ProducerClosed:
            seen.append("ProducerClosed")
        seen.append(await _consume(kafka_cluster, topic, 1))
        return seen

    differ(request, side, real, _run(scenario))


def test_batches(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """A batch fills to ``max_batch_size`` (append returns None once full) and is sent
    whole; an explicit partition is ignored by the wrapper, so the topic has one."""

    async def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        seen: list[Any] = []
        async with s.make(max_batch_size=2000) as producer:
            batch = producer.create_batch()
            count = 0
            while batch.append(key=b"k", value=b"v" * 100, timestamp=None) is not None:
                count += 1
            seen.append((count, batch.record_count()))
            future = await producer.send_batch(batch, topic, partition=0)
            record = await future
            seen.append((record.topic == topic, record.partition, record.offset))
        seen.append(len(await _consume(kafka_cluster, topic, count)))
        return seen

    differ(request, side, real, _run(scenario))
