"""A blocking send's span ends on the caller's thread once it has its receipt, not on
the I/O thread that resolved the receipt before the caller could run; a wait that
ends first (a timeout) leaves the span to end when the receipt resolves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope, Receipt, Status
from msgsafe.telemetry.producer import ProducerTelemetry
from tests.support.otel import install


class _Ended(SpanProcessor):
    """Every ended span and the name of the thread that ended it."""

    def __init__(self) -> None:
        self.ended: list[tuple[ReadableSpan, str]] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append((span, threading.current_thread().name))


def _traced() -> tuple[ProducerTelemetry, _Ended]:
    install()
    telemetry = ProducerTelemetry(parse_url("amqp://127.0.0.1"), otel=True)
    assert telemetry._otel is not None
    ended = _Ended()
    provider = TracerProvider()
    provider.add_span_processor(ended)
    telemetry._otel.tracer = provider.get_tracer("msgsafe")
    return telemetry, ended


def _on_io_thread(future: Future[Receipt], message_id: str) -> None:
    io = threading.Thread(
        target=future.set_result, args=(Receipt(message_id, Status.CONFIRMED, "q"),), name="io"
    )
    io.start()
    io.join(10)


def _blocking_send(
    telemetry: ProducerTelemetry,
) -> tuple[Future[Receipt], Callable[[Future[Receipt]], None], str]:
    """What send() does before it waits: the receipt, what ends the span, the id."""
    traced, span = telemetry.start(Envelope.build("q", b"x"))
    future: Future[Receipt] = Future()
    end = telemetry.track(future, span, waited=True)
    assert end is not None
    return future, end, traced.message_id


def test_the_caller_ends_its_span_after_the_receipt_resolved() -> None:
    telemetry, ended = _traced()
    future, end, message_id = _blocking_send(telemetry)
    _on_io_thread(future, message_id)
    assert ended.ended == []  # the I/O thread resolved the receipt and ended nothing
    future.add_done_callback(end)  # what send() does once future.result() returned
    ((finished, thread),) = ended.ended
    assert thread == threading.current_thread().name
    assert finished.attributes and finished.attributes["msgsafe.outcome"] == "CONFIRMED"
    stats = telemetry.stats()
    assert stats.sent == 1 and stats.confirm_latency_mean_s is not None


def test_a_wait_that_ended_first_leaves_the_span_to_the_receipt() -> None:
    telemetry, ended = _traced()
    future, end, message_id = _blocking_send(telemetry)
    future.add_done_callback(end)  # send() timed out: the receipt is still pending
    assert ended.ended == []
    _on_io_thread(future, message_id)
    ((_, thread),) = ended.ended
    assert thread == "io"


def test_send_async_spans_still_end_when_the_receipt_resolves() -> None:
    telemetry, ended = _traced()
    traced, span = telemetry.start(Envelope.build("q", b"x"))
    future: Future[Receipt] = Future()
    assert telemetry.track(future, span) is None
    _on_io_thread(future, traced.message_id)
    ((_, thread),) = ended.ended
    assert thread == "io"
