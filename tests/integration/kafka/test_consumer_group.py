"""Consumer side over Kafka: the SDK Consumer drops duplicates by message id; two
members of one group share a topic, and a rebalance loses nothing."""

from __future__ import annotations

import collections
import threading
import time

import pytest

import msgsafe
from msgsafe.adapters.kafka import open_receiver, open_transport
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration

FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


def _publish(url: str, envelopes: list[Envelope]) -> None:
    transport = open_transport(parse_url(url), {})
    try:
        for future in [transport.publish(env) for env in envelopes]:
            future.result(30)
    finally:
        transport.close()


def test_sdk_consumer_drops_duplicates_by_message_id(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    envelopes = [Envelope.build(kafka_topic, b"%d" % i, key=f"k{i % 4}") for i in range(300)]
    # Every tenth message published twice with the same id, as a retry after an
    # unknown outcome would.
    _publish(kafka_cluster.url, envelopes + envelopes[::10])
    seen: collections.Counter[str | None] = collections.Counter()
    start_group_at_zero(kafka_cluster.url, kafka_topic, f"g-{kafka_topic}")
    with msgsafe.Consumer(
        kafka_cluster.url, group=f"g-{kafka_topic}", dedup=True, **FAST_GROUP
    ) as consumer:
        consumer.subscribe(kafka_topic)
        deadline = time.monotonic() + 60
        while len(seen) < len(envelopes) and time.monotonic() < deadline:
            for delivery in consumer.poll(max_messages=500, timeout=0.5):
                seen[delivery.message_id] += 1
                delivery.ack()
        for delivery in consumer.poll(max_messages=500, timeout=1.0):
            seen[delivery.message_id] += 1
            delivery.ack()
        dropped = consumer.duplicates_dropped
    print(f"\n[kafka dedup] unique={len(seen)} handed out={sum(seen.values())} dropped={dropped}")
    assert set(seen) == {e.message_id for e in envelopes}
    assert max(seen.values()) == 1
    assert dropped == 30


def test_two_members_share_the_topic_and_a_rebalance_loses_nothing(
    kafka_cluster: KafkaCluster, kafka_topic: str
) -> None:
    envelopes = [Envelope.build(kafka_topic, b"x", key=f"k{i % 16}") for i in range(3000)]
    _publish(kafka_cluster.url, envelopes)
    expected = {e.message_id for e in envelopes}
    group = f"g-{kafka_topic}"
    start_group_at_zero(kafka_cluster.url, kafka_topic, group)
    counts: collections.Counter[str | None] = collections.Counter()
    per_member: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def member(name: str) -> None:
        receiver = open_receiver(parse_url(kafka_cluster.url), FAST_GROUP, group=group)
        try:
            receiver.subscribe(kafka_topic)
            while not stop.is_set():
                for delivery in receiver.receive(max_messages=50, timeout=0.2):
                    with lock:
                        counts[delivery.message_id] += 1
                        per_member[name] += 1
                    delivery.ack()
        finally:
            receiver.close()

    first = threading.Thread(target=member, args=("a",))
    first.start()
    second = threading.Thread(target=member, args=("b",))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(counts) >= 300:
                    break
            time.sleep(0.05)
        # The second member joins mid-stream: the group rebalances, the first member's
        # partitions are revoked (and what it acknowledged committed).
        second.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with lock:
                if expected <= set(counts):
                    break
            time.sleep(0.05)
    finally:
        stop.set()
        first.join(30)
        if second.is_alive() or second.ident is not None:
            second.join(30)
    lost = expected - set(counts)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(
        f"\n[kafka group] members={dict(per_member)} unique={len(counts)} "
        f"lost={len(lost)} duplicates={duplicates}"
    )
    assert not lost
    assert set(counts) <= expected
