"""A blocking ``send`` on the session's Apache Kafka does not wait out ``linger.ms``:
the producer hurries librdkafka for the one message its caller waits for, while
``send_async`` keeps batching by waiting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.kafka import KafkaCluster
from tests.support.kafka_ledger import consume_until
from tests.support.ledger import Ledger

pytestmark = pytest.mark.integration

#: Long enough that a send paying it cannot pass for one that does not.
LINGER_MS = 1000.0
SENDS = 10


def test_blocking_send_skips_the_linger(
    kafka_cluster: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_cluster.url, outbox=tmp_path / "outbox.db", linger_ms=LINGER_MS
    ) as producer:
        # Metadata and connections first (a blocking send itself: counted like the rest).
        warm = producer.send(kafka_topic, b"warm-up")
        ledger.sent.add(warm.message_id)
        ledger.add_receipt(warm.message_id, warm.status)
        slowest = 0.0
        for i in range(SENDS):
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            started = time.monotonic()
            receipt = producer.send(kafka_topic, f"m{i}".encode(), message_id=message_id)
            slowest = max(slowest, time.monotonic() - started)
            ledger.add_receipt(receipt.message_id, receipt.status)
        # The control: the same producer, a receipt awaited without send(), lingers.
        control_id = msgsafe.new_message_id()
        ledger.sent.add(control_id)
        started = time.monotonic()
        control = producer.send_async(kafka_topic, b"control", message_id=control_id).result(30)
        lingered = time.monotonic() - started
        ledger.add_receipt(control.message_id, control.status)

    ledger.received.update(
        consume_until(kafka_cluster.url, kafka_topic, ledger.receipted, deadline_s=60)
    )
    print(
        ledger.report("send-linger"),
        f"slowest send {slowest * 1000:.0f} ms, send_async + result {lingered * 1000:.0f} ms",
    )
    assert ledger.statuses == {"confirmed": SENDS + 2}
    assert not ledger.lost and not ledger.unknown and ledger.duplicates == 0
    assert lingered >= LINGER_MS / 1000 * 0.9, "the control did not linger: the test proves nothing"
    assert slowest < LINGER_MS / 1000 / 2, f"a blocking send took {slowest:.3f} s"
