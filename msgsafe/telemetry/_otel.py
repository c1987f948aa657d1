"""OpenTelemetry spans and metrics, imported only when a producer or consumer is built
with ``telemetry=True``.

Only ``opentelemetry-api`` is needed here: without an SDK configured by the application,
the API's no-op tracer and meter take everything. Names follow the messaging semantic
conventions (``messaging.system``, ``messaging.destination.name``,
``messaging.message.id``, ``messaging.batch.message_count``, ``messaging.operation.type``);
what is msgsafe's own (the outcome, the outbox) is under ``msgsafe.``.

Every call from the send path is guarded by the caller (:mod:`msgsafe.telemetry.producer`):
an error in an exporter or a processor is logged, never raised into ``send()``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from msgsafe.errors import MissingExtra

try:
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Link, Span, SpanKind, StatusCode
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("otel", "opentelemetry-api") from exc

__all__ = ["OtelConsumer", "OtelProducer", "Span", "system_of"]

log = logging.getLogger("msgsafe.telemetry")

_SCOPE = "msgsafe"
_SYSTEMS = {"rabbitmq": "rabbitmq", "kafka": "kafka", "amqp10": "amqp1.0", "memory": "memory"}


def system_of(protocol: str) -> str:
    """The ``messaging.system`` value of an adapter's protocol."""
    return _SYSTEMS.get(protocol, protocol)


class _Gauged(Protocol):
    attributes: Mapping[str, str]

    def gauges(self) -> Mapping[str, float]: ...


