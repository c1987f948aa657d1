"""The traced send path's shortcuts. It writes a span's ``traceparent`` itself while the
default propagators are installed: the headers must be what ``propagate.inject`` writes,
and anything the short way cannot carry (baggage, trace state, another propagator) must
go the long way. A span the sampler dropped still carries its context but gets no
attributes and is not kept; latencies wait for a metric reader in a bounded buffer."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from opentelemetry import baggage, context, propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope, Receipt, Status
from msgsafe.telemetry import _otel
from msgsafe.telemetry._otel import inject
from msgsafe.telemetry.producer import ProducerTelemetry
from tests.support.otel import install, trace


def _span(flags: int = 1, state: TraceState | None = None) -> NonRecordingSpan:
    ctx = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(flags),
        trace_state=state,
    )
    return NonRecordingSpan(ctx)


def _reference(span: NonRecordingSpan) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


@pytest.fixture
def default_propagators() -> Iterator[None]:
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    try:
        yield
    finally:
        propagate.set_global_textmap(before)


@pytest.mark.usefixtures("default_propagators")
@pytest.mark.parametrize("flags", [0, 1, 2, 3])
def test_the_short_way_writes_what_the_propagator_writes(flags: int) -> None:
    span = _span(flags)
    carrier: dict[str, str] = {"app": "kept"}
    inject(carrier, span)
    assert carrier == {"app": "kept", **_reference(span)}
    expected = f"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-0{flags}"
    assert carrier["traceparent"] == expected


@pytest.mark.usefixtures("default_propagators")
def test_trace_state_and_baggage_take_the_long_way() -> None:
    span = _span(state=TraceState([("vendor", "v1")]))
    carrier: dict[str, str] = {}
    inject(carrier, span)
    assert carrier == _reference(span) and carrier["tracestate"] == "vendor=v1"

    token = context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        plain = _span()
        carrier = {}
        inject(carrier, plain)
        assert carrier == _reference(plain) and carrier["baggage"] == "tenant=t1"
    finally:
        context.detach(token)


@pytest.mark.usefixtures("default_propagators")
def test_an_invalid_span_writes_nothing() -> None:
    carrier: dict[str, str] = {}
    inject(carrier, NonRecordingSpan(SpanContext(0, 0, False)))
    assert carrier == {}


def test_another_propagator_is_used_as_installed() -> None:
    install()
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())  # not the default pair
    try:
        token = context.attach(baggage.set_baggage("tenant", "t1"))
        try:
            span = _span()
            carrier: dict[str, str] = {}
            inject(carrier, span)
            assert carrier == _reference(span) and "baggage" not in carrier
        finally:
            context.detach(token)
    finally:
        propagate.set_global_textmap(before)


def _settle(telemetry: ProducerTelemetry, envelope: Envelope) -> dict[str, str]:
    """One traced send of ``envelope``, confirmed; the headers it was sent with."""
    traced, span = telemetry.start(envelope)
    future: Future[Receipt] = Future()
    telemetry.track(future, span)
    future.set_result(Receipt(envelope.message_id, Status.CONFIRMED, envelope.destination))
    return dict(traced.headers)


def test_a_sampled_out_span_carries_its_context_and_nothing_else() -> None:
    install()
    telemetry = ProducerTelemetry(parse_url("amqp://127.0.0.1"), otel=True)
    otel = telemetry._otel
    assert otel is not None
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.tracer = provider.get_tracer("msgsafe")
    headers = _settle(telemetry, Envelope.build("q", b"x", headers={"app": "kept"}))
    assert headers["app"] == "kept"
    assert int(headers["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # not sampled
    assert otel._open == {} and exporter.get_finished_spans() == ()
    assert telemetry.stats().sent == 1


def test_latencies_wait_for_a_reader_in_a_bounded_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    install()
    monkeypatch.setattr(_otel, "_MAX_BUFFERED", 5)
    telemetry = ProducerTelemetry(parse_url("amqp://127.0.0.1"), otel=True)
    otel = telemetry._otel
    assert otel is not None
    for _ in range(8):
        _settle(telemetry, Envelope.build("q", b"x"))
    assert len(otel._latencies) == 5  # no collection happened: the rest were dropped
    assert otel._open == {}
    stats = telemetry.stats()
    assert stats.sent == 8 and stats.confirm_latency_mean_s is not None
    otel.flush()
    assert otel._latencies == []
