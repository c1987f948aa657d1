"""Producer.stats() / Consumer.stats() and the OpenTelemetry spans and metrics, on the
in-process broker: the figures add up to the ids this test counts itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Producer, Status
from msgsafe._observer import observing
from msgsafe.endpoints import Endpoint, EndpointList
from msgsafe.errors import Rejected
from msgsafe.retry import RetryPolicy
from msgsafe.testing import MemoryBroker
from tests.support.otel import SpanProcessor, install, metric_total, spans_of, trace

FAST = RetryPolicy(initial=0.01, maximum=0.05)


def _traffic(broker: MemoryBroker, producer: Producer) -> dict[str, set[str]]:
    """Confirmed, rejected, batched and stored (then drained) sends; the ids of each."""
    ids: dict[str, set[str]] = {"confirmed": set(), "stored": set(), "failed": set()}
    for i in range(20):
        receipt = producer.send("q", b"%d" % i)
        assert receipt.status is Status.CONFIRMED
        ids["confirmed"].add(receipt.message_id)
    broker.reject_next(1)
    with pytest.raises(Rejected) as caught:
        producer.send("q", b"poison")
    ids["failed"].add(str(caught.value.message_id))
    batch = producer.send_batch("q", [b"b%d" % i for i in range(30)])
    assert batch.confirmed == 30
    ids["confirmed"].update(batch.message_ids)
    # Last: after a refusal, sends go straight to the outbox for a moment.
    broker.refuse_writes()
    for i in range(10):
        receipt = producer.send("q", b"s%d" % i)
        assert receipt.status is Status.STORED
        ids["stored"].add(receipt.message_id)
    broker.accept_writes()
    assert producer.drain(10) == 0
    return ids


def _check_stats(producer: Producer, ids: dict[str, set[str]], *, traced: bool) -> None:
    stats = producer.stats()
    assert stats.sent == sum(len(v) for v in ids.values()) == 61
    assert stats.confirmed == len(ids["confirmed"])
    assert stats.stored == len(ids["stored"])
    assert dict(stats.failed) == {"Rejected": 1}
    assert stats.in_flight == 0
    assert stats.drained == len(ids["stored"])
    assert stats.outbox_depth == 0 and stats.outbox_oldest_age_s is None
    if traced:  # latency is measured with OpenTelemetry on only
        assert stats.confirm_latency_mean_s is not None and stats.confirm_latency_mean_s >= 0
    else:
        assert stats.confirm_latency_mean_s is None


def test_stats_add_up_without_opentelemetry(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    url = f"memory://{memory_broker.name}"
    with Producer(url, outbox=tmp_path / "o.db", retry=FAST) as producer:
        ids = _traffic(memory_broker, producer)
        _check_stats(producer, ids, traced=False)
    sent = set().union(ids["confirmed"], ids["stored"])
    with Consumer(url) as consumer:
        consumer.subscribe("q")
        received: set[str] = set()
        requeued = 0
        while received != sent:
            for delivery in consumer.poll(5, max_messages=64):
                if delivery.message_id in received and requeued == 0:
                    pytest.fail("a message came twice before any requeue")
                if requeued < 3 and delivery.message_id not in received:
                    requeued += 1
                    delivery.nack()
                    continue
                received.add(str(delivery.message_id))
                delivery.ack()
        stats = consumer.stats()
    assert stats.acked == len(sent) == 60
    assert stats.requeued == 3
    assert stats.received == stats.acked + stats.requeued
    assert stats.unsettled == 0 and stats.rejected == 0


def test_spans_and_metrics_add_up(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    install()
    url = f"memory://{memory_broker.name}"
    with Producer(url, outbox=tmp_path / "o.db", retry=FAST, telemetry=True) as producer:
        target = producer.target
        ids = _traffic(memory_broker, producer)
        _check_stats(producer, ids, traced=True)
        assert metric_total(target, "msgsafe.outbox.depth") == 0
        assert metric_total(target, "msgsafe.outbox.drained") == 10
    assert metric_total(target, "msgsafe.producer.sent") == 61
    assert metric_total(target, "msgsafe.producer.confirmed") == 50
    assert metric_total(target, "msgsafe.producer.stored") == 10
    assert metric_total(target, "msgsafe.producer.failed", **{"error.type": "Rejected"}) == 1
    assert metric_total(target, "msgsafe.producer.confirm_latency") == 21  # 20 sends, 1 batch

    sends = [s for s in spans_of(target) if s.kind is trace.SpanKind.PRODUCER]
    assert len(sends) == 32  # 31 sends, 1 batch
    by_id = {s.attributes.get("messaging.message.id"): s for s in sends if s.attributes}
    for message_id in ids["confirmed"] - set(by_id):  # the batch's messages
        assert message_id
    for message_id in ids["stored"]:
        span = by_id[message_id]
        assert span.attributes and span.attributes["msgsafe.outcome"] == "STORED"
        assert [e.name for e in span.events] == ["msgsafe.outbox.detour"]
    (poison,) = ids["failed"]
    assert by_id[poison].status.status_code is trace.StatusCode.ERROR
    (batch_span,) = [
        s for s in sends if s.attributes and "messaging.batch.message_count" in s.attributes
    ]
    assert batch_span.attributes and batch_span.attributes["messaging.batch.message_count"] == 30
    assert batch_span.attributes["messaging.system"] == "memory"

    # A consumed message's span is linked to the span that sent it (through the headers).
    with Consumer(url, telemetry=True) as consumer:
        consumer.subscribe("q")
        seen: set[str] = set()
        while len(seen) < 60:
            for delivery in consumer.poll(5, max_messages=64):
                seen.add(str(delivery.message_id))
                delivery.ack()
        consumer_target = consumer.target
    processed = [s for s in spans_of(consumer_target) if s.kind is trace.SpanKind.CONSUMER]
    assert len(processed) == 60
    producer_spans = {s.context.span_id: s for s in sends}
    for span in processed:
        assert span.attributes and span.attributes["msgsafe.outcome"] == "accept"
        (link,) = span.links
        sender = producer_spans[link.context.span_id]
        mid = span.attributes["messaging.message.id"]
        assert sender is batch_span or (sender.attributes or {}).get("messaging.message.id") == mid
    assert (
        metric_total(consumer_target, "msgsafe.consumer.settled", **{"msgsafe.outcome": "accept"})
        == 60
    )


class _Breaking(SpanProcessor):
    """A span processor that raises while ``on`` is set (a broken exporter pipeline)."""

    on = False

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.on:
            raise RuntimeError("processor broke")

    def on_end(self, span: Any) -> None:
        if self.on:
            raise RuntimeError("processor broke")


def test_a_broken_processor_never_breaks_sending(memory_broker: MemoryBroker) -> None:
    install()
    provider = trace.get_tracer_provider()
    breaking = _Breaking()
    provider.add_span_processor(breaking)  # type: ignore[attr-defined]
    breaking.on = True
    try:
        with Producer(f"memory://{memory_broker.name}", outbox=False, telemetry=True) as producer:
            receipts = [producer.send("q", b"x") for _ in range(5)]
            batch = producer.send_batch("q", [b"y"] * 5)
            assert producer.stats().confirmed == 10
    finally:
        breaking.on = False
    assert all(r.status is Status.CONFIRMED for r in receipts) and batch.confirmed == 5
    assert len(memory_broker.ids("q")) == 10


class _Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        self.events.append(("failover", previous, endpoint, reason))

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        self.events.append(("redirect", previous, endpoint, reason))

    def reachable(self, endpoint: str) -> None:
        self.events.append(("reachable", "", endpoint, ""))


def test_endpoint_list_reports_a_failover_only_after_a_new_connection() -> None:
    heard = _Heard()
    a, b = Endpoint("a", 1), Endpoint("b", 2)
    with observing(heard):
        endpoints = EndpointList([a, b])
    assert endpoints.next()[0] == a
    endpoints.succeeded(a)  # the first connection: no fail-over
    endpoints.succeeded(a)  # a channel reopened on the same connection: none either
    assert heard.events == []
    assert endpoints.next()[0] == b  # the connection was lost: dial again
    endpoints.succeeded(b)
    assert endpoints.next()[0] == a
    endpoints.succeeded(a)
    assert heard.events == [
        ("failover", "a:1", "b:2", "next-endpoint"),
        ("failover", "b:2", "a:1", "next-endpoint"),
    ]
    assert EndpointList([a])._observer is None  # outside observing(): nobody, no cost
