"""The pika page's script with the URL ``msgsafe cluster up rabbitmq --nodes 3`` prints
(every node in one URL): ``pika.URLParameters`` of it connects, declares and publishes,
and every published message is in the queue (counted by id)."""

from __future__ import annotations

import json
import uuid

import pika as real_pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import pika

pytestmark = pytest.mark.integration


def test_the_three_node_url_publishes_every_message(rabbit_cluster: RabbitCluster) -> None:
    url = rabbit_cluster.url
    assert url.count(",") == 2, url  # the form `cluster up` prints
    queue = f"pika-url-{uuid.uuid4().hex[:8]}"
    sent = [str(n) for n in range(20)]

    connection = pika.BlockingConnection(pika.URLParameters(url), outbox=False)
    try:
        channel = connection.channel()
        channel.queue_declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for n in sent:
            channel.basic_publish("", queue, json.dumps({"id": n}))
    finally:
        connection.close()

    reader = real_pika.BlockingConnection(real_pika.URLParameters(rabbit_cluster.node_url(0)))
    try:
        channel = reader.channel()
        received: list[str] = []
        while True:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            received.append(json.loads(body)["id"])
        channel.queue_delete(queue)
    finally:
        reader.close()
    lost = set(sent) - set(received)
    assert not lost, f"lost {sorted(lost)}"
    assert sorted(received, key=int) == sent
