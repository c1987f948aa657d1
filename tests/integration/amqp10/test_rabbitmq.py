"""The AMQP 1.0 adapter against RabbitMQ's AMQP 1.0 plugin on the suite's 3-node cluster.

Queues are quorum queues declared over AMQP 0-9-1 (the 3.10 plugin cannot declare
them); the adapter addresses them as ``/amq/queue/NAME``.
"""

from __future__ import annotations

import uuid

import pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import AuthenticationError
from msgsafe.message import Envelope
from tests.integration.amqp10._open import receiver_for, transport_for
from tests.integration.amqp10._tally import Drain, Tally, wait_until

pytestmark = pytest.mark.integration


def _quorum_queue(cluster: RabbitCluster) -> str:
    name = f"amqp10-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.node_url(0)))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    return name


def _amqp10_cluster_url(cluster: RabbitCluster) -> str:
    hosts = ",".join(f"127.0.0.1:{cluster.port(i)}" for i in range(cluster.size))
    return f"amqp10://{cluster.username}:{cluster.password}@{hosts}"


def test_sasl_plain_round_trip_and_bad_password(rabbit_cluster: RabbitCluster) -> None:
    queue = _quorum_queue(rabbit_cluster)
    address = f"/amq/queue/{queue}"
    url = rabbit_cluster.amqp10_url(0)
    env = Envelope.build(address, b"hello", key="k")
    with transport_for(url) as t:
        t.publish(env).result(20)
    with receiver_for(url) as r:
        r.subscribe(address)
        [got] = r.receive(max_messages=10, timeout=20)
        assert got.message_id == env.message_id and got.body == b"hello" and got.key == b"k"
        got.ack()
    bad = url.replace(f":{rabbit_cluster.password}@", ":wrong-password@")
    # NOTE: RabbitMQ's AMQP 1.0 plugin answers a failed SASL login after 3 s, past the
    # default 2 s connect timeout: a peer that already answered gets the time to refuse.
    with transport_for(bad, confirm_timeout=5.0) as t:
        err = t.publish(Envelope.build(address, b"x")).exception(20)
        assert isinstance(err, AuthenticationError)
        assert "wrong-password" not in str(err)


def test_10k_messages_connected_node_killed(rabbit: RabbitCluster) -> None:
    queue = _quorum_queue(rabbit)
    address = f"/amq/queue/{queue}"
    url = _amqp10_cluster_url(rabbit)
    tally = Tally()
    with transport_for(url, confirm_timeout=60.0) as transport:
        assert transport.wait_connected(20)
        first = transport.history[0]
        victim = next(i for i in range(rabbit.size) if rabbit.port(i) == first.port)
        killed = False
        for i in range(10_000):
            env = Envelope.build(address, b"%08d" % i + b"." * 92)
            tally.track(env.message_id, transport.publish(env))
            if not killed and tally.confirmed_count() >= 3_000:
                rabbit.kill(victim)
                killed = True
        assert killed, "the node was never killed: too few confirmed before the end"
        wait_until(lambda: tally.resolved() == 10_000, 120, "every publish to resolve")
        history = transport.history
    survivors = ",".join(f"127.0.0.1:{rabbit.port(i)}" for i in range(rabbit.size) if i != victim)
    with receiver_for(f"amqp10://guest:guest@{survivors}", credit=500) as rx:
        rx.subscribe(address)
        drain = Drain(rx, tally)
        drain.start()
        try:
            wait_until(lambda: not tally.missing(), 120, "every confirmed id to arrive")
        finally:
            drain.stop()
    counts = tally.report("rabbitmq node killed")
    assert counts["lost"] == 0
    assert counts["unknown"] == 0
    assert counts["confirmed"] + counts["transient_errors"] == 10_000
    assert history[-1] != first and history[-1] in parse_url(url).endpoints
