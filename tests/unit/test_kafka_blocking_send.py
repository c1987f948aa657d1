"""A blocking ``Producer.send`` on Kafka after a pause costs what a raw ``produce()`` +
``flush()`` costs, though the adapter's poll thread is back in librdkafka's ``poll()``.

librdkafka hands a delivery report to one of the threads waiting in ``poll()``. After
a pause the poll thread waits there; a sender that then flushed in its own slice
(5 ms) got nothing while the poll thread took its report, and sat the slice out (a
median 5.3 ms against 1.9 ms for the raw send on the real cluster). Why the mock: its
in-process brokers answer in well under a millisecond, so a slice sat out shows;
every id is counted through the consumer as in the other Kafka tests.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from confluent_kafka import Producer as RawProducer

import msgsafe
from tests.support.kafka_ledger import consume_until
from tests.support.kafka_mock import MockKafkaCluster
from tests.support.ledger import Ledger

TOPIC = "orders"
#: The raw producer's topic: its messages carry no id for the ledger.
RAW_TOPIC = "raw"
SENDS = 15
#: Longer than the poll thread's grace (20 ms): it is back in poll() when a send starts.
PAUSE_S = 0.06
#: What a send may take over the raw send, median to median: a sat-out slice is 5 ms.
SLACK_S = 0.0025


def _raw_latencies(bootstrap: str) -> list[float]:
    raw = RawProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    raw.produce(RAW_TOPIC, b"warm-up")
    raw.flush(10)
    took = []
    for _ in range(SENDS):
        time.sleep(PAUSE_S)  # the pause is the scenario, not a synchronisation
        started = time.perf_counter()
        raw.produce(RAW_TOPIC, b"x" * 100)
        assert raw.flush(10) == 0
        took.append(time.perf_counter() - started)
    return took


def test_a_blocking_send_after_a_pause_is_as_quick_as_a_raw_send(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    kafka_mock.create_topic(RAW_TOPIC, partitions=3, replication=3)
    raw = _raw_latencies(kafka_mock.bootstrap)
    ledger = Ledger()
    took = []
    with msgsafe.Producer(kafka_mock.url, outbox=tmp_path / "outbox.db") as producer:
        warm_up = msgsafe.new_message_id()
        ledger.sent.add(warm_up)
        producer.send(TOPIC, b"warm-up", message_id=warm_up)
        for _ in range(SENDS):
            time.sleep(PAUSE_S)  # the pause is the scenario, not a synchronisation
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            started = time.perf_counter()
            receipt = producer.send(TOPIC, b"x" * 100, message_id=message_id)
            took.append(time.perf_counter() - started)
            assert receipt.status is msgsafe.Status.CONFIRMED
            ledger.receipted.add(receipt.message_id)
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(
        f"{ledger.report('blocking send after pauses')}; median send "
        f"{statistics.median(took) * 1000:.2f} ms, raw {statistics.median(raw) * 1000:.2f} ms"
    )
    assert not ledger.lost
    assert not ledger.unknown
    assert statistics.median(took) <= statistics.median(raw) + SLACK_S


def test_a_blocking_send_stored_in_an_outage_does_not_hurry_the_transport(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """A send that goes straight to the outbox (the refusal pause) has nothing in
    librdkafka to hurry: hurrying it waited out a flush of its own (5 ms a send, a
    fifth of what 8 threads could store). Counted: every id stored, then delivered."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    hurried: list[object] = []
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "outbox.db", confirm_timeout=2
    ) as producer:
        ledger.sent.add(producer.send(TOPIC, b"warm-up").message_id)
        for broker in (1, 2, 3):
            kafka_mock.broker_down(broker)
        first = producer.send(TOPIC, b"opens the outage", key="k")
        assert first.status is msgsafe.Status.STORED
        ledger.sent.add(first.message_id)
        hurry = producer._hurry
        assert hurry is not None

        def spy(done: object, timeout: float) -> None:
            hurried.append(done)
            hurry(done, timeout)  # type: ignore[arg-type]

        producer._hurry = spy
        for i in range(20):
            receipt = producer.send(TOPIC, b"m%d" % i, key="k")
            assert receipt.status is msgsafe.Status.STORED
            ledger.sent.add(receipt.message_id)
        assert hurried == []
        for broker in (1, 2, 3):
            kafka_mock.broker_up(broker)
        assert producer.drain(60) == 0
    ledger.receipted.update(ledger.sent)
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    print(f"\n{ledger.report('kafka outage blocking sends')}")
    assert not ledger.lost and not ledger.unknown
