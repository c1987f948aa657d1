"""The Kafka adapter's error paths on librdkafka's mock cluster: NOT_ENOUGH_REPLICAS to
the outbox and to a transient error in time, a fatal idempotence error, leaders moving
under traffic, a full local queue, every broker down and back (heard at once).

Why the mock: each needs a broker error on demand and for exactly as long as the test
says (every produce refused until healed, a leader moved at message 500), which no real
broker can be told to give; the same stories on the real cluster, where the broker
decides, are in tests/chaos/test_kafka_seed.py.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from confluent_kafka import KafkaError

import msgsafe
from msgsafe._observer import observing
from msgsafe.adapters.kafka import KafkaTransport, open_transport
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConnectError, TransientError
from msgsafe.message import Envelope
from msgsafe.retry import RetryPolicy
from tests.support.kafka_ledger import consume_until, warm_up
from tests.support.kafka_mock import MockKafkaCluster, _librdkafka
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until

TOPIC = "orders"


def _send(producer: msgsafe.Producer, ledger: Ledger, count: int) -> list[msgsafe.Receipt]:
    futures = []
    for i in range(count):
        message_id = msgsafe.new_message_id()
        ledger.sent.add(message_id)
        futures.append(
            producer.send_async(TOPIC, b"x" * 100, key=f"k{i % 8}", message_id=message_id)
        )
    receipts = [f.result(60) for f in futures]
    for receipt in receipts:
        ledger.add_receipt(receipt.message_id, receipt.status)
    return receipts


def test_not_enough_replicas_goes_to_the_outbox_then_is_delivered(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "outbox.db", send_timeout=30, confirm_timeout=3
    ) as producer:
        before = _send(producer, ledger, 300)
        assert all(r.status is msgsafe.Status.CONFIRMED for r in before)

        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        started = time.monotonic()
        during = _send(producer, ledger, 300)
        stored_s = time.monotonic() - started
        assert all(r.status is msgsafe.Status.STORED for r in during)
        assert producer.pending() == 300

        kafka_mock.heal_produce()
        healed = time.monotonic()
        assert producer.drain(60) == 0
        drained_s = time.monotonic() - healed

    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(
        f"\n{ledger.report('kafka NOT_ENOUGH_REPLICAS')} stored in {stored_s:.1f}s, "
        f"drained {drained_s:.1f}s after the error stopped"
    )
    assert not ledger.lost
    assert not ledger.unknown


def test_not_enough_replicas_fails_the_transport_future_transiently_in_time(
    kafka_mock: MockKafkaCluster,
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    transport = open_transport(parse_url(kafka_mock.url), {"confirm_timeout": 2})
    try:
        warm_up(transport, TOPIC)
        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        started = time.monotonic()
        error = transport.publish(Envelope.build(TOPIC, b"x")).exception(5)
        elapsed = time.monotonic() - started
        assert isinstance(error, TransientError), error
        # Bounded by confirm_timeout (librdkafka alone would wait 300 s); the slack absorbs
        # a busy machine's scheduling, not a second timer.
        assert elapsed <= 2.0 + 1.0, f"future resolved after {elapsed:.2f}s"
        kafka_mock.heal_produce()
        assert transport.publish(Envelope.build(TOPIC, b"after")).result(5) is None
    finally:
        transport.close()


def _raise_fatal(transport: KafkaTransport) -> None:
    """Make librdkafka raise a fatal idempotence error on the transport's producer.

    NOTE: confluent-kafka's handle object starts with the ``rd_kafka_t *`` right after
    the Python object header; ``rd_kafka_test_fatal_error`` is librdkafka's own hook for
    exercising the fatal path.
    """
    lib = _librdkafka()
    lib.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    lib.rd_kafka_test_fatal_error.restype = ctypes.c_int
    handle = ctypes.c_void_p.from_address(id(transport._producer) + object.__basicsize__)
    err = lib.rd_kafka_test_fatal_error(
        handle.value, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, b"injected by msgsafe test"
    )
    assert err == 0


def test_fatal_idempotence_error_recreates_the_producer_and_loses_nothing(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "outbox.db", send_timeout=30, confirm_timeout=5
    ) as producer:
        _send(producer, ledger, 200)
        transport = producer._transport
        assert isinstance(transport, KafkaTransport)
        futures = []
        for i in range(2000):
            if i == 500:
                _raise_fatal(transport)
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            futures.append(producer.send_async(TOPIC, b"y", key=f"k{i % 8}", message_id=message_id))
        for future in futures:
            receipt = future.result(60)
            ledger.add_receipt(receipt.message_id, receipt.status)
        assert producer.drain(60) == 0
        recreated = transport.recreated
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka fatal error')} producers recreated={recreated}")
    assert recreated >= 1
    assert not ledger.lost
    assert not ledger.unknown


def test_leader_moves_while_sending_lose_nothing(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "outbox.db", send_timeout=30, confirm_timeout=5
    ) as producer:
        futures = []
        for i in range(6000):
            if i % 1000 == 500:
                kafka_mock.move_leader(TOPIC, i % 3, 1 + (i // 1000) % 3)
            if i == 3000:
                kafka_mock.broker_down(2)
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            futures.append(producer.send_async(TOPIC, b"z", key=f"k{i % 8}", message_id=message_id))
        kafka_mock.broker_up(2)
        for future in futures:
            receipt = future.result(60)
            ledger.add_receipt(receipt.message_id, receipt.status)
        assert producer.drain(60) == 0
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka leader moves')}")
    assert not ledger.lost
    assert not ledger.unknown


def test_full_local_queue_waits_for_room_then_refuses_in_time(
    kafka_mock: MockKafkaCluster,
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    transport = open_transport(
        parse_url(kafka_mock.url), {"confirm_timeout": 8, "max_in_flight": 5}
    )
    try:
        # Room comes back as reports arrive: every publish succeeds.
        futures = [transport.publish(Envelope.build(TOPIC, b"%d" % i)) for i in range(300)]
        for future in futures:
            assert future.result(10) is None
        # Nothing confirms while the partition refuses: the sixth publish is refused
        # (transient) after waiting a bounded time instead of blocking.
        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        stuck = [transport.publish(Envelope.build(TOPIC, b"s")) for _ in range(5)]
        started = time.monotonic()
        refused = transport.publish(Envelope.build(TOPIC, b"over")).exception(5)
        assert isinstance(refused, TransientError), refused
        assert time.monotonic() - started <= 8 * 0.25 + 0.5
        for future in stuck:
            assert isinstance(future.exception(10), TransientError)
        kafka_mock.heal_produce()
    finally:
        transport.close()


class _Heard:
    """A connection observer that records the ends of outages it hears."""

    def __init__(self) -> None:
        self.ends: list[str] = []

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        pass

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        pass

    def reachable(self, endpoint: str) -> None:
        self.ends.append(endpoint)


def test_a_broker_answering_again_is_heard_at_once(kafka_mock: MockKafkaCluster) -> None:
    """Every broker down: publishes fail at once (to the outbox) and the transport looks
    for a broker itself; the first to answer is told to the producer's observers
    (``reachable``), not left to librdkafka's one-second topic scan."""
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    heard = _Heard()
    with observing(heard):
        transport = open_transport(parse_url(kafka_mock.url), {"confirm_timeout": 2})
    assert isinstance(transport, KafkaTransport)
    try:
        warm_up(transport, TOPIC)
        # The first broker to answer at the start is heard too.
        wait_until(lambda: heard.ends == [transport.target], 10, "the first answer")
        for broker in (1, 2, 3):
            kafka_mock.broker_down(broker)

        def refused_at_once() -> bool:
            error = transport.publish(Envelope.build(TOPIC, b"x")).exception(10)
            return isinstance(error, ConnectError) and transport._link.lost

        wait_until(refused_at_once, 30, "a publish refused with every broker down")
        assert heard.ends == [transport.target]
        for broker in (1, 2, 3):
            kafka_mock.broker_up(broker)
        wait_until(lambda: len(heard.ends) == 2, 10, "the transport to hear a broker again")
        assert heard.ends == [transport.target] * 2
        assert not transport._link.down
        assert transport.publish(Envelope.build(TOPIC, b"after")).exception(10) is None
    finally:
        for broker in (1, 2, 3):
            kafka_mock.broker_up(broker)
        transport.close()