class _Instruments:
    """One set of instruments per process; observable ones read every live source."""

    def __init__(self) -> None:
        meter = metrics.get_meter(_SCOPE)
        count = meter.create_counter
        self.sent = count("msgsafe.producer.sent", "{message}", "messages accepted by send")
        self.confirmed = count("msgsafe.producer.confirmed", "{message}", "confirmed by the broker")
        self.stored = count("msgsafe.producer.stored", "{message}", "committed to the outbox")
        self.failed = count("msgsafe.producer.failed", "{message}", "neither confirmed nor stored")
        self.failovers = count(
            "msgsafe.connection.failovers", "{event}", "new connection after a lost one"
        )
        self.redirects = count("msgsafe.connection.redirects", "{event}", "redirects followed")
        self.received = count("msgsafe.consumer.received", "{message}", "deliveries handed over")
        self.settled = count("msgsafe.consumer.settled", "{message}", "deliveries settled")
        self.latency = meter.create_histogram(
            "msgsafe.producer.confirm_latency", "s", "send to broker confirm"
        )
        self.sources: weakref.WeakSet[_Gauged] = weakref.WeakSet()
        for name, unit, text in (
            ("msgsafe.producer.in_flight", "{message}", "sent, not yet settled"),
            ("msgsafe.outbox.depth", "{message}", "messages waiting in the outbox"),
            ("msgsafe.outbox.oldest_age", "s", "age of the oldest message in the outbox"),
        ):
            meter.create_observable_gauge(name, [self._reader(name)], unit, text)
        meter.create_observable_counter(
            "msgsafe.outbox.drained",
            [self._reader("msgsafe.outbox.drained")],
            "{message}",
            "delivered from the outbox",
        )

    def _reader(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            found = []
            for source in list(self.sources):
                try:
                    value = source.gauges().get(name)
                except Exception:  # a closed store, a broken callback: skip, never raise
                    log.debug("telemetry gauge %s unreadable", name, exc_info=True)
                    continue
                if value is not None:
                    found.append(Observation(value, dict(source.attributes)))
            return found

        return read


_LOCK = threading.Lock()
_INSTRUMENTS: _Instruments | None = None


def _instruments() -> _Instruments:
    global _INSTRUMENTS
    with _LOCK:
        if _INSTRUMENTS is None:
            _INSTRUMENTS = _Instruments()
        return _INSTRUMENTS


class _Side:
    """What a producer and a consumer share: attributes, fail-over and redirect events."""

    def __init__(self, protocol: str, target: str, server: str) -> None:
        self.inst = _instruments()
        self.tracer = trace.get_tracer(_SCOPE)
        self.attributes: Mapping[str, str] = {
            "messaging.system": system_of(protocol),
            "server.address": server,
            "msgsafe.target": target,
        }
        self._lock = threading.Lock()
        #: Spans not ended yet: fail-overs and redirects are events on each of them.
        self._open: dict[int, Span] = {}

    def opened(self, span: Span) -> None:
        with self._lock:
            self._open[id(span)] = span

    def closed(self, span: Span) -> None:
        with self._lock:
            self._open.pop(id(span), None)

    def connection_event(self, kind: str, previous: str, endpoint: str, reason: str) -> None:
        """A fail-over or redirect: counted, an event on every open span, and a span of
        its own so that it shows in a trace even while nothing is in flight."""
        counter = self.inst.failovers if kind == "failover" else self.inst.redirects
        counter.add(1, {**self.attributes, "msgsafe.reason": reason})
        event = {"msgsafe.from": previous, "msgsafe.to": endpoint, "msgsafe.reason": reason}
        with self._lock:
            spans = list(self._open.values())
        for span in spans:
            span.add_event(f"msgsafe.{kind}", event)
        with self.tracer.start_as_current_span(
            f"msgsafe.{kind}", attributes=self.attributes
        ) as own:
            own.add_event(f"msgsafe.{kind}", event)


class OtelProducer(_Side):
    """A producer's spans (one per send or batch) and metrics."""

    def __init__(
        self, protocol: str, target: str, server: str, gauges: Callable[[], Mapping[str, float]]
    ) -> None:
        super().__init__(protocol, target, server)
        self.gauges = gauges
        self.inst.sources.add(self)

    def start(
        self, destination: str, headers: Mapping[str, str] | None, count: int | None
    ) -> tuple[dict[str, str], Span]:
        """A PRODUCER span for a send, and the headers carrying its context."""
        attributes: dict[str, Any] = {
            **self.attributes,
            "messaging.destination.name": destination,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        span = self.tracer.start_span(
            f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        carrier = dict(headers) if headers else {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        self.opened(span)
        return carrier, span

    def sent(self, count: int, destination: str) -> None:
        self.inst.sent.add(count, {**self.attributes, "messaging.destination.name": destination})

    def settled(
        self,
        span: Span | None,
        destination: str,
        *,
        message_id: str | None,
        confirmed: int,
        stored: int,
        failed: Mapping[str, int],
        error: BaseException | None,
        latency_s: float | None,
    ) -> None:
        """Metrics for a settled send or batch, and its span ended with the outcome."""
        attrs = {**self.attributes, "messaging.destination.name": destination}
        if confirmed:
            self.inst.confirmed.add(confirmed, attrs)
            if latency_s is not None:
                self.inst.latency.record(latency_s, attrs)
        if stored:
            self.inst.stored.add(stored, attrs)
        for kind, number in failed.items():
            self.inst.failed.add(number, {**attrs, "error.type": kind})
        if span is None:
            return
        self.closed(span)
        if message_id is not None:
            span.set_attribute("messaging.message.id", message_id)
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.record_exception(error)
            span.set_status(StatusCode.ERROR, str(error))
        else:
            outcome = "STORED" if stored and not confirmed else "CONFIRMED"
            span.set_attribute("msgsafe.outcome", outcome)
            if confirmed and stored:
                span.set_attribute("msgsafe.confirmed", confirmed)
                span.set_attribute("msgsafe.stored", stored)
        if stored:
            span.add_event("msgsafe.outbox.detour", {"msgsafe.stored": stored})
        span.end()


class OtelConsumer(_Side):
    """A consumer's spans (one per delivery, linked to its producer's) and metrics."""

    def received(
        self, destination: str, message_id: str | None, headers: Mapping[str, str]
    ) -> Span:
        """A CONSUMER span for a delivery, linked to the span that sent it (its headers)."""
        attrs = {**self.attributes, "messaging.destination.name": destination}
        self.inst.received.add(1, attrs)
        context = trace.get_current_span(propagate.extract(dict(headers))).get_span_context()
        links = [Link(context)] if context.is_valid else None
        attributes: dict[str, Any] = {**attrs, "messaging.operation.type": "process"}
        if message_id is not None:
            attributes["messaging.message.id"] = message_id
        span = self.tracer.start_span(
            f"process {destination}", kind=SpanKind.CONSUMER, links=links, attributes=attributes
        )
        self.opened(span)
        return span

    def settled(self, span: Span, destination: str, outcome: str) -> None:
        attrs = {**self.attributes, "messaging.destination.name": destination}
        self.inst.settled.add(1, {**attrs, "msgsafe.outcome": outcome})
        self.closed(span)
        span.set_attribute("msgsafe.outcome", outcome)
        span.end()
