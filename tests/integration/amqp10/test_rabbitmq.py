"""The AMQP 1.0 adapter against RabbitMQ's AMQP 1.0 plugin on the suite's 3-node cluster.

Queues are quorum queues declared over AMQP 0-9-1 (the 3.10 plugin cannot declare
them); the adapter addresses them as ``/amq/queue/NAME``.
"""

from __future__ import annotations

import uuid

import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import AuthenticationError
from msgsafe.message import Envelope
from tests.integration.amqp10._open import receiver_for, transport_for
from tests.support.ledger import Drain, Ledger
from tests.support.rabbit_queues import declare_quorum
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _quorum_queue(cluster: RabbitCluster) -> str:
    return declare_quorum(cluster.node_url(0), f"amqp10-{uuid.uuid4().hex[:8]}")


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
    ledger = Ledger()
    with transport_for(url, confirm_timeout=60.0) as transport:
        assert transport.wait_connected(20)
        first = transport.history[0]
        victim = next(i for i in range(rabbit.size) if rabbit.port(i) == first.port)
        killed = False
        for i in range(10_000):
            env = Envelope.build(address, b"%08d" % i + b"." * 92)
            ledger.track(env.message_id, transport.publish(env))
            if not killed and len(ledger.receipted) >= 3_000:
                rabbit.kill(victim)
                killed = True
        assert killed, "the node was never killed: too few confirmed before the end"
        wait_until(lambda: ledger.resolved() == 10_000, 120, "every publish to resolve")
        history = transport.history
    survivors = ",".join(f"127.0.0.1:{rabbit.port(i)}" for i in range(rabbit.size) if i != victim)
    with receiver_for(f"amqp10://guest:guest@{survivors}", credit=500) as rx:
        rx.subscribe(address)
        drain = Drain(rx, ledger)
        drain.start()
        try:
            wait_until(lambda: not ledger.missing(), 120, "every confirmed id to arrive")
        finally:
            drain.stop()
    counts = ledger.counts("rabbitmq node killed")
    assert counts["lost"] == 0
    assert counts["unknown"] == 0
    assert counts["confirmed"] + counts["transient"] == 10_000
    assert history[-1] != first and history[-1] in parse_url(url).endpoints


def test_redelivered_means_redelivered_on_rabbitmq(rabbit_cluster: RabbitCluster) -> None:
    """RabbitMQ's plugin clears first-acquirer on a redelivery and keeps delivery-count 0."""
    address = f"/amq/queue/{_quorum_queue(rabbit_cluster)}"
    url = rabbit_cluster.amqp10_url(0)
    with transport_for(url) as t:
        t.publish(Envelope.build(address, b"x")).result(20)
    with receiver_for(url) as r:
        r.subscribe(address)
        [first] = r.receive(max_messages=10, timeout=20)
        assert first.redelivered is False
        first.nack()
        [again] = r.receive(max_messages=10, timeout=20)
        assert (again.message_id, again.redelivered) == (first.message_id, True)
        again.ack()
