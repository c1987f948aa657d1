"""Seeing what msgsafe does: ``stats()``, OpenTelemetry spans, and an asyncio consumer.

Run:  python3 examples/observability.py

A producer with ``telemetry=True`` sends 20 messages, the broker refuses writes for a
moment (5 more go to the outbox, then drain), and an ``AsyncConsumer`` reads them all
back. The OpenTelemetry SDK here exports to memory; in a service you would configure
an OTLP exporter instead. ``stats()`` works without OpenTelemetry installed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import msgsafe
from msgsafe.testing import MemoryBroker

#: The in-process broker, whose refusals stand for an outage.
URL = "memory://examples-observability"


async def consume(url: str, destination: str, expected: set[str]) -> set[str]:
    received: set[str] = set()
    async with msgsafe.AsyncConsumer(url, telemetry=True) as consumer:
        await consumer.subscribe(destination)
        async for delivery in consumer:
            received.add(str(delivery.message_id))
            await delivery.ack()
            if expected <= received:
                break
        stats = consumer.stats()
    print(f"consumer: received {stats.received}, acked {stats.acked}")
    return received


def main() -> int:
    url = URL
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    broker = MemoryBroker.install(MemoryBroker(url.removeprefix("memory://")))
    destination = f"obs-{uuid.uuid4().hex[:8]}"
    sent: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        with msgsafe.Producer(url, outbox=Path(tmp) / "outbox.db", telemetry=True) as producer:
            sent.update(producer.send(destination, b"%d" % n).message_id for n in range(20))
            broker.refuse_writes()  # an outage: these go to the outbox
            sent.update(producer.send(destination, b"late %d" % n).message_id for n in range(5))
            broker.accept_writes()
            producer.drain(10)
            stats = producer.stats()
        print(
            f"producer: sent {stats.sent}, confirmed {stats.confirmed}, stored {stats.stored}, "
            f"drained {stats.drained}, in flight {stats.in_flight}"
        )
    received = asyncio.run(consume(url, destination, sent))
    kinds = Counter(span.kind.name for span in spans.get_finished_spans())
    detours = sum(
        1 for s in spans.get_finished_spans() for e in s.events if e.name == "msgsafe.outbox.detour"
    )
    print(f"spans: PRODUCER {kinds['PRODUCER']}, CONSUMER {kinds['CONSUMER']}, detours {detours}")
    print(f"lost {len(sent - received)}")
    return 0 if sent <= received else 1


if __name__ == "__main__":
    sys.exit(main())
