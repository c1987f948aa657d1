"""A broker kill seen through telemetry, on the real 3-node RabbitMQ cluster: the node
the producer is connected to is killed mid-stream; the fail-over is an event (a span of
its own, and an event on the sends in flight) and a counted metric, and the counters
add up to the ids this test counts: every one sent, receipted and received."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer, Receipt, Status
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.support.otel import install, metric_total, spans_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

N = 4000


def test_node_kill_is_a_failover_event_and_the_counters_add_up(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    install()
    queue = f"tel-{uuid.uuid4().hex[:8]}"
    victim = 0
    # The victim is listed first: the producer connects to it.
    url = rabbit.cluster_url([victim] + [i for i in range(rabbit.size) if i != victim])
    receipts: dict[str, Status] = {}
    failures: Counter[str] = Counter()
    lock = threading.Lock()

    def settled(future: Future[Receipt]) -> None:
        with lock:
            error = future.exception()
            if error is None:
                receipt = future.result()
                receipts[receipt.message_id] = receipt.status
            else:
                failures[type(error).__name__] += 1

    def fault() -> None:
        wait_until(lambda: len(receipts) >= N // 4, 60, "a quarter receipted")
        rabbit.kill(victim)

    producer = Producer(
        url,
        outbox=tmp_path / "o.db",
        telemetry=True,
        declare="quorum",
        heartbeat=2,
        confirm_timeout=20,
    )
    target = producer.target
    sent: set[str] = set()
    killer = threading.Thread(target=fault, name="fault")
    try:
        killer.start()
        for i in range(N):
            future = producer.send_async(queue, b"%d" % i, key=f"k{i % 16}")
            sent.add(future.envelope.message_id)  # type: ignore[attr-defined]
            future.add_done_callback(settled)
            if i % 200 == 199:
                producer.flush(60)  # keep the stream going across the kill, not ahead of it
        assert producer.flush(120)
        killer.join(60)
        assert producer.drain(120) == 0
        stats = producer.stats()
    finally:
        producer.close(30)

    assert not failures, failures
    assert set(receipts) == sent and len(sent) == N
    confirmed = sum(1 for s in receipts.values() if s is Status.CONFIRMED)
    stored = N - confirmed
    print(
        f"sent={N} confirmed={confirmed} stored={stored} failovers={dict(stats.failovers)} "
        f"drained={stats.drained}"
    )
    assert (stats.sent, stats.confirmed, stats.stored) == (N, confirmed, stored)
    assert stats.in_flight == 0 and not stats.failed and stats.outbox_depth == 0
    assert stats.drained == stored
    assert sum(stats.failovers.values()) >= 1
    assert metric_total(target, "msgsafe.producer.sent") == N
    assert metric_total(target, "msgsafe.producer.confirmed") == confirmed
    assert metric_total(target, "msgsafe.producer.stored") == stored
    assert metric_total(target, "msgsafe.connection.failovers") == sum(stats.failovers.values())

    spans = spans_of(target)
    (failover,) = [s for s in spans if s.name == "msgsafe.failover"][:1]
    event = failover.events[0]
    assert event.name == "msgsafe.failover" and event.attributes
    assert event.attributes["msgsafe.from"] == f"127.0.0.1:{rabbit.port(victim)}"
    in_flight = [s for s in spans if any(e.name == "msgsafe.failover" for e in s.events)]
    assert len(in_flight) > 1, "sends in flight during the fail-over carry the event"
    detoured = [s for s in spans if any(e.name == "msgsafe.outbox.detour" for e in s.events)]
    assert len(detoured) == stored

    # Every receipted id is in the queue (read through the nodes that stayed up).
    received: Counter[str] = Counter()
    others = rabbit.cluster_url([i for i in range(rabbit.size) if i != victim])
    with Consumer(others, declare="quorum", prefetch=1000) as consumer:
        consumer.subscribe(queue)
        deadline = time.monotonic() + 120
        while not sent <= set(received) and time.monotonic() < deadline:
            for delivery in consumer.poll(2, max_messages=1000):
                received[str(delivery.message_id)] += 1
                delivery.ack()
    lost = sent - set(received)
    unknown = set(received) - sent
    duplicates = sum(c - 1 for c in received.values())
    print(f"received={len(received)} lost={len(lost)} duplicates={duplicates}")
    assert not lost, f"{len(lost)} receipted ids never received"
    assert not unknown
