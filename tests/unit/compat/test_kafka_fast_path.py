"""The Kafka wrapper's switch from the fast path to the outbox path, and back.

Stand-in: librdkafka's mock cluster refuses every produce on demand and the test
produces from inside the switch, a moment no real broker can be made to hit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from msgsafe.compat import confluent_kafka as ck
from msgsafe.errors import OutboxError
from tests.support.fast_path_ledger import FastPathLedger
from tests.support.kafka_ledger import consume_until
from tests.support.kafka_mock import MockKafkaCluster

pytestmark = pytest.mark.timeout(120)

TOPIC = "lane"
KEYS = 8


def _until(producer: ck.Producer, done: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        producer.poll(0.05)


def test_produces_made_during_the_switch_queue_behind_the_stored_ones(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = FastPathLedger()
    producer = ck.Producer(
        {
            "bootstrap.servers": kafka_mock.bootstrap,
            "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
            "message.timeout.ms": 4000,
        }
    )
    fast = producer._fast
    assert fast is not None and not fast.resting
    ledger.produce(producer, TOPIC, 200, keys=KEYS)
    assert producer.flush(30) == 0
    assert set(ledger.statuses) == {"confirmed"} and not ledger.failures, ledger.report("up")

    # Every produce refused (until the switch heals it): librdkafka retries until
    # message.timeout.ms, then reports the messages failed (transient: stored).
    kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
    store_failures = fast._store_failures
    mid_switch: list[bool] = []

    def produce_mid_switch() -> None:
        # rk is empty, its failures not stored yet, and the brokers take messages again:
        # a produce that did not queue behind the stored ones would overtake them.
        mid_switch.append(fast.switching)
        kafka_mock.heal_produce()
        ledger.produce(producer, TOPIC, 300, keys=KEYS)
        store_failures()

    fast._store_failures = produce_mid_switch  # type: ignore[method-assign]
    ledger.produce(producer, TOPIC, 500, keys=KEYS)
    _until(producer, lambda: fast.resting and not fast.switching, 30, "switched to the outbox path")
    assert mid_switch and mid_switch[0]
    # flush() gives the outbox what is left of its timeout to forward: a short one.
    assert producer.flush(3) == 0, ledger.report("refused")
    # The 500 refused ones were stored; the 300 made mid-switch queued behind them
    # (stored too), which the read-back order below checks.
    assert ledger.statuses["stored"] >= 500, ledger.report("refused")

    _until(producer, lambda: not fast.resting, 60, "back on the fast path")
    assert producer.pending() == 0
    ledger.produce(producer, TOPIC, 200, keys=KEYS)
    assert producer.flush(30) == 0
    producer.close()

    consume_until(kafka_mock.url, TOPIC, set(ledger.sent), deadline_s=60, on_delivery=ledger.record)
    print(f"\n{ledger.report('switch on the mock')}")
    ledger.check("switch on the mock")


def _fast_producer(kafka_mock: MockKafkaCluster, tmp_path: Path) -> ck.Producer:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    return ck.Producer(
        {
            "bootstrap.servers": kafka_mock.bootstrap,
            "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
            "message.timeout.ms": 4000,
        }
    )


def test_a_permanent_refusal_reaches_the_callback_and_the_fast_path_stays(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    producer = _fast_producer(kafka_mock, tmp_path)
    fast = producer._fast
    assert fast is not None
    reports: list[tuple[object, object]] = []
    producer.produce(TOPIC, b"warm", key=b"k", on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(30) == 0
    err, msg = reports.pop()
    assert err is None and msg.partition() >= 0 and msg.offset() >= 0  # type: ignore[attr-defined]
    assert msg.headers()[-1] == ("msgsafe-status", b"confirmed")  # type: ignore[attr-defined]

    kafka_mock.fail_produce(KafkaError.INVALID_RECORD, count=1)
    producer.produce(TOPIC, b"refused", key=b"k", on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(30) == 0
    [(err, msg)] = reports
    assert isinstance(err, KafkaError)
    assert err.code() == KafkaError.INVALID_RECORD and not err.retriable()
    assert not msg.stored() and msg.error() is err  # type: ignore[attr-defined]
    assert msg.headers()[-1] == ("msgsafe-status", b"failed")  # type: ignore[attr-defined]
    assert not fast.resting and producer.pending() == 0
    producer.close()


def test_an_outbox_that_cannot_store_fails_the_callback_with_fs(
    kafka_mock: MockKafkaCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = _fast_producer(kafka_mock, tmp_path)
    fast = producer._fast
    assert fast is not None and fast.store is not None

    def full(envelopes: object) -> None:
        raise OutboxError("outbox full")

    monkeypatch.setattr(fast.store, "put", full)
    kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
    reports: list[tuple[object, object]] = []
    for i in range(20):
        producer.produce(
            TOPIC, b"x", key=f"k{i % 4}", on_delivery=lambda e, m: reports.append((e, m))
        )
    _until(producer, lambda: len(reports) == 20, 30, "every callback")
    for err, msg in reports:
        assert isinstance(err, KafkaError) and err.code() == KafkaError._FS and err.retriable()
        assert not msg.stored()  # type: ignore[attr-defined]
    kafka_mock.heal_produce()
    producer.close(5)


def test_messages_the_outbox_refuses_at_close_are_logged(
    kafka_mock: MockKafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At close no callback runs: what neither the broker confirmed nor the outbox
    took is said in an ERROR line (with a count), never dropped in silence."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    producer = ck.Producer(
        {
            "bootstrap.servers": kafka_mock.bootstrap,
            "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
            "message.timeout.ms": 4000,
            "linger.ms": 1000,  # still in librdkafka at close
        }
    )
    fast = producer._fast
    assert fast is not None and fast.store is not None
    kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)

    def refuse(envelopes: object) -> None:
        raise OSError(28, "No space left on device")

    fast.store.put = refuse  # type: ignore[method-assign]
    for i in range(5):
        producer.produce(TOPIC, b"v%d" % i, key=b"k")
    with caplog.at_level("ERROR", logger="msgsafe.compat"):
        producer.close(0)
    refused = [r.getMessage() for r in caplog.records if "not stored at close" in r.getMessage()]
    assert refused and "5 messages" in refused[0], caplog.text
