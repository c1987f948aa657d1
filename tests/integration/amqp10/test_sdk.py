"""msgsafe.Producer / Consumer over AMQP 1.0 against killable test peers."""

from __future__ import annotations

from pathlib import Path

import pytest

from msgsafe import Consumer, Producer, Status
from msgsafe.message import Receipt
from tests.fixtures.amqp10 import PeerFactory
from tests.integration.amqp10._tally import wait_until

pytestmark = pytest.mark.integration


def test_producer_stores_while_the_only_peer_is_down_and_forwards_later(
    amqp10_peers: PeerFactory, tmp_path: Path
) -> None:
    peer = amqp10_peers.start()
    port = peer.port
    url = f"amqp10://127.0.0.1:{port}"
    receipts: list[Receipt] = []
    sent: list[str] = []
    producer = Producer(url, outbox=tmp_path / "outbox.db", confirm_timeout=2.0)
    try:
        futures = []
        for i in range(2_000):
            futures.append(producer.send_async("orders", b"%06d" % i, key=f"k{i % 8}"))
            if i == 700:
                wait_until(lambda: all(f.done() for f in futures), 30, "the first 700 outcomes")
                peer.kill()
        receipts = [f.result(60) for f in futures]
        sent = [r.message_id for r in receipts]
        stored = sum(r.status is Status.STORED for r in receipts)
        confirmed = sum(r.status is Status.CONFIRMED for r in receipts)
        assert stored > 0, "with the only peer dead, sends must go to the outbox"
        # The broker comes back on the same address with the same store.
        amqp10_peers.start(port=port)
        wait_until(lambda: producer.drain(5) == 0, 60, "the outbox to drain")
    finally:
        producer.close()
    received: list[str] = []
    with Consumer(url, dedup=True) as consumer:
        consumer.subscribe("orders")

        def take() -> bool:
            for delivery in consumer.poll(max_messages=500, timeout=0.2):
                if delivery.message_id is not None:
                    received.append(delivery.message_id)
                delivery.ack()
            return set(sent) <= set(received)

        wait_until(take, 60, "every receipted id to be consumed")
    lost = set(sent) - set(received)
    print(
        f"[sdk outbox] sent={len(sent)} confirmed={confirmed} stored={stored} "
        f"received={len(received)} lost={len(lost)} unknown={len(set(received) - set(sent))}"
    )
    assert not lost
    assert set(received) <= set(sent)


def test_consumer_keeps_receiving_across_fail_over(amqp10_peers: PeerFactory) -> None:
    backup = amqp10_peers.start()
    primary = amqp10_peers.start(advertise=[f"amqp://127.0.0.1:{backup.port}"])
    url = f"amqp10://127.0.0.1:{primary.port}"
    with Producer(url, outbox=False, confirm_timeout=20.0) as producer:
        first = [producer.send("jobs", b"a%d" % i) for i in range(200)]
    received: set[str] = set()
    with Consumer(url, dedup=True, credit=50) as consumer:
        consumer.subscribe("jobs")

        def take() -> bool:
            for delivery in consumer.poll(max_messages=100, timeout=0.2):
                assert delivery.message_id is not None
                received.add(delivery.message_id)
                delivery.ack()
            return len(received) >= 100

        wait_until(take, 30, "the first hundred deliveries")
        primary.kill()
        with Producer(f"amqp10://127.0.0.1:{backup.port}", outbox=False) as producer:
            second = [producer.send("jobs", b"b%d" % i) for i in range(200)]
        wanted = {r.message_id for r in first + second}
        wait_until(lambda: take() and wanted <= received, 60, "every id after the fail-over")
    print(f"[sdk consumer fail-over] wanted={len(wanted)} received={len(received)}")
    assert received == wanted
