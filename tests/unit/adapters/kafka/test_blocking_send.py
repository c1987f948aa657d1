"""A blocking ``Producer.send`` on Kafka sends at once, not after ``linger.ms``, also
after a pause (when the adapter's poll thread is back in librdkafka's ``poll()``) and on
a busy machine.

librdkafka skips ``linger.ms`` only for a broker thread that looks while a ``flush()``
runs. A send that flushed once for a millisecond waited out the whole linger whenever
its broker thread woke later than that: with ``linger_ms=1000`` and six busy processes
on two cores, 3 sends of 15 took 1,002 ms. The long linger makes a missed flush show
whatever the machine's load; how quick a send after a pause is next to a raw
``produce()`` + ``flush()`` is a benchmark's figure (``benchmarks/bench_kafka.py``,
``send after pauses``). Why the mock: a missed flush shows as the linger whatever the
broker, and the fast target runs without a JVM; every id is counted through the
consumer as in the other Kafka tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgsafe
from tests.support.kafka_ledger import consume_until
from tests.support.kafka_mock import MockKafkaCluster
from tests.support.ledger import Ledger

TOPIC = "orders"
SENDS = 15
#: Longer than the poll thread's grace (20 ms): it is back in poll() when a send starts.
PAUSE_S = 0.06
#: A linger no send may be seen to wait out.
LINGER_MS = 4000


def test_a_blocking_send_does_not_wait_out_the_linger(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    took = []
    with msgsafe.Producer(
        f"{kafka_mock.url}?linger_ms={LINGER_MS}", outbox=tmp_path / "outbox.db"
    ) as producer:
        for i in range(SENDS * 2):
            if i % 2:
                time.sleep(PAUSE_S)  # the pause is the scenario, not a synchronisation
            message_id = msgsafe.new_message_id()
            ledger.sent.add(message_id)
            started = time.perf_counter()
            receipt = producer.send(TOPIC, b"x" * 100, message_id=message_id)
            took.append(time.perf_counter() - started)
            assert receipt.status is msgsafe.Status.CONFIRMED
            ledger.receipted.add(receipt.message_id)
    ledger.received.update(consume_until(kafka_mock.url, TOPIC, ledger.receipted, deadline_s=60))
    slowest = sorted(round(t * 1000, 1) for t in took)[-3:]
    print(f"{ledger.report('blocking sends, linger 4 s')}; slowest sends (ms): {slowest}")
    assert not ledger.lost
    assert not ledger.unknown
    assert max(took) < LINGER_MS / 1000 / 2, f"a send waited out the linger: {slowest} ms"


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
