"""Producer.send_batch on Kafka: the batch path keeps every rule of send(), counted, on
the session's Apache Kafka cluster (the error paths it cannot produce on demand are unit
tests on librdkafka's mock: tests/unit/adapters/kafka/test_batch_error_paths.py).
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

import msgsafe
from msgsafe.errors import BatchFailed, MessageTooLarge
from msgsafe.message import Delivery
from tests.support.kafka_ledger import consume_until
from tests.support.ledger import Ledger

pytestmark = pytest.mark.integration

KEYS = 16


def _record(ledger: Ledger, batch_ids: list[str], receipt: msgsafe.message.BatchReceipt) -> None:
    ledger.sent.update(batch_ids)
    for message_id in receipt.message_ids:
        ledger.add_receipt(message_id, receipt.status(message_id))


def test_a_batch_reaches_the_broker_whole_and_in_key_order(
    kafka_url: str, kafka_topic: str, tmp_path: Path
) -> None:
    ledger = Ledger()
    count = 20_000
    keys = [f"k{i % KEYS}" for i in range(count)]
    with msgsafe.Producer(kafka_url, outbox=tmp_path / "o.db", send_timeout=60) as producer:
        receipt = producer.send_batch(
            kafka_topic, [b"%d" % i for i in range(count)], keys=keys, timeout=120
        )
    ids = list(receipt.message_ids)
    _record(ledger, ids, receipt)
    position = {mid: i for i, mid in enumerate(ids)}
    seen: dict[str, list[int]] = collections.defaultdict(list)

    def on_delivery(delivery: Delivery) -> None:
        if delivery.message_id in position:
            seen[(delivery.key or b"").decode()].append(position[delivery.message_id])

    ledger.received.update(
        consume_until(
            kafka_url, kafka_topic, ledger.receipted, deadline_s=120, on_delivery=on_delivery
        )
    )
    print(f"\n{ledger.report('kafka batch')}")
    assert receipt.confirmed == count
    assert not ledger.lost and not ledger.unknown
    for key, order in seen.items():
        firsts = list(dict.fromkeys(order))
        assert firsts == sorted(firsts), f"key {key} out of order"


def test_an_oversize_message_fails_alone(kafka_url: str, kafka_topic: str, tmp_path: Path) -> None:
    with msgsafe.Producer(kafka_url, outbox=tmp_path / "o.db", max_message_size=1000) as producer:
        bodies = [b"a", b"b" * 5000, b"c"]
        with pytest.raises(BatchFailed) as caught:
            producer.send_batch(kafka_topic, bodies, message_ids=["id-a", "id-big", "id-c"])
        assert producer.pending() == 0
    failed = caught.value
    assert set(failed.errors) == {"id-big"}
    assert isinstance(failed.errors["id-big"], MessageTooLarge)
    assert list(failed.receipt.message_ids) == ["id-a", "id-c"]
