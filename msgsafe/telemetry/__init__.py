"""Seeing what msgsafe does: ``Producer.stats()`` / ``Consumer.stats()`` snapshots
(always available), and OpenTelemetry spans and metrics with ``telemetry=True``
(``pip install 'msgsafe[otel]'``; only ``opentelemetry-api`` is required, the
application configures the SDK and exporters).

Spans: one PRODUCER span per ``send`` / ``send_batch`` (``send {destination}``) whose
context travels in the message headers (W3C ``traceparent``), one CONSUMER span per
delivery (``process {destination}``) linked to it; fail-overs, redirects and outbox
detours are events on the spans in flight. Metrics: ``msgsafe.producer.sent``,
``.confirmed``, ``.stored``, ``.failed`` (by ``error.type``), ``.in_flight``,
``.confirm_latency``; ``msgsafe.outbox.depth``, ``.oldest_age``, ``.drained``;
``msgsafe.connection.failovers``, ``.redirects`` (by ``msgsafe.reason``);
``msgsafe.consumer.received``, ``.settled`` (by ``msgsafe.outcome``).
"""

from __future__ import annotations

from msgsafe.telemetry.stats import ConsumerStats, ProducerStats

__all__ = ["ConsumerStats", "ProducerStats"]
