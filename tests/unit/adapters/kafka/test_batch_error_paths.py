"""Producer.send_batch's error paths on librdkafka's mock cluster: each message of a
batch reported exactly once, nothing receipted lost.

Why the mock: these need a broker error on demand, per request (NOT_ENOUGH_REPLICAS for
every produce until healed, ONE produce request failing for good, a fatal idempotence
error, a chosen partition's leader down while the others answer), which no real broker
can be told to give; the real cluster's failures are in tests/chaos/test_kafka_seed.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

import msgsafe
from msgsafe.adapters.kafka import KafkaTransport, open_transport
from msgsafe.endpoints import parse_url
from msgsafe.errors import BatchFailed, MsgsafeError, PermanentError, TransientError
from msgsafe.message import Batch
from tests.support.kafka_ledger import consume_until, warm_up
from tests.support.kafka_mock import MockKafkaCluster
from tests.support.ledger import Ledger
from tests.unit.adapters.kafka.test_error_paths import _raise_fatal

TOPIC = "orders"


class _Tally:
    """A BatchReport that records every report, to check each message is reported once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.confirmed_count = 0
        self.failures: dict[int, MsgsafeError] = {}
        self.duplicate_reports = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def _check(self) -> None:
        if self.confirmed_count + len(self.failures) >= self.size:
            self.done.set()

    def confirmed(self, count: int) -> None:
        with self.lock:
            self.confirmed_count += count
            self._check()

    def failed(self, index: int, error: MsgsafeError) -> None:
        with self.lock:
            if index in self.failures:
                self.duplicate_reports += 1
            self.failures[index] = error
            self._check()


def _record(ledger: Ledger, batch_ids: list[str], receipt: msgsafe.message.BatchReceipt) -> None:
    ledger.sent.update(batch_ids)
    for message_id in receipt.message_ids:
        ledger.add_receipt(message_id, receipt.status(message_id))


def test_not_enough_replicas_sends_a_batch_to_the_outbox_then_delivers_it(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "o.db", send_timeout=30, confirm_timeout=3
    ) as producer:
        first = Batch.build(TOPIC, [b"x"] * 500, keys=[f"k{i % 8}" for i in range(500)])
        before = producer.submit_batch(first).result(30)
        _record(ledger, list(first.message_ids), before)
        assert before.confirmed == 500

        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        second = Batch.build(TOPIC, [b"y"] * 500, keys=[f"k{i % 8}" for i in range(500)])
        during = producer.submit_batch(second).result(30)
        _record(ledger, list(second.message_ids), during)
        assert during.stored == 500
        kafka_mock.heal_produce()
        assert producer.drain(60) == 0
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka batch NOT_ENOUGH_REPLICAS')}")
    assert not ledger.lost and not ledger.unknown


def test_a_fatal_idempotence_error_during_batches_loses_nothing(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "o.db", send_timeout=30, confirm_timeout=5
    ) as producer:
        transport = producer._transport
        assert isinstance(transport, KafkaTransport)
        futures = []
        batches = []
        for n in range(8):
            if n == 3:
                _raise_fatal(transport)
            batch = Batch.build(TOPIC, [b"z"] * 500, keys=[f"k{i % 8}" for i in range(500)])
            batches.append(batch)
            futures.append(producer.submit_batch(batch))
        for batch, future in zip(batches, futures, strict=True):
            _record(ledger, list(batch.message_ids), future.result(60))
        assert producer.drain(60) == 0
        recreated = transport.recreated
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka batch fatal error')} producers recreated={recreated}")
    assert recreated >= 1
    assert len(ledger.receipted) == 8 * 500
    assert not ledger.lost and not ledger.unknown


