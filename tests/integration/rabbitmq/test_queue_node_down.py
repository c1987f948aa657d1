"""A classic queue whose home node is down, on the real 3-node cluster: RabbitMQ returns a
``mandatory`` message for it (``basic.return``, NO_ROUTE) exactly as for a queue that
does not exist. The first is transient (the node comes back with the queue and its
messages), the second permanent: msgsafe asks the broker which, so a send to the
existing queue is STORED and arrives once the node is back, while a send to a queue
that does not exist still raises ``Unroutable`` naming the missing queue. Counted: every
id sent is received, none quarantined.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from msgsafe import Producer, Status
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.errors import Unroutable
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Messages sent while the queue's node is down.
DOWN_COUNT = 30


def _connect(cluster: RabbitCluster, node: int) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.port(node)))


def _queue_node_down(cluster: RabbitCluster, node: int, queue: str) -> bool:
    """Whether ``node`` answers a passive declare of ``queue`` with "home node ... down"."""
    conn = _connect(cluster, node)
    try:
        conn.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return "is down or inaccessible" in str(exc.reply_text)
    finally:
        if conn.is_open:
            conn.close()
    return False


def _drain_queue(cluster: RabbitCluster, node: int, queue: str) -> list[str]:
    """Every message id in ``queue`` (taken off it)."""
    conn = _connect(cluster, node)
    ids: list[str] = []
    try:
        channel = conn.channel()
        while True:
            method, props, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids.append(props.message_id)
    finally:
        conn.close()


def test_a_send_to_a_classic_queue_whose_node_is_down_is_stored_and_arrives_later(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"classic-home-down-{uuid.uuid4().hex[:8]}"
    missing = f"no-such-queue-{uuid.uuid4().hex[:8]}"
    home, other = 1, 0
    conn = _connect(rabbit, home)
    conn.channel().queue_declare(queue, durable=True)  # classic: lives on its home node
    conn.close()
    sent: list[str] = []
    # The producer talks to another node only: its connection survives the kill.
    with Producer(
        rabbit.node_url(other), outbox=tmp_path / "outbox.sqlite3", send_timeout=30
    ) as producer:
        first = producer.send(queue, b"before")
        assert first.status is Status.CONFIRMED
        sent.append(first.message_id)
        rabbit.kill(home)
        wait_until(
            lambda: _queue_node_down(rabbit, other, queue),
            60,
            "the other node sees the queue's home node down",
        )
        statuses = []
        for n in range(DOWN_COUNT):
            receipt = producer.send(queue, f"down {n}".encode())
            statuses.append(receipt.status)
            sent.append(receipt.message_id)
        assert statuses == [Status.STORED] * DOWN_COUNT
        # A queue that really does not exist: still permanent, and said so (a producer
        # of its own: behind this one's backlog the send would wait in the outbox).
        with (
            Producer(rabbit.node_url(other), outbox=False, send_timeout=30) as plain,
            pytest.raises(Unroutable, match=f"no such queue '{missing}'"),
        ):
            plain.send(missing, b"nobody")
        assert producer.pending() == DOWN_COUNT
        rabbit.restart(home)
        assert producer.drain(120) == 0
        stats = producer.stats()
        quarantined = producer.outbox.stats().quarantined if producer.outbox else -1
    received = _drain_queue(rabbit, home, queue)
    lost = set(sent) - set(received)
    print(
        f"sent={len(sent)} received={len(received)} lost={len(lost)} "
        f"quarantined={quarantined} drained={stats.drained}"
    )
    assert quarantined == 0
    assert lost == set()
    assert set(received) <= set(sent)
