"""OpenTelemetry spans and metrics, imported only when a producer or consumer is built
with ``telemetry=True``.

Only ``opentelemetry-api`` is needed here: without an SDK configured by the application,
the API's no-op tracer and meter take everything. Names follow the messaging semantic
conventions (``messaging.system``, ``messaging.destination.name``,
``messaging.message.id``, ``messaging.batch.message_count``, ``messaging.operation.type``);
what is msgsafe's own (the outcome, the outbox) is under ``msgsafe.``.

Every call from the send path is guarded by the caller (:mod:`msgsafe.telemetry.producer`):
an error in an exporter or a processor is logged, never raised into ``send()``.

The send path does what the SDK needs and little else (``benchmarks/README.md``,
"Telemetry"): the attributes of a destination are built once, a span's context is written
as a ``traceparent`` directly while the default propagators are installed, the registry
of open spans takes no lock, and a span that is not recording gets no attributes or
events. A single send's span ends in its receipt's callback: for a blocking ``send()``
on the caller's thread once it is awake (0.5 to 0.8 points of wall time less than on
the I/O thread before the caller runs, in paired runs), otherwise on the thread that
resolved it. Handing spans to a thread of their own to end them in bulk was measured
(three runs of ``benchmarks/bench_telemetry.py`` against this way, side by side) to cost
7 to 39 us more client CPU per send, for no wall-time gain beyond the noise; ending one
costs about 6 us.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from msgsafe.errors import MissingExtra

try:
    from opentelemetry import baggage, metrics, propagate, trace
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.context import get_current
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, Span, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("otel", "opentelemetry-api") from exc

__all__ = ["Figures", "OtelConsumer", "OtelProducer", "Span", "system_of"]

log = logging.getLogger("msgsafe.telemetry")

_SCOPE = "msgsafe"
_SYSTEMS = {"rabbitmq": "rabbitmq", "kafka": "kafka", "amqp10": "amqp1.0", "memory": "memory"}


def system_of(protocol: str) -> str:
    """The ``messaging.system`` value of an adapter's protocol."""
    return _SYSTEMS.get(protocol, protocol)


#: What a source reports at a collection: metric name -> [(value, extra attributes)].
Figures = Mapping[str, Sequence[tuple[float, Mapping[str, str]]]]


class _Source(Protocol):
    attributes: Mapping[str, str]

    def figures(self) -> Figures: ...

    def flush(self) -> None:
        """Record what was buffered since the last collection."""
        ...


#: Counters read at collection time from the stats counters (nothing is recorded per
#: message): name, unit, description.
_COUNTERS = (
    ("msgsafe.producer.sent", "{message}", "messages accepted by send"),
    ("msgsafe.producer.confirmed", "{message}", "confirmed by the broker"),
    ("msgsafe.producer.stored", "{message}", "committed to the outbox"),
    ("msgsafe.producer.failed", "{message}", "neither confirmed nor stored, by error.type"),
    ("msgsafe.outbox.drained", "{message}", "delivered from the outbox"),
    ("msgsafe.connection.failovers", "{event}", "new connections after a lost one"),
    ("msgsafe.connection.redirects", "{event}", "redirects followed"),
    ("msgsafe.consumer.received", "{message}", "deliveries handed to the application"),
    ("msgsafe.consumer.settled", "{message}", "deliveries settled, by msgsafe.outcome"),
)
_GAUGES = (
    ("msgsafe.producer.in_flight", "{message}", "sent, not yet settled"),
    ("msgsafe.outbox.depth", "{message}", "messages waiting in the outbox"),
    ("msgsafe.outbox.oldest_age", "s", "age of the oldest message in the outbox"),
)


#: The collection of this metric records the latencies buffered since the last one.
_FLUSH_ON = "msgsafe.producer.sent"
#: Latencies kept for the histogram between collections; beyond, new ones are dropped.
_MAX_BUFFERED = 100_000
#: Destinations whose span name and attributes are kept per producer or consumer.
_MAX_DESTINATIONS = 1024
_ONE_STORED: Mapping[str, int] = {"msgsafe.stored": 1}
_MESSAGE_ID = "messaging.message.id"
_PRODUCER = SpanKind.PRODUCER


