"""A send's span is ended off the thread that resolved its receipt: that thread only
notes the outcome and the time, the span finisher's thread ends the span moments later
with that time; ``close()`` ends what is left, and a processor that raises there is
logged and the finisher goes on."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope, Receipt, Status
from msgsafe.telemetry._finish import FINISHER
from msgsafe.telemetry.producer import ProducerTelemetry
from tests.support.otel import install


class _Ended(SpanProcessor):
    """Every ended span and the thread that ended it; raises while ``broken``."""

    def __init__(self) -> None:
        self.ended: list[tuple[ReadableSpan, str]] = []
        self.broken = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.broken:
            self.broken = False
            raise RuntimeError("processor broke")
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


def _resolve_on_io_thread(telemetry: ProducerTelemetry, status: Status) -> tuple[int, int]:
    """One traced send whose receipt resolves on a thread named ``io``; the wall clock
    (ns) just before and just after it resolved."""
    traced, span = telemetry.start(Envelope.build("q", b"x"))
    future: Future[Receipt] = Future()
    telemetry.track(future, span)
    clock: list[int] = []

    def resolve() -> None:
        clock.append(time.time_ns())
        future.set_result(Receipt(traced.message_id, status, "q"))
        clock.append(time.time_ns())

    io = threading.Thread(target=resolve, name="io")
    io.start()
    io.join(10)
    return clock[0], clock[1]


def _wait_for(ended: _Ended, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(ended.ended) < count:
        assert time.monotonic() < deadline, f"{len(ended.ended)} of {count} spans ended"
        time.sleep(0.001)


def test_the_finisher_thread_ends_the_span_with_the_receipts_time() -> None:
    telemetry, ended = _traced()
    before, after = _resolve_on_io_thread(telemetry, Status.CONFIRMED)
    _wait_for(ended, 1)
    ((span, thread),) = ended.ended
    assert thread == "msgsafe-spans"  # not "io": the receipt's thread went on at once
    assert span.end_time is not None and before <= span.end_time <= after
    assert span.attributes and span.attributes["msgsafe.outcome"] == "CONFIRMED"


def test_close_ends_every_settled_span_and_a_broken_processor_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    telemetry, ended = _traced()
    ended.broken = True  # the first span's end raises inside the processor
    outcomes = [Status.CONFIRMED, Status.STORED, Status.CONFIRMED]
    for status in outcomes:
        _resolve_on_io_thread(telemetry, status)
    telemetry.close()  # ends on this thread what the finisher has not ended yet
    got: list[Any] = [s.attributes["msgsafe.outcome"] for s, _ in ended.ended if s.attributes]
    assert got == ["STORED", "CONFIRMED"]  # the first one's processor raised
    stored = ended.ended[0][0]
    assert [e.name for e in stored.events] == ["msgsafe.outbox.detour"]
    assert any("cannot end a send span" in r.getMessage() for r in caplog.records)
    _resolve_on_io_thread(telemetry, Status.CONFIRMED)  # the finisher goes on
    FINISHER.drain()
    assert len(ended.ended) == 3
