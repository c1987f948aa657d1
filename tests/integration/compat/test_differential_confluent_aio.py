"""confluent_kafka.aio.AIOProducer and msgsafe.compat.confluent_kafka.AIOProducer side by
side on the session Kafka cluster: each scenario runs with each client (the real one with
``acks=all`` and idempotence) and the wrapper must observe what the real client observes
(see ``differential.py``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import confluent_kafka as real_ck
import pytest
from confluent_kafka.aio import AIOProducer as RealAIOProducer

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import confluent_kafka as wrapped_ck
from tests.integration.compat.differential import Side, differ, new_topic, sides
from tests.integration.compat.test_differential_kafka import _consume

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _side(name: str, cluster: KafkaCluster, tmp_path: Path) -> Side:
    base: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": 20_000,
    }
    if name == "real":
        return Side("real", real_ck, lambda **kw: RealAIOProducer(dict(base), **kw), base)
    outbox = str(tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3")
    return Side(
        "wrapper",
        wrapped_ck,
        lambda **kw: wrapped_ck.AIOProducer({**base, "msgsafe.outbox": outbox}, **kw),
        base,
    )


side, real = sides(_side, "kafka_cluster")


def _topic(cluster: KafkaCluster, partitions: int = 3) -> str:
    return new_topic(cluster, "diff-aio", partitions)


def _run(scenario: Callable[[Side], Awaitable[Any]]) -> Callable[[Side], Any]:
    return lambda s: asyncio.run(scenario(s))


def test_futures_resolve_to_messages_and_close(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    async def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        seen: list[Any] = []
        async with s.make(batch_size=5) as producer:
            futures = [await producer.produce(topic, b"v%d" % i, key=b"one-key") for i in range(12)]
            await producer.flush()
            messages = await asyncio.wait_for(asyncio.gather(*futures), 60)
            seen.append([(m.error(), m.topic() == topic, m.value(), m.key()) for m in messages])
            seen.append(len({m.partition() for m in messages}))
            offsets = [m.offset() for m in messages]
            seen.append(offsets == list(range(offsets[0], offsets[0] + 12)))
            seen.append(len(producer))
        seen.append(len(producer))
        seen.append(len(_consume(kafka_cluster, topic, 12)))
        return seen

    differ(request, side, real, _run(scenario))


def test_refusals_reach_the_future(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """A message over ``message.max.bytes`` fails its future with ``MSG_SIZE_TOO_LARGE``;
    the transactional API answers ``_NOT_CONFIGURED``."""

    async def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        seen: list[Any] = []
        async with s.make(batch_size=1) as producer:
            future = await producer.produce(topic, b"x" * 1_000_001)
            try:
                await asyncio.wait_for(future, 60)
            except real_ck.KafkaException as exc:
                seen.append(exc.args[0].name())
            try:
                await producer.init_transactions()
            except real_ck.KafkaException as exc:
                seen.append(exc.args[0].name())
            ok = await producer.produce(topic, b"fine")
            await producer.flush()
            seen.append((await asyncio.wait_for(ok, 60)).value())
        return seen

    differ(request, side, real, _run(scenario))
