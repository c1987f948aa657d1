"""The wrappers against real brokers: reports, pass-through calls and permanent errors
mapped to the wrapped library's own (never a silent loss)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import confluent_kafka, pika
from msgsafe.errors import Unroutable
from tests.integration.compat.differential import rabbit_params

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


# --- confluent-kafka ---------------------------------------------------------------------


def test_kafka_reports_list_topics_and_a_permanent_error(
    kafka_cluster: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    reports: list[tuple[object, object]] = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
            "message.timeout.ms": 10_000,
            "message.max.bytes": 10_000,
        }
    )
    metadata = producer.list_topics(kafka_topic, timeout=10)
    assert kafka_topic in metadata.topics

    def record(err: object, msg: object) -> None:
        reports.append((err, msg))

    for i in range(100):
        producer.produce(kafka_topic, f"{i}", key=str(i % 4), on_delivery=record)
    # Over message.max.bytes: refused for good in produce() itself, as librdkafka does.
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        producer.produce(kafka_topic, b"x" * 20_000, on_delivery=record)
    too_large = refused.value.args[0]
    assert producer.flush(30) == 0
    assert len(reports) == 100
    errors = [err for err, _ in reports if err is not None]
    print(f"\nkafka wrapper: reports={len(reports)} errors={errors} refused={too_large}")
    assert errors == []
    assert all(not m.stored() for _, m in reports)  # type: ignore[attr-defined]
    assert too_large.code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    assert not too_large.retriable()
    producer.close()


# --- pika ---------------------------------------------------------------------------------


def test_pika_declares_pass_through_and_unroutable_is_raised(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"compat-{uuid.uuid4().hex[:8]}"
    exchange = f"compat-ex-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(
        rabbit_params(rabbit_cluster), outbox=tmp_path / "o.sqlite3"
    )
    channel = connection.channel()
    declared = channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    assert declared.method.queue == queue
    channel.exchange_declare(exchange, exchange_type="direct", durable=True)
    channel.queue_bind(queue, exchange, routing_key="bound")
    channel.confirm_delivery()
    for i in range(200):
        channel.basic_publish(exchange, "bound", f"{i}".encode())
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        channel.basic_publish(exchange, "nobody-bound", b"lost?", mandatory=True)
    [returned] = info.value.messages
    assert returned.body == b"lost?" and returned.method.routing_key == "nobody-bound"
    assert isinstance(info.value.__cause__, Unroutable)
    assert channel.queue_declare(queue, passive=True).method.message_count == 200
    channel.queue_delete(queue)
    channel.exchange_delete(exchange)
    connection.close()