def _plain(textmap: TextMapPropagator) -> bool:
    """True for the propagators OpenTelemetry installs by default: W3C trace context and
    W3C baggage, in that order (``OTEL_PROPAGATORS`` unset)."""
    parts = getattr(textmap, "_propagators", None)  # CompositePropagator keeps them there
    return (
        type(textmap) is CompositePropagator
        and isinstance(parts, (list, tuple))
        and [type(part) for part in parts] == [TraceContextTextMapPropagator, W3CBaggagePropagator]
    )


#: The global propagator last seen and whether it is the default one.
_seen: tuple[TextMapPropagator | None, bool] = (None, False)


def inject(carrier: dict[str, str], span: Span) -> None:
    """Write ``span``'s context into ``carrier`` as the global propagator would.

    With the default propagators, no baggage in the current context and no trace state,
    that is one ``traceparent`` header, written here directly (the same text the W3C
    propagator writes; ``tests/unit/telemetry/test_send_path.py`` compares them). Anything
    else goes through ``propagate.inject``.
    """
    global _seen
    textmap = propagate.get_global_textmap()
    seen, plain = _seen
    if textmap is not seen:
        plain = _plain(textmap)
        _seen = (textmap, plain)
    context = span.get_span_context()
    current = get_current()  # empty (no span, no baggage) around many sends: one call
    if plain and not context.trace_state and (not current or not baggage.get_all(current)):
        if context.is_valid:
            # %-formatting: a third cheaper than an f-string's format specs here.
            carrier["traceparent"] = "00-%032x-%016x-%02x" % (  # noqa: UP031
                context.trace_id,
                context.span_id,
                context.trace_flags,
            )
        return
    propagate.inject(carrier, context=trace.set_span_in_context(span))


