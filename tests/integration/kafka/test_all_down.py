"""Issue 5 acceptance: all brokers down. Sends return STORED within the configured
timeout; after the restart the outbox drains; lost = 0 and per-key order holds."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.message import Delivery
from tests.support.kafka_lab import heal, kill_all
from tests.support.kafka_ledger import consume_until
from tests.support.ledger import Ledger

pytestmark = pytest.mark.integration

BEFORE = 2_000  #: confirmed while the brokers are up
DOWN = 2_000  #: sent while every broker is down
AFTER = 2_000  #: sent after the restart, while the outbox may still drain
KEYS = 16
CONFIRM_TIMEOUT = 3.0


def test_all_brokers_down_stores_then_drains_in_key_order(
    kafka: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    ledger = Ledger()
    counters: collections.Counter[str] = collections.Counter()

    def send_all(producer: msgsafe.Producer, count: int) -> list[msgsafe.Receipt]:
        futures = []
        for i in range(count):
            key = f"k{i % KEYS}"
            message_id = msgsafe.new_message_id()
            ledger.positions[message_id] = (key, counters[key])
            counters[key] += 1
            ledger.sent.add(message_id)
            futures.append(producer.send_async(kafka_topic, b"x", key=key, message_id=message_id))
        return [f.result(60) for f in futures]

    with msgsafe.Producer(
        kafka.url,
        outbox=tmp_path / "outbox.db",
        send_timeout=30,
        confirm_timeout=CONFIRM_TIMEOUT,
    ) as producer:
        receipts = send_all(producer, BEFORE)

        kill_all(kafka)
        started = time.monotonic()
        down = send_all(producer, DOWN)
        stored_in = time.monotonic() - started
        # One blocking send, timed on its own: STORED within the configured timeout.
        one_started = time.monotonic()
        # A key with nothing in the outbox: STORED within the configured timeout, whether
        # the producer still pauses after the failures above or tries the broker again.
        one_id = msgsafe.new_message_id()
        ledger.positions[one_id] = ("solo", 0)
        ledger.sent.add(one_id)
        one = producer.send(kafka_topic, b"x", key="solo", message_id=one_id)
        one_s = time.monotonic() - one_started
        assert one.status is msgsafe.Status.STORED
        assert one_s <= CONFIRM_TIMEOUT + 1.0, f"send() took {one_s:.2f}s while all were down"
        assert all(r.status is msgsafe.Status.STORED for r in down)
        assert producer.pending() >= DOWN

        restart_started = time.monotonic()
        heal(kafka)
        after = send_all(producer, AFTER)
        assert producer.drain(120) == 0, "outbox did not drain after the restart"
        drained_s = time.monotonic() - restart_started
        closing = time.monotonic()
    close_s = time.monotonic() - closing

    for receipt in [*receipts, *down, one, *after]:
        ledger.add_receipt(receipt.message_id, receipt.status)

    arrivals: list[str] = []  # in arrival order, copies included (the order check skips them)

    def record(delivery: Delivery) -> None:
        if delivery.message_id is not None:
            arrivals.append(delivery.message_id)

    consuming = time.monotonic()
    ledger.received.update(
        consume_until(kafka.url, kafka_topic, ledger.receipted, deadline_s=90, on_delivery=record)
    )
    consume_s = time.monotonic() - consuming
    print(
        f"\n{ledger.report('kafka all down')} stored {DOWN} in {stored_in:.1f}s, "
        f"one send() {one_s:.2f}s, drained {drained_s:.1f}s after restart, "
        f"close {close_s:.1f}s, consumed in {consume_s:.1f}s"
    )
    assert not ledger.lost, f"{len(ledger.lost)} receipted messages never arrived"
    assert not ledger.unknown
    # Per-key order on the consumer side, by first arrival of each id.
    late = ledger.order_violations(arrivals)
    assert not late, f"{len(late)} per-key order violations, e.g. {late[:5]}"
