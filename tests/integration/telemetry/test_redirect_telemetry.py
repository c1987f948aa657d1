"""An AMQP 1.0 redirect seen through telemetry: counted by reason, a span of its own,
and every id sent is received where the redirect led.

Why the proton test peer: no real broker here sends ``amqp:connection:redirect``."""

from __future__ import annotations

import time

import pytest

from msgsafe import Consumer, Producer, Status
from tests.fixtures.amqp10 import PeerFactory
from tests.support.otel import install, metric_total, spans_of

pytestmark = pytest.mark.integration


def test_connection_redirect_is_counted_and_traced(amqp10_peers: PeerFactory) -> None:
    install()
    target = amqp10_peers.start()
    mover = amqp10_peers.start(redirect=f"127.0.0.1:{target.port}")
    with Producer(
        f"amqp10://127.0.0.1:{mover.port}", outbox=False, telemetry=True, confirm_timeout=15.0
    ) as producer:
        receipts = [producer.send("orders", b"%04d" % i) for i in range(20)]
        stats = producer.stats()
        url = producer.target
    assert all(r.status is Status.CONFIRMED for r in receipts)
    sent = {r.message_id for r in receipts}
    assert stats.sent == stats.confirmed == 20
    assert dict(stats.redirects) == {"amqp:connection:redirect": 1}
    assert metric_total(url, "msgsafe.connection.redirects") == 1
    (span,) = [s for s in spans_of(url) if s.name == "msgsafe.redirect"]
    (event,) = span.events
    assert event.attributes and event.attributes["msgsafe.to"] == f"127.0.0.1:{target.port}"

    received: set[str] = set()
    with Consumer(f"amqp10://127.0.0.1:{target.port}") as consumer:
        consumer.subscribe("orders")
        deadline = time.monotonic() + 30
        while not sent <= received and time.monotonic() < deadline:
            for delivery in consumer.poll(2, max_messages=64):
                received.add(str(delivery.message_id))
                delivery.ack()
    assert not sent - received, f"{len(sent - received)} ids never received"
    assert received <= sent
