"""A real schema registry (msgsafe.cluster.registry: Apicurio Registry 2.0.2, in-memory) and
confluent-kafka's own schema registry client against its Confluent-compatible API.

- an Avro schema registers and gets an id; AvroSerializer writes the Confluent wire
  format (magic byte 0, the id) and AvroDeserializer reads the record back;
- a subject's compatibility reads and sets; under BACKWARD a new version with a required
  field and no default is refused by the registry (SchemaRegistryError 409);
- the registry SIGKILLed: client calls fail with the HTTP transport's
  ``httpx2.ConnectError``; restarted: it answers again (empty: its storage is memory).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx2
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from msgsafe.cluster.registry import RegistryCluster

pytestmark = pytest.mark.integration

_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
# BACKWARD-incompatible: readers of v2 cannot read v1 data (a new field with no default).
_V2_BAD = {**_V1, "fields": [*_V1["fields"], {"name": "currency", "type": "string"}]}
_V2_GOOD = {
    **_V1,
    "fields": [*_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}],
}


def _avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def _subject() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}-value"


def test_avro_round_trip(registry_url: str) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    subject = _subject()
    topic = subject.removesuffix("-value")
    schema_id = client.register_schema(subject, _avro(_V1))
    assert schema_id > 0
    assert client.get_latest_version(subject).schema_id == schema_id
    serialize = AvroSerializer(client, json.dumps(_V1), conf={"auto.register.schemas": False})
    context = SerializationContext(topic, MessageField.VALUE)
    order = {"id": "o-1", "amount": 1234}
    data = serialize(order, context)
    assert data is not None
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == schema_id
    assert AvroDeserializer(client)(data, context) == order


def test_compatibility_reads_sets_and_refuses(registry_url: str) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    subject = _subject()
    client.register_schema(subject, _avro(_V1))
    assert client.set_compatibility(subject, "BACKWARD") == {"compatibility": "BACKWARD"}
    assert client.get_compatibility(subject) == "BACKWARD"
    assert not client.test_compatibility(subject, _avro(_V2_BAD))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, _avro(_V2_BAD))
    assert refused.value.http_status_code == 409, refused.value
    assert len(client.get_versions(subject)) == 1
    assert client.test_compatibility(subject, _avro(_V2_GOOD))
    client.register_schema(subject, _avro(_V2_GOOD))
    assert len(client.get_versions(subject)) == 2


def test_killed_registry_fails_calls_and_serves_after_restart(registry: RegistryCluster) -> None:
    client = SchemaRegistryClient({"url": registry.url, "timeout": 5, "max.retries": 0})
    subject = _subject()
    client.register_schema(subject, _avro(_V1))
    registry.kill(0)
    assert not registry.serving()
    fresh = SchemaRegistryClient({"url": registry.url, "timeout": 5, "max.retries": 0})
    # The client's HTTP transport (httpx2, which confluent-kafka 2.16 uses) raises its
    # own error: not a SchemaRegistryError, which is only for answers from the registry.
    with pytest.raises(httpx2.ConnectError):
        fresh.get_subjects()
    registry.restart(0)
    assert registry.serving()
    again = SchemaRegistryClient({"url": registry.url})
    assert subject not in again.get_subjects()  # in-memory storage starts empty
    assert again.register_schema(subject, _avro(_V1)) > 0