class _Instruments:
    """One set of instruments per process, observed at collection time from every live
    producer and consumer: the send path pays nothing for metrics. Confirm latencies
    are buffered per producer and recorded into the histogram at each collection
    (NOTE: the SDK's per-record attribute handling costs more than a whole send)."""

    def __init__(self) -> None:
        meter = metrics.get_meter(_SCOPE)
        self.latency = meter.create_histogram(
            "msgsafe.producer.confirm_latency", "s", "send to broker confirm"
        )
        self.sources: weakref.WeakSet[_Source] = weakref.WeakSet()
        for name, unit, text in _COUNTERS:
            meter.create_observable_counter(name, [self._reader(name)], unit, text)
        for name, unit, text in _GAUGES:
            meter.create_observable_gauge(name, [self._reader(name)], unit, text)

    def _reader(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            found = []
            for source in list(self.sources):
                try:
                    if name == _FLUSH_ON:
                        source.flush()
                    points = source.figures().get(name, ())
                except Exception:  # a closed store, a broken callback: skip, never raise
                    log.debug("telemetry figure %s unreadable", name, exc_info=True)
                    continue
                for value, extra in points:
                    found.append(Observation(value, {**source.attributes, **extra}))
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
        #: Spans not ended yet: fail-overs and redirects are events on each of them. A
        #: dict's single store, pop and ``list(values())`` are atomic under the GIL: no
        #: lock on the send path. Spans that do not record are not kept.
        self._open: dict[int, Span] = {}
        #: Per destination: the span's name and its attributes (built once, not per send).
        self._named: dict[str, tuple[str, dict[str, Any]]] = {}

    def opened(self, span: Span) -> None:
        self._open[id(span)] = span

    def closed(self, span: Span) -> None:
        self._open.pop(id(span), None)

    def named(self, verb: str, destination: str, operation: str) -> tuple[str, dict[str, Any]]:
        """The name and attributes of a span on ``destination``, built once per destination
        (bounded: a producer writing to ever new destinations rebuilds, never grows)."""
        found = self._named.get(destination)
        if found is None:
            if len(self._named) >= _MAX_DESTINATIONS:
                self._named.clear()
            found = self._named[destination] = (
                f"{verb} {destination}",
                {
                    **self.attributes,
                    "messaging.destination.name": destination,
                    "messaging.operation.type": operation,
                },
            )
        return found

    def connection_event(self, kind: str, previous: str, endpoint: str, reason: str) -> None:
        """A fail-over or redirect (counted by the stats counters): an event on every open
        span, and a span of its own so that it shows in a trace while nothing is in flight."""
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
        self, protocol: str, target: str, server: str, figures: Callable[[], Figures]
    ) -> None:
        super().__init__(protocol, target, server)
        self.figures = figures
        self._latencies: list[float] = []
        self.inst.sources.add(self)

    def flush(self) -> None:
        with self._lock:
            latencies, self._latencies = self._latencies, []
        record = self.inst.latency.record
        for value in latencies:
            record(value, self.attributes)

    def start_batch(
        self, destination: str, headers: Mapping[str, str] | None, count: int
    ) -> tuple[dict[str, str], Span]:
        """A PRODUCER span for a batch of ``count`` messages, and the headers carrying
        its context."""
        name, attributes = self.named("send", destination, "send")
        span = self.tracer.start_span(
            name,
            kind=_PRODUCER,
            attributes={**attributes, "messaging.batch.message_count": count},
        )
        carrier = dict(headers) if headers else {}
        inject(carrier, span)
        if span.is_recording():
            self.opened(span)
        return carrier, span

    def start_one(
        self, destination: str, headers: Mapping[str, str], message_id: str
    ) -> tuple[dict[str, str], Span]:
        """A PRODUCER span for one message, and the headers carrying its context: the
        span of every single send, so the fewest steps (its attributes are the
        destination's, built once, and the message's id)."""
        found = self._named.get(destination)
        name, attributes = found if found is not None else self.named("send", destination, "send")
        span = self.tracer.start_span(
            name, kind=_PRODUCER, attributes={**attributes, _MESSAGE_ID: message_id}
        )
        carrier = dict(headers) if headers else {}
        inject(carrier, span)
        if span.is_recording():
            self._open[id(span)] = span
        return carrier, span

    def buffer_latency(self, latency_s: float) -> None:
        """A confirm latency for the histogram, recorded at the next collection.
        ``list.append`` is atomic: no lock. Bounded: without a metric reader nothing
        collects, and a long-lived producer must not grow."""
        if len(self._latencies) < _MAX_BUFFERED:
            self._latencies.append(latency_s)

    def settled_one(self, span: Span, latency_s: float | None) -> None:
        """A single send confirmed after ``latency_s`` seconds (None: stored), all in
        one place: its latency buffered, its outcome set, its span ended."""
        if latency_s is not None and len(self._latencies) < _MAX_BUFFERED:
            self._latencies.append(latency_s)  # see buffer_latency
        if span.is_recording():
            self._open.pop(id(span), None)
            if latency_s is not None:
                span.set_attribute("msgsafe.outcome", "CONFIRMED")
            else:
                span.set_attribute("msgsafe.outcome", "STORED")
                span.add_event("msgsafe.outbox.detour", _ONE_STORED)
        span.end()

    def settled(
        self,
        span: Span | None,
        *,
        confirmed: int,
        stored: int,
        failed: Mapping[str, int],
        error: BaseException | None,
        latency_s: float | None,
    ) -> None:
        """A settled send or batch: its latency recorded when confirmed, its span ended
        with the outcome."""
        if confirmed and latency_s is not None:
            self.buffer_latency(latency_s)
        if span is None:
            return
        if not span.is_recording():
            span.end()
            return
        self.closed(span)
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

    def __init__(
        self, protocol: str, target: str, server: str, figures: Callable[[], Figures]
    ) -> None:
        super().__init__(protocol, target, server)
        self.figures = figures
        self.inst.sources.add(self)

    def flush(self) -> None:
        """Nothing buffered on the consumer side."""

    def received(
        self, destination: str, message_id: str | None, headers: Mapping[str, str]
    ) -> Span:
        """A CONSUMER span for a delivery, linked to the span that sent it (its headers)."""
        name, attributes = self.named("process", destination, "process")
        context = trace.get_current_span(propagate.extract(dict(headers))).get_span_context()
        links = [Link(context)] if context.is_valid else None
        if message_id is not None:
            attributes = {**attributes, "messaging.message.id": message_id}
        span = self.tracer.start_span(
            name, kind=SpanKind.CONSUMER, links=links, attributes=attributes
        )
        if span.is_recording():
            self.opened(span)
        return span

    def settled(self, span: Span, outcome: str) -> None:
        if span.is_recording():
            self.closed(span)
            span.set_attribute("msgsafe.outcome", outcome)
        span.end()