def test_every_message_of_a_batch_is_reported_once_when_no_broker_answers(
    kafka_mock: MockKafkaCluster,
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    transport = open_transport(parse_url(kafka_mock.url), {"confirm_timeout": 2})
    assert isinstance(transport, KafkaTransport)
    try:
        warm_up(transport, TOPIC)
        for broker in (1, 2, 3):
            kafka_mock.broker_down(broker)
        tally = _Tally(3000)
        started = time.monotonic()
        transport.publish_batch(Batch.build(TOPIC, [b"x"] * 3000), tally)
        assert tally.done.wait(10), "not every message was reported"
        elapsed = time.monotonic() - started
        assert tally.duplicate_reports == 0
        assert tally.confirmed_count + len(tally.failures) == 3000
        assert all(isinstance(e, TransientError) for e in tally.failures.values())
        # Bounded by confirm_timeout; the slack absorbs a busy machine's scheduling.
        assert elapsed <= 2.0 + 2.0, f"reported after {elapsed:.2f}s"
    finally:
        for broker in (1, 2, 3):
            kafka_mock.broker_up(broker)
        transport.close()


def test_a_partly_failed_batch_names_exactly_the_messages_the_broker_lacks(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url,
        outbox=tmp_path / "o.db",
        send_timeout=30,
        confirm_timeout=5,
        # Many small produce requests, so that failing one fails part of the batch.
        batch_num_messages=100,
        linger_ms=0,
    ) as producer:
        ledger.sent.add(producer.send(TOPIC, b"warm-up").message_id)
        # One produce request fails for good (not retried by librdkafka): only the
        # messages in it fail; unique bodies let each report name its message.
        kafka_mock.fail_produce(KafkaError.TOPIC_AUTHORIZATION_FAILED, count=1)
        batch = Batch.build(TOPIC, [b"m%d" % i for i in range(3000)])
        ledger.sent.update(batch.message_ids)
        with pytest.raises(BatchFailed) as caught:
            producer.submit_batch(batch).result(30)
        kafka_mock.heal_produce()
        # A message the failure left unanswered (a busy machine) is stored, not failed;
        # the forwarder may have met the same refusal before the heal. Delivering it is
        # the outbox's job: drain it before closing, as a restarted producer would.
        assert producer.drain(60) == 0, producer.stats()
    failed = caught.value
    safe = failed.receipt
    ledger.receipted.update(safe.message_ids)
    received = consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60)
    ledger.received.update(received)
    print(f"\n{ledger.report('kafka batch partly failed')} failed={len(failed.errors)}")
    # How many fail depends on what librdkafka had sent when the topic error came back
    # (it fails the topic's queued messages too); which ones must be exact either way.
    assert failed.errors
    assert all(isinstance(e, PermanentError) for e in failed.errors.values())
    assert len(failed.errors) + len(safe.message_ids) == 3000
    assert not ledger.lost and not ledger.unknown
    # A message reported failed is not at the broker: the report named the right one.
    assert not set(failed.errors) & set(received)


def test_a_leader_down_stores_exactly_its_partitions_messages(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    # Broker 2 leads partition 0 only, whatever the mock chose: taking it down then
    # fails exactly that partition's messages.
    for partition, leader in enumerate((2, 1, 3)):
        kafka_mock.move_leader(TOPIC, partition, leader)
    ledger = Ledger()
    count = 3000
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "o.db", send_timeout=30, confirm_timeout=3
    ) as producer:
        ledger.sent.add(producer.send(TOPIC, b"warm-up").message_id)
        kafka_mock.broker_down(2)
        # Unique keys spread the batch over every partition; unique bodies let each
        # failed report name its message.
        batch = Batch.build(
            TOPIC, [b"m%d" % i for i in range(count)], keys=[f"k{i}" for i in range(count)]
        )
        receipt = producer.submit_batch(batch).result(30)
        kafka_mock.broker_up(2)
        _record(ledger, list(batch.message_ids), receipt)
        assert producer.drain(60) == 0
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka batch, one leader down')}")
    assert 0 < receipt.stored < count, "expected the down leader's share only"
    assert not ledger.lost and not ledger.unknown
    # Exact attribution: a confirmed message is never also stored and sent again.
    assert ledger.duplicates == 0
