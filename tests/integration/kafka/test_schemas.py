"""Avro through msgsafe on the session Kafka cluster against a real schema registry
(Apicurio, ``msgsafe cluster up registry``), with confluent-kafka's own AvroSerializer and
AvroDeserializer passed as ``serializer=`` / ``deserializer=``. Every id counted:

- round trip, then the registry SIGKILLed: the serializer's cached schema id keeps every
  send CONFIRMED, and the consumer's deserializer (its schema cached) reads them all;
- the registry down and a serializer that never saw the subject:
  ``SchemaRegistryUnavailable`` before anything is sent (nothing reaches the topic or
  the outbox); the caller still owns each message and resends it with its id once the
  registry is back;
- the subject under BACKWARD and a breaking schema: ``SchemaIncompatible`` naming the
  subject and the rule, nothing sent; the compatible producer goes on;
- ``msgsafe doctor --schema-registry``: each subject's mode, or the registry's default;
- Protobuf: confluent's ProtobufSerializer / ProtobufDeserializer with protoc's class
  (examples/protobuf/order_pb2.py), every id back, every message equal to the one sent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

from examples.protobuf.order_pb2 import Order
from msgsafe import Consumer, Producer, Status
from msgsafe.cluster.registry import RegistryCluster
from msgsafe.errors import SchemaIncompatible, SchemaRegistryUnavailable
from msgsafe.message import new_message_id
from msgsafe.schemas import compatibility
from tests.support.commands import msgsafe
from tests.support.kafka_ledger import start_group_at_zero
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
# BACKWARD-incompatible: a new required field with no default.
ORDER_BAD = {**ORDER, "fields": [*ORDER["fields"], {"name": "currency", "type": "string"}]}


def _client(url: str) -> SchemaRegistryClient:
    # No retries of its own: a registry that is down fails the call at once.
    return SchemaRegistryClient({"url": url, "timeout": 5, "max.retries": 0})


def _orders(prefix: str, count: int) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{i}", "amount": i} for i in range(count)]


class Reader:
    """A msgsafe Consumer with ``deserializer`` reading ``topic`` from its start; counts
    every id and keeps each value."""

    def __init__(self, url: str, topic: str, deserializer: Any) -> None:
        group = f"check-{new_message_id()}"
        start_group_at_zero(url, topic, group)
        self.consumer = Consumer(url, group=group, deserializer=deserializer).subscribe(topic)
        self.values: dict[str, Any] = {}
        self.copies = 0
        self.bodies: list[bytes] = []

    def read(self, expected: set[str]) -> None:
        def done() -> bool:
            for d in self.consumer.poll(0.5, max_messages=500):
                assert d.message_id is not None
                self.copies += d.message_id in self.values
                self.values[d.message_id] = d.value
                self.bodies.append(d.body)
                d.ack()
            return expected <= set(self.values)

        wait_until(done, timeout=60, what=f"{len(expected)} ids back")

    def read_all(self, expected: set[str]) -> list[Any]:
        """:meth:`read`, then a moment more: what arrives past ``expected`` (a copy of a
        send that raised would show here), and close."""
        try:
            self.read(expected)
            return self.consumer.poll(1.0, max_messages=100)
        finally:
            self.close()

    def close(self) -> None:
        self.consumer.close()


def test_avro_round_trip_and_a_dead_registry_with_the_schema_cached(
    kafka_url: str, kafka_topic: str, registry: RegistryCluster, tmp_path: Path
) -> None:
    client = _client(registry.url)
    serializer = AvroSerializer(client, json.dumps(ORDER))
    reader = Reader(kafka_url, kafka_topic, AvroDeserializer(client))
    sent: dict[str, dict[str, Any]] = {}
    try:
        with Producer(kafka_url, outbox=tmp_path / "o.db", serializer=serializer) as producer:
            for order in _orders("before", 50):
                receipt = producer.send(kafka_topic, order, key=order["id"])
                assert receipt.status is Status.CONFIRMED
                sent[receipt.message_id] = order
            reader.read(set(sent))  # the deserializer fetches the schema by id: cached
            registry.kill(0)
            assert not registry.serving()
            for order in _orders("after", 50):
                receipt = producer.send(kafka_topic, order, key=order["id"])
                assert receipt.status is Status.CONFIRMED
                sent[receipt.message_id] = order
        reader.read(set(sent))
    finally:
        reader.close()
    lost = set(sent) - set(reader.values)
    assert not lost, f"lost {len(lost)}"
    assert set(reader.values) == set(sent), "unknown ids"
    assert reader.values == sent  # every record decoded to the object sent
    assert reader.copies == 0


def test_a_dead_registry_without_the_schema_raises_before_anything_is_sent(
    kafka_url: str, kafka_topic: str, registry: RegistryCluster, tmp_path: Path
) -> None:
    registry.kill(0)
    owned = {new_message_id(): order for order in _orders("owned", 10)}
    with Producer(
        kafka_url,
        outbox=tmp_path / "o.db",
        serializer=AvroSerializer(_client(registry.url), json.dumps(ORDER)),
    ) as producer:
        for message_id, order in owned.items():
            with pytest.raises(SchemaRegistryUnavailable) as raised:
                producer.send(kafka_topic, order, message_id=message_id)
            assert raised.value.message_id == message_id
            assert raised.value.subject == f"{kafka_topic}-value"
        assert producer.pending() == 0  # nothing went to the outbox either
    registry.restart(0)
    # The caller still owns every message: resent with its id once the registry is back.
    client = _client(registry.url)
    with Producer(
        kafka_url, outbox=tmp_path / "o.db", serializer=AvroSerializer(client, json.dumps(ORDER))
    ) as producer:
        for message_id, order in owned.items():
            receipt = producer.send(kafka_topic, order, message_id=message_id)
            assert receipt.status is Status.CONFIRMED
    reader = Reader(kafka_url, kafka_topic, AvroDeserializer(client))
    assert reader.read_all(set(owned)) == []
    assert reader.values == owned and reader.copies == 0


def test_an_incompatible_schema_is_refused_naming_subject_and_rule(
    kafka_url: str, kafka_topic: str, registry_url: str, tmp_path: Path
) -> None:
    client = _client(registry_url)
    subject = f"{kafka_topic}-value"
    client.register_schema(subject, Schema(json.dumps(ORDER), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")
    good = AvroSerializer(client, json.dumps(ORDER))
    bad = AvroSerializer(_client(registry_url), json.dumps(ORDER_BAD))
    sent: dict[str, dict[str, Any]] = {}
    refused = 0
    with (
        Producer(kafka_url, outbox=tmp_path / "a.db", serializer=good) as producer,
        Producer(kafka_url, outbox=tmp_path / "b.db", serializer=bad) as breaking,
    ):
        for i, order in enumerate(_orders("mixed", 20)):
            if i % 2:
                with pytest.raises(SchemaIncompatible) as raised:
                    breaking.send(kafka_topic, {**order, "currency": "EUR"})
                err = raised.value
                assert (err.subject, err.rule) == (subject, "BACKWARD")
                assert subject in str(err) and "BACKWARD" in str(err)
                refused += 1
            else:
                receipt = producer.send(kafka_topic, order)
                assert receipt.status is Status.CONFIRMED
                sent[receipt.message_id] = order
        assert breaking.pending() == 0
    assert refused == 10
    assert len(client.get_versions(subject)) == 1  # the breaking schema was not registered
    reader = Reader(kafka_url, kafka_topic, AvroDeserializer(client))
    assert reader.read_all(set(sent)) == []
    assert reader.values == sent and reader.copies == 0


def test_doctor_reports_each_subjects_compatibility_mode(
    kafka_url: str, kafka_topic: str, registry_url: str
) -> None:
    other = f"plain-{uuid.uuid4().hex[:8]}"
    for topic in (kafka_topic, other):
        _client(registry_url).register_schema(f"{topic}-value", Schema(json.dumps(ORDER), "AVRO"))
    _client(registry_url).set_compatibility(f"{kafka_topic}-value", "BACKWARD")
    # The other subject has no rule of its own (Apicurio's Confluent API answers NONE
    # for it whatever the global rule): the registry's default is reported, said so.
    assert compatibility(registry_url, f"{other}-value") == "NONE (the registry's default)"
    run = msgsafe(
        "doctor", kafka_url, kafka_topic, other, "--schema-registry", registry_url, "--json"
    )
    found = {
        f["subject"]: (f["value"], f["severity"])
        for f in json.loads(run.stdout)["findings"]
        if f["setting"] == "compatibility"
    }
    assert found == {
        f"subject {kafka_topic}-value": ("BACKWARD", "info"),
        f"subject {other}-value": ("NONE (the registry's default)", "warning"),
    }


def test_protobuf_round_trip(
    kafka_url: str, kafka_topic: str, registry_url: str, tmp_path: Path
) -> None:
    client = _client(registry_url)
    sent: dict[str, Order] = {}
    with Producer(
        kafka_url, outbox=tmp_path / "o.db", serializer=ProtobufSerializer(Order, client)
    ) as producer:
        for order in _orders("proto", 100):
            message = Order(id=order["id"], amount=order["amount"])
            receipt = producer.send(kafka_topic, message, key=order["id"])
            assert receipt.status is Status.CONFIRMED
            sent[receipt.message_id] = message
    schema_id = client.get_latest_version(f"{kafka_topic}-value").schema_id
    assert schema_id is not None
    reader = Reader(
        kafka_url, kafka_topic, ProtobufDeserializer(Order, schema_registry_client=client)
    )
    assert reader.read_all(set(sent)) == []
    lost = set(sent) - set(reader.values)
    print(f"[protobuf] sent={len(sent)} received={len(reader.values)} lost={len(lost)}")
    assert not lost, f"lost {len(lost)}"
    assert reader.values == sent and reader.copies == 0  # each decoded to the message sent
    # Confluent's wire format: a zero byte, then the id the registry gave the schema.
    assert {body[:5] for body in reader.bodies} == {b"\0" + schema_id.to_bytes(4, "big")}
