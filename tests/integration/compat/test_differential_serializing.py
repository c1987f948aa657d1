"""confluent_kafka's SerializingProducer / DeserializingConsumer and msgsafe's drop-ins
(``from msgsafe.compat.confluent_kafka import SerializingProducer, DeserializingConsumer``)
side by side on the session Kafka cluster and the session schema registry (Apicurio),
with confluent-kafka's own AvroSerializer and AvroDeserializer: the wrapper must observe
what the real classes observe (see ``differential.py``). Schema ids are not compared (each
side registers under a topic of its own)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as real_ck
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import (
    AvroDeserializer,
    AvroSerializer,
    AvroSerializerBuilder,
)
from confluent_kafka.serialization import StringDeserializer, StringSerializer

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import confluent_kafka as wrapped_ck
from tests.integration.compat.differential import Side, differ, new_topic, sides

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
ORDER_BAD = {**ORDER, "fields": [*ORDER["fields"], {"name": "currency", "type": "string"}]}


def _side(name: str, cluster: KafkaCluster, tmp_path: Path) -> Side:
    base: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": 20_000,
    }
    if name == "real":
        return Side(
            "real", real_ck, lambda **extra: real_ck.SerializingProducer({**base, **extra}), base
        )
    outbox = str(tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3")
    config = {**base, "msgsafe.outbox": outbox}
    return Side(
        "wrapper",
        wrapped_ck,
        lambda **extra: wrapped_ck.SerializingProducer({**config, **extra}),
        base,
    )


side, real = sides(_side, "kafka_cluster")


def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "timeout": 5, "max.retries": 0})


def _consume(s: Side, cluster: KafkaCluster, topic: str, count: int, url: str) -> list[Any]:
    """The first ``count`` records of ``topic`` through this side's DeserializingConsumer
    (the same class on both sides: msgsafe keeps confluent-kafka's), sorted."""
    consumer = s.module.DeserializingConsumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"diff-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "key.deserializer": StringDeserializer("utf_8"),
            "value.deserializer": AvroDeserializer(_client(url)),
        }
    )
    consumer.subscribe([topic])
    records: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < count:
            assert time.monotonic() < deadline, f"only {len(records)} of {count} consumed"
            msg = consumer.poll(0.5)
            if msg is not None:
                records.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return sorted(records, key=repr)


def _code(err: Any) -> Any:
    return None if err is None else err.name()


def test_the_import_line_is_the_migration() -> None:
    assert wrapped_ck.DeserializingConsumer is real_ck.DeserializingConsumer
    assert issubclass(wrapped_ck.SerializingProducer, wrapped_ck.Producer)


def test_avro_round_trip(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    kafka_cluster: KafkaCluster,
    registry_url: str,
) -> None:
    def scenario(s: Side) -> Any:
        topic = new_topic(kafka_cluster, "ser")
        producer = s.make(
            **{
                "key.serializer": StringSerializer("utf_8"),
                "value.serializer": AvroSerializer(_client(registry_url), json.dumps(ORDER)),
            }
        )
        reports: list[Any] = []
        returned = [
            producer.produce(
                topic,
                key=f"k{i}",
                value={"id": f"o-{i}", "amount": i},
                on_delivery=lambda e, m: reports.append(_code(e)),
            )
            for i in range(30)
        ]
        flushed = producer.flush(30)
        producer.close()
        return (
            returned,
            flushed,
            reports,
            _consume(s, kafka_cluster, topic, 30, registry_url),
        )

    observed = differ(request, side, real, scenario)
    assert observed[2] == [None] * 30 and len(observed[3]) == 30


def test_serialization_errors_closed_and_bad_topic(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    kafka_cluster: KafkaCluster,
    registry_url: str,
) -> None:
    def broken_key(obj: Any, ctx: Any) -> bytes:
        raise ValueError("no key for you")

    def scenario(s: Side) -> Any:
        topic = new_topic(kafka_cluster, "ser")
        seen: list[Any] = []
        producer = s.make(
            **{
                "key.serializer": broken_key,
                "value.serializer": AvroSerializer(_client(registry_url), json.dumps(ORDER)),
            }
        )
        for kwargs in (
            {"key": "k", "value": {"id": "x", "amount": 1}},  # the key fails first
            {"value": {"id": "x"}},  # a record missing a field
            {"value": {"id": "x", "amount": "not a long"}},
        ):
            try:
                producer.produce(topic, **kwargs)
                seen.append("queued")
            except Exception as exc:
                seen.append(type(exc).__name__)
        try:
            producer.produce(b"not-a-str", value={"id": "x", "amount": 1})  # type: ignore[arg-type]
        except Exception as exc:
            seen.append(type(exc).__name__)
        seen.append((producer.flush(10), len(producer)))
        producer.close()
        try:
            producer.produce(topic, value={"id": "x", "amount": 1})
        except Exception as exc:
            seen.append((type(exc).__name__, str(exc)))
        return seen

    differ(request, side, real, scenario)


def test_a_registry_refusal_reaches_produce(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    kafka_cluster: KafkaCluster,
    registry_url: str,
) -> None:
    def scenario(s: Side) -> Any:
        topic = new_topic(kafka_cluster, "ser")
        client = _client(registry_url)
        client.register_schema(f"{topic}-value", Schema(json.dumps(ORDER), "AVRO"))
        client.set_compatibility(f"{topic}-value", "BACKWARD")
        producer = s.make(
            **{"value.serializer": AvroSerializer(_client(registry_url), json.dumps(ORDER_BAD))}
        )
        try:
            producer.produce(topic, value={"id": "x", "amount": 1, "currency": "EUR"})
            seen: Any = "queued"
        except Exception as exc:
            inner = exc.exception  # type: ignore[attr-defined]
            seen = (type(exc).__name__, inner.http_status_code)
        flushed = producer.flush(10)
        producer.close()
        return seen, flushed, len(client.get_versions(f"{topic}-value"))

    observed = differ(request, side, real, scenario)
    assert observed == (("ValueSerializationError", 409), 0, 1)


def test_a_serializer_built_from_its_builder(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    kafka_cluster: KafkaCluster,
    registry_url: str,
) -> None:
    def scenario(s: Side) -> Any:
        topic = new_topic(kafka_cluster, "ser")
        builder = (
            AvroSerializerBuilder()
            .set_schema_registry_config({"url": registry_url})
            .set_schema(json.dumps(ORDER))
        )
        producer = s.make(**{"value.serializer.builder": builder})
        reports: list[Any] = []
        for i in range(5):
            producer.produce(
                topic,
                value={"id": f"b-{i}", "amount": i},
                on_delivery=lambda e, m: reports.append(_code(e)),
            )
        flushed = producer.flush(30)
        closed = producer.close()
        return flushed, reports, closed, _consume(s, kafka_cluster, topic, 5, registry_url)

    differ(request, side, real, scenario)
