"""The safe path's delivery reports of :mod:`msgsafe.compat.confluent_kafka`: each
message sent through msgsafe's :class:`~msgsafe.Producer` gets a report when its
receipt future resolves; ``poll()`` / ``flush()`` serve the reports (and librdkafka's
error events for ``error_cb``) from one queue, on the caller's thread."""

from __future__ import annotations

import enum
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from msgsafe.adapters.kafka.client import exceeds_size_limit
from msgsafe.compat._kafka_config import DeliveryCallback, ProducerConfig
from msgsafe.compat._kafka_report import (
    DeliveredMessage,
    RecordHeaders,
    kafka_error,
)
from msgsafe.errors import InvalidMessage, MsgsafeError
from msgsafe.message import Envelope, Receipt
from msgsafe.producer import Producer as _SafeProducer

__all__ = ["FLUSH_SLICE_S", "Parked", "SafeReports", "as_bytes", "error_listener", "purged"]

#: Longest single wait of flush() for a report served by another thread.
FLUSH_SLICE_S = 0.05

#: A message for the safe path: (topic, value, key, record headers, msgsafe headers,
#: callback).
Parked = tuple[str, bytes | None, bytes | None, RecordHeaders, dict[str, str] | None, Any]


def as_bytes(what: str, value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


class _Report:
    """One produced message waiting for its delivery callback (a plain slotted class:
    one is made per message, and a frozen dataclass costs twice as much to build)."""

    __slots__ = ("callback", "future", "headers", "key", "message_id", "owner", "topic", "value")

    def __init__(
        self,
        owner: weakref.ref[SafeReports],
        callback: DeliveryCallback | None,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: RecordHeaders,
        message_id: str,
        future: Future[Receipt],
    ) -> None:
        self.callback = callback
        self.topic = topic
        self.value = value
        self.key = key
        self.headers = headers
        self.message_id = message_id
        self.future = future
        #: Weak: a pending message must not keep a dropped producer (and its threads and
        #: librdkafka handles) alive; the dropped one's finalizer settles it instead.
        self.owner = owner

    def __call__(self, _future: Future[Receipt]) -> None:
        # The receipt future's done callback: queue this report for poll()/flush().
        owner = self.owner()
        if owner is not None:
            owner._arrived(self)


class _Wake(enum.Enum):
    """Put in the report queue when an error event arrives: poll() then serves error_cb."""

    WAKE = 0


#: librdkafka error events kept for error_cb while nobody polls (the oldest go first).
_ERRORS_MAX = 1000


def error_listener(
    errors: deque[KafkaError], reports: queue.SimpleQueue[_Report | _Wake]
) -> Callable[[KafkaError], None]:
    """The transport's error listener: queue the event for the next poll()/flush() (it
    holds the queues, not the producer, so a dropped producer is still collected)."""

    def listen(err: KafkaError) -> None:
        wake = not errors
        errors.append(err)
        if wake:
            reports.put(_Wake.WAKE)

    return listen


class SafeReports:
    """The safe path's half of the wrapper: sending a counted message through msgsafe's
    Producer, and the queue its reports (and error events) are served from."""

    def __init__(self, config: ProducerConfig, producer: _SafeProducer | None) -> None:
        self._config = config
        confirm_timeout = config.options.get("confirm_timeout")
        self._confirm_timeout = confirm_timeout if isinstance(confirm_timeout, float) else 10.0
        limit = config.options.get("max_message_size")
        self._size_limit = limit if isinstance(limit, int) else 1_000_000
        self._producer = producer
        self._reports: queue.SimpleQueue[_Report | _Wake] = queue.SimpleQueue()
        #: librdkafka's error events waiting for error_cb (served by poll()/flush()).
        self._errors: deque[KafkaError] = deque(maxlen=_ERRORS_MAX)
        self._lock = threading.Lock()
        self._served = threading.Condition(self._lock)
        self._flushing = 0  #: flush()/poll() calls waiting on _served (reads need no lock)
        self._unreported = 0
        #: Without brokers: (deadline, future) of messages waiting to time out or be purged.
        self._held: list[tuple[float, Future[Receipt]]] = []
        #: What each report holds of this producer (one weak reference for all).
        self._weak_self = weakref.ref(self)

    def _check_size(
        self,
        topic: str,
        body: bytes | None,
        key: bytes | None,
        record: RecordHeaders,
        header_map: dict[str, str] | None,
    ) -> None:
        """librdkafka's check in ``produce()``: a message over ``message.max.bytes``
        raises ``KafkaException(MSG_SIZE_TOO_LARGE)`` there, before it is queued (the
        size as the Kafka adapter counts it: body, key and headers)."""
        size = len(body or b"") + (0 if key is None else len(key))
        if size <= self._size_limit and not record:
            return
        envelope = Envelope.build(topic, body, key=key, headers=header_map or None)
        if exceeds_size_limit(envelope, self._size_limit):
            raise KafkaException(
                KafkaError(
                    KafkaError.MSG_SIZE_TOO_LARGE,
                    "Unable to produce message: Broker: Message size too large",
                )
            )

    def _send_safe(self, item: Parked) -> None:
        """Send one counted message on the safe path (msgsafe's Producer); it is
        reported through the receipt future. NOTE: a message the client's rk refused
        (too large for librdkafka, an unknown topic) also comes here: the safe path
        fails it as it always did."""
        topic, body, key_bytes, record, header_map, cb = item
        try:
            # Types are checked above: the envelope's own checks are the ones left (the
            # topic), and without headers it takes Envelope.build's short path.
            envelope = Envelope.build(topic, body, key=key_bytes, headers=header_map or None)
            safe = self._producer
            future = self._hold(envelope) if safe is None else safe.send_envelope(envelope)
        except InvalidMessage:
            self._unreported_done()
            raise
        except MsgsafeError as exc:
            self._unreported_done()
            raise KafkaException(kafka_error(exc)) from exc
        except BaseException:
            self._unreported_done()
            raise
        # The report is the future's done callback itself: no closure per message.
        future.add_done_callback(
            _Report(
                self._weak_self, cb, topic, body, key_bytes, record, envelope.message_id, future
            )
        )

    def _arrived(self, report: _Report) -> None:
        self._reports.put(report)
        # NOTE: a waiting flush()/poll() counts itself in before it looks at the queue,
        # so one that missed this report sees _flushing here; without one, no lock per
        # message.
        if self._flushing:
            with self._served:
                self._served.notify_all()

    def _hold(self, envelope: Envelope) -> Future[Receipt]:
        # NOTE: librdkafka accepts a producer without brokers; its messages wait
        # message.timeout.ms in the queue, then time out (or purge() fails them).
        held: Future[Receipt] = Future()
        with self._lock:
            self._held.append((time.monotonic() + self._confirm_timeout, held))
        return held

    def _unreported_done(self, count: int = 1) -> None:
        with self._lock:
            self._unreported -= count
            self._served.notify_all()

    def _notify_served(self) -> None:
        if self._flushing:
            with self._served:
                self._served.notify_all()

    def _poll_queue(self, timeout: float | None) -> int:
        """Serve the safe path's reports and error events (see :meth:`poll`)."""
        if self._held:
            self._fail_held(time.monotonic(), _no_brokers)
            if self._held and (timeout is None or timeout < 0 or timeout > FLUSH_SLICE_S):
                timeout = FLUSH_SLICE_S  # come back to time the held messages out
        first = self._next_report(None if timeout is None or timeout < 0 else timeout)
        if first is None:
            return 0
        served = 0
        events = 0
        report = first
        try:
            while True:
                if report is _Wake.WAKE:
                    events += self._serve_errors()
                else:
                    served += 1
                    self._serve(report)
                try:
                    report = self._reports.get_nowait()
                except queue.Empty:
                    return served + events
        finally:
            # Counted once per poll, not per report; a report whose callback raised is
            # served too.
            self._unreported_done(served)

    def _next_report(self, timeout: float | None) -> _Report | _Wake | None:
        """The first report (or error event) to serve, waiting up to ``timeout`` seconds
        (None: no limit); None when none came.

        NOTE: never ``SimpleQueue.get(timeout=...)``: when a timed get is woken by a put
        whose item another thread took first (``get_nowait``, as flush() and other polls
        do), CPython's ``_queue`` recomputes the time left, and once that is negative it
        waits with no limit, until the next put (a poll(0.01) hung for seconds with
        every report served). The wait is on ``_served`` instead, which every arrival
        notifies while somebody waits, in slices, so a missed wake-up costs a slice.
        """
        reports = self._reports
        try:
            return reports.get_nowait()
        except queue.Empty:
            if timeout is not None and timeout <= 0:
                return None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._served:
            self._flushing += 1
            try:
                while True:
                    try:
                        return reports.get_nowait()
                    except queue.Empty:
                        pass
                    left = FLUSH_SLICE_S
                    if deadline is not None:
                        left = min(left, deadline - time.monotonic())
                        if left <= 0:
                            return None
                    self._served.wait(left)
            finally:
                self._flushing -= 1

    def _serve_errors(self) -> int:
        # error_cb(err) for each queued event; what it raises propagates, as with
        # confluent-kafka (the events before it count as served).
        callback = self._config.error_cb
        errors = self._errors
        served = 0
        while errors:
            try:
                err = errors.popleft()
            except IndexError:  # another thread took the last one
                break
            served += 1
            if callback is not None:
                callback(err)
        return served

    def _serve(self, report: _Report) -> None:
        exc = report.future.exception()
        status = report.future.result().status if exc is None else None
        error = kafka_error(exc) if exc is not None else None
        if isinstance(exc, _Unsent):
            error = KafkaError(exc.code, str(exc), retriable=False)
        msg = DeliveredMessage(
            topic=report.topic,
            value=report.value,
            key=report.key,
            headers=report.headers,
            message_id=report.message_id,
            status=status,
            error=error,
        )
        if report.callback is not None:
            # NOTE: like confluent-kafka, an exception in the callback propagates out of
            # poll()/flush(); the report counts as served (poll's finally).
            report.callback(error, msg)

    def _fail_held(self, now: float | None, error: Callable[[], _Unsent]) -> None:
        """Fail the held messages whose deadline is before ``now`` (None: all of them)."""
        with self._lock:
            due = [f for deadline, f in self._held if now is None or deadline <= now]
            if not due:
                return
            self._held = [(d, f) for d, f in self._held if now is not None and d > now]
        for future in due:
            future.set_exception(error())


class _Unsent(MsgsafeError):
    """A message of a producer without brokers that was never sent, with its error code."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


def _no_brokers() -> _Unsent:
    return _Unsent(KafkaError._MSG_TIMED_OUT, "Local: Message timed out (no bootstrap.servers)")


def purged() -> _Unsent:
    return _Unsent(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