def test_stored_messages_leave_when_a_broker_answers_not_at_the_next_probe(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """A producer started while every broker is down, with a 60 s probe period: its
    stored messages leave as soon as a broker answers again (the transport tells the
    destination checks and the forwarder), long before the next probe would."""
    kafka_mock.create_topic(TOPIC, partitions=2, replication=3)
    ledger = Ledger()
    for broker in (1, 2, 3):
        kafka_mock.broker_down(broker)
    try:
        with msgsafe.Producer(
            kafka_mock.url,
            outbox=tmp_path / "outbox.db",
            confirm_timeout=2,
            connect_timeout=1,
            retry=RetryPolicy(initial=60.0, maximum=60.0),
        ) as producer:
            stored = _send(producer, ledger, 50)
            assert all(r.status is msgsafe.Status.STORED for r in stored)
            # The first probe failed: the next one is at least 20 s away (jittered).
            wait_until(
                lambda: (
                    producer.stats().outbox_depth == 50
                    and producer._forwarder is not None
                    and producer._forwarder.next_attempt_in() > 10
                ),
                30,
                "the forwarder backing off",
            )
            for broker in (1, 2, 3):
                kafka_mock.broker_up(broker)
            wait_until(lambda: producer.pending() == 0, 10, "the outbox drained")
    finally:
        for broker in (1, 2, 3):
            kafka_mock.broker_up(broker)
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    assert not ledger.lost
    assert not ledger.unknown
