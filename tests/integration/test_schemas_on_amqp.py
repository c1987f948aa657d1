"""Avro through msgsafe on the other protocols: confluent-kafka's AvroSerializer (against
the session's schema registry, Apicurio) on a Producer to a RabbitMQ quorum queue (AMQP
0-9-1) and to an ActiveMQ Artemis address (AMQP 1.0), and AvroDeserializer on a
Consumer reading them back. Every id counted (lost 0, none unknown, no copy), every
record decoded to the object sent, every body in Confluent's wire format with the id of
the subject ``<destination>-value``, and the deserializer told the destination it reads.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

from msgsafe import Consumer, Producer, Status
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
    }
)
COUNT = 200


@pytest.fixture(params=["rabbitmq", "artemis"])
def route(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL, destination): a fresh quorum queue on the session's RabbitMQ cluster, or a
    fresh address on the session's Artemis pair (it creates a durable anycast queue)."""
    name = f"schemas-{uuid.uuid4().hex[:8]}"
    if request.param == "rabbitmq":
        cluster = request.getfixturevalue("rabbit_cluster")
        return cluster.cluster_url(), declare_quorum(cluster.node_url(0), name)
    return request.getfixturevalue("artemis_pair").url, name


def test_avro_round_trip(route: tuple[str, str], registry_url: str, tmp_path: Path) -> None:
    url, destination = route
    client = SchemaRegistryClient({"url": registry_url, "timeout": 5, "max.retries": 0})
    sent: dict[str, dict[str, Any]] = {}
    with Producer(
        url, outbox=tmp_path / "o.db", serializer=AvroSerializer(client, ORDER)
    ) as producer:
        for i in range(COUNT):
            order = {"id": f"o-{i}", "amount": i}
            receipt = producer.send(destination, order, key=f"k{i % 4}")
            assert receipt.status is Status.CONFIRMED
            sent[receipt.message_id] = order
    schema_id = client.get_latest_version(f"{destination}-value").schema_id
    assert schema_id is not None

    avro = AvroDeserializer(client)
    topics: set[str] = set()

    def deserialize(data: bytes | None, ctx: Any) -> Any:
        topics.add(ctx.topic)
        return avro(data, ctx)

    values: dict[str, Any] = {}
    prefixes: set[bytes] = set()
    copies = 0
    with Consumer(url, deserializer=deserialize) as consumer:
        consumer.subscribe(destination)

        def take() -> bool:
            nonlocal copies
            for delivery in consumer.poll(0.5, max_messages=500):
                assert delivery.message_id is not None
                copies += delivery.message_id in values
                values[delivery.message_id] = delivery.value
                prefixes.add(delivery.body[:5])
                delivery.ack()
            return set(sent) <= set(values)

        wait_until(take, timeout=60, what=f"{COUNT} ids back from {destination}")
    lost = set(sent) - set(values)
    unknown = set(values) - set(sent)
    print(
        f"[avro on {url.split(':', 1)[0]}] sent={len(sent)} received={len(values)} "
        f"lost={len(lost)} unknown={len(unknown)} copies={copies}"
    )
    assert not lost and not unknown and copies == 0
    assert values == sent  # every record decoded to the object sent
    assert prefixes == {b"\0" + schema_id.to_bytes(4, "big")}
    assert topics == {destination}
