"""The Kafka wrapper's fast path on the real cluster: every broker killed while it
produces keyed messages, then restarted. Nothing is lost, a key keeps its order, and
the wrapper goes back to the fast path once the outbox has drained."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import confluent_kafka as ck
from tests.support.fast_path_ledger import FastPathLedger
from tests.support.kafka_lab import heal, kill_all
from tests.support.kafka_ledger import consume_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEYS = 16
BEFORE = 1_000  #: produced and confirmed while the brokers are up
IN_FLIGHT = 1_000  #: produced right before the kill: still in librdkafka when it comes
DOWN = 1_500  #: produced while every broker is down
AFTER = 1_000  #: produced after the restart, while the outbox may still drain
LAST = 500  #: produced once the wrapper is back on the fast path


def _poll_until(producer: ck.Producer, done: object, seconds: float, what: str) -> float:
    started = time.monotonic()
    while not done():  # type: ignore[operator]
        assert time.monotonic() - started < seconds, f"{what} within {seconds:.0f} s"
        producer.poll(0.1)
    return time.monotonic() - started


def test_all_brokers_killed_while_the_fast_path_produces(
    kafka: KafkaCluster, kafka_topic: str, tmp_path: Path
) -> None:
    ledger = FastPathLedger()
    producer = ck.Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
            "message.timeout.ms": 4000,
            "linger.ms": 20,  # messages still in librdkafka when the brokers go
        }
    )
    fast = producer._fast
    assert fast is not None and not fast.resting
    ledger.produce(producer, kafka_topic, BEFORE, keys=KEYS)
    assert producer.flush(60) == 0
    ledger.produce(producer, kafka_topic, IN_FLIGHT, keys=KEYS)
    kill_all(kafka)
    ledger.produce(producer, kafka_topic, DOWN, keys=KEYS)
    switched = _poll_until(
        producer, lambda: fast.resting and not fast.switching, 30, "switched to the outbox"
    )
    # Every callback served (flush() would go on to give the outbox the rest of its
    # timeout to forward, while no broker runs).
    _poll_until(producer, lambda: len(producer) == 0, 60, "every callback served")
    assert producer.pending() > 0
    assert ledger.statuses["confirmed"] >= BEFORE, ledger.report("down")
    assert ledger.statuses["stored"] >= DOWN, ledger.report("down")

    healed = heal(kafka)
    ledger.produce(producer, kafka_topic, AFTER, keys=KEYS)
    back = _poll_until(
        producer,
        lambda: not fast.resting and len(producer) == 0,
        120,
        "back on the fast path",
    )
    assert producer.pending() == 0
    for _ in range(3):  # the outage's error events must not make it leave the fast path again
        producer.poll(0.3)
    # One switch: while the brokers were down the outbox held messages, so the wrapper
    # could not come back before the restart, nor leave again after it.
    switches = fast.switches
    assert not fast.resting and switches == 1, f"{switches} switches"
    ledger.produce(producer, kafka_topic, LAST, keys=KEYS)
    assert producer.flush(60) == 0
    assert not fast.resting and fast.switches == switches
    producer.close()

    consume_until(
        kafka.url, kafka_topic, set(ledger.sent), deadline_s=90, on_delivery=ledger.record
    )
    print(
        f"\n{ledger.report('fast path, all brokers killed')} switched {switched:.1f}s "
        f"after the kill, healed in {healed:.1f}s, back on the fast path {back:.1f}s later, "
        f"{switches} switch(es)"
    )
    ledger.check("fast path, all brokers killed")
