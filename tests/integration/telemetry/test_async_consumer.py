"""AsyncConsumer on each protocol's real broker (RabbitMQ AMQP 0-9-1, Apache Kafka,
AMQP 1.0 through RabbitMQ's plugin), with telemetry on: every id sent is received and
acknowledged, what was taken and not settled comes again, each delivery's span is
linked to the span that sent it, and the counters add up to the ids counted here."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from msgsafe import AsyncConsumer, Producer
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.otel import install, metric_total, spans_of, trace

pytestmark = pytest.mark.integration

N = 300
KAFKA_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


@dataclass(frozen=True)
class Route:
    """Where one protocol's messages go and come from."""

    url: str
    destination: str
    producer_options: dict[str, object]
    consumer_options: dict[str, object]
    group: str | None = None


def _quorum_queue(cluster: RabbitCluster) -> str:
    name = f"aioc-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.node_url(0)))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    return name


@pytest.fixture(params=["rabbitmq", "kafka", "amqp10"])
def route(request: pytest.FixtureRequest) -> Route:
    if request.param == "rabbitmq":
        urls: RabbitUrls = request.getfixturevalue("rabbit_urls")
        queue = f"aioc-{uuid.uuid4().hex[:8]}"
        quorum: dict[str, object] = {"declare": "quorum"}
        return Route(urls.cluster, queue, quorum, quorum)
    if request.param == "kafka":
        url: str = request.getfixturevalue("kafka_url")
        topic: str = request.getfixturevalue("kafka_topic")
        return Route(url, topic, {}, dict(KAFKA_GROUP), group=f"g-{topic}")
    cluster: RabbitCluster = request.getfixturevalue("rabbit_cluster")
    hosts = ",".join(f"127.0.0.1:{cluster.port(i)}" for i in range(cluster.size))
    url = f"amqp10://{cluster.username}:{cluster.password}@{hosts}"
    return Route(url, f"/amq/queue/{_quorum_queue(cluster)}", {"confirm_timeout": 20.0}, {})


async def _consume(route: Route, expected: set[str], unsettled: int) -> tuple[set[str], str]:
    """Take ``unsettled`` deliveries and close without settling them, then receive with
    a second consumer until every expected id was acknowledged."""
    received: list[str] = []
    first = AsyncConsumer(route.url, group=route.group, telemetry=True, **route.consumer_options)
    await first.subscribe(route.destination)
    taken = await first.poll(30, max_messages=unsettled)
    assert taken, "nothing received within 30 s"
    await first.close()
    async with AsyncConsumer(
        route.url, group=route.group, telemetry=True, **route.consumer_options
    ) as second:
        await second.subscribe(route.destination)
        deadline = time.monotonic() + 60
        async for delivery in second:
            received.append(str(delivery.message_id))
            await delivery.ack()
            if expected <= set(received) or time.monotonic() > deadline:
                break
        stats = second.stats()
        assert stats.received == stats.acked == len(received)
        target = second.sync.target
    unknown = set(received) - expected
    assert not unknown, f"received ids never sent: {sorted(unknown)[:3]}"
    return set(received), target


def test_async_consumer_receives_every_id_with_linked_spans(route: Route, tmp_path: Path) -> None:
    install()
    with Producer(
        route.url, outbox=tmp_path / "o.db", telemetry=True, **route.producer_options
    ) as producer:
        receipt = producer.send_batch(route.destination, [b"%d" % i for i in range(N)])
        stats = producer.stats()
        target = producer.target
    sent = set(receipt.message_ids)
    assert stats.sent == N and stats.confirmed + stats.stored == N and not stats.failed
    assert metric_total(target, "msgsafe.producer.sent") == N
    (send_span,) = [s for s in spans_of(target) if s.kind is trace.SpanKind.PRODUCER]

    received, consumer_target = asyncio.run(_consume(route, sent, unsettled=5))
    lost = sent - received
    print(f"[{route.url.split(':')[0]}] sent={N} received={len(received)} lost={len(lost)}")
    assert not lost, f"{len(lost)} ids never received"

    processed = [s for s in spans_of(consumer_target) if s.kind is trace.SpanKind.CONSUMER]
    acked = [s for s in processed if (s.attributes or {}).get("msgsafe.outcome") == "accept"]
    assert {(s.attributes or {}).get("messaging.message.id") for s in acked} >= sent
    for span in processed:
        (link,) = span.links
        assert link.context.span_id == send_span.context.span_id
        assert link.context.trace_id == send_span.context.trace_id
