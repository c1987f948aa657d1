"""msgsafe.Producer / Consumer over AMQP 1.0 against the session's ActiveMQ Artemis
live/backup pair (``artemis_pair``): the outbox while no node serves, and a consumer
that follows the fail-over it learned from the live's open frame."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer, Status
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.message import Receipt
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _address(what: str) -> str:
    return f"sdk.{what}.{uuid.uuid4().hex[:8]}"


def test_producer_stores_while_no_node_serves_and_forwards_later(
    artemis_pair: ArtemisCluster, tmp_path: Path
) -> None:
    """Both nodes SIGKILLed (the backup first, so it never takes over) after 700 of 2,000
    sends: the rest is STORED; once the pair is back the outbox drains and every
    receipted id is read back."""
    url = artemis_pair.node_url(0)  # the live only: the backup is learned from the open frame
    address = _address("orders")
    receipts: list[Receipt] = []
    producer = Producer(url, outbox=tmp_path / "outbox.db", confirm_timeout=2.0)
    try:
        futures = []
        for i in range(2_000):
            futures.append(producer.send_async(address, b"%06d" % i, key=f"k{i % 8}"))
            if i == 700:
                wait_until(lambda: all(f.done() for f in futures), 30, "the first 700 outcomes")
                artemis_pair.kill(1)
                artemis_pair.kill(0)
        receipts = [f.result(60) for f in futures]
        stored = sum(r.status is Status.STORED for r in receipts)
        confirmed = sum(r.status is Status.CONFIRMED for r in receipts)
        assert stored > 0, "with no node serving, sends must go to the outbox"
        artemis_pair.restart(0)
        artemis_pair.restart(1)
        wait_until(lambda: producer.drain(5) == 0, 60, "the outbox to drain")
    finally:
        producer.close()
    sent = [r.message_id for r in receipts]
    received: list[str] = []
    with Consumer(artemis_pair.url, dedup=True) as consumer:
        consumer.subscribe(address)

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


def test_consumer_keeps_receiving_across_fail_over(artemis_pair: ArtemisCluster) -> None:
    """A consumer given only the live's address reads 100 of 200 messages; the live is
    SIGKILLed; 200 more are sent to the promoted backup; the consumer, now on the backup
    it learned from the open frame, receives every id (dedup drops redeliveries)."""
    url = artemis_pair.node_url(0)
    address = _address("jobs")
    with Producer(url, outbox=False, confirm_timeout=20.0) as producer:
        first = [producer.send(address, b"a%d" % i) for i in range(200)]
    received: set[str] = set()
    with Consumer(url, dedup=True, credit=50) as consumer:
        consumer.subscribe(address)

        def take() -> bool:
            for delivery in consumer.poll(max_messages=100, timeout=0.2):
                assert delivery.message_id is not None
                received.add(delivery.message_id)
                delivery.ack()
            return len(received) >= 100

        wait_until(take, 30, "the first hundred deliveries")
        artemis_pair.kill(0)
        # The backup listens once it took over (about a second); before, it refuses TCP.
        wait_until(lambda: artemis_pair.nodes()[1].role == "live", 30, "the backup to serve")
        with Producer(artemis_pair.node_url(1), outbox=False, confirm_timeout=20.0) as producer:
            second = [producer.send(address, b"b%d" % i) for i in range(200)]
        wanted = {r.message_id for r in first + second}
        wait_until(lambda: take() and wanted <= received, 60, "every id after the fail-over")
    print(f"[sdk consumer fail-over] wanted={len(wanted)} received={len(received)}")
    assert received == wanted
