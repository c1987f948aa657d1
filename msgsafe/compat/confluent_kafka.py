"""``confluent_kafka`` with msgsafe's :class:`Producer`; every other name is the original.

``from msgsafe.compat.confluent_kafka import Producer`` (or ``from msgsafe.compat import
confluent_kafka``) in place of the confluent-kafka import is the whole migration.
How librdkafka settings translate is in :mod:`msgsafe.compat._kafka_config`.

The producer keeps the same constructor, ``produce`` / ``poll`` / ``flush`` / ``len()``
and callback rules: delivery callbacks run on the thread that calls
:meth:`Producer.poll` or :meth:`Producer.flush`, as ``on_delivery(err, msg)``. What
changes:

- every message is published with ``acks=all`` and idempotence (weaker settings are
  overridden with a :class:`~msgsafe.compat.CompatWarning`);
- a message the brokers cannot take in time goes to msgsafe's durable outbox and is
  forwarded later instead of failing with ``_MSG_TIMED_OUT``. Its callback gets
  ``err=None`` and a message whose ``offset()`` is ``OFFSET_INVALID`` (-1001),
  ``stored()`` is True and whose headers carry ``("msgsafe-status", b"stored")``;
- a permanent failure reaches the callback as a ``KafkaError`` (never a silent loss).

``docs/migration.md`` lists every difference. Other names of ``confluent_kafka``
(``KafkaError``, ``Consumer``, ``admin`` ...) are re-exported unchanged.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from msgsafe.errors import MissingExtra

try:
    from confluent_kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        OFFSET_STORED,
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        TIMESTAMP_NOT_AVAILABLE,
        Consumer,
        KafkaError,
        KafkaException,
        Message,
        TopicPartition,
        admin,
        libversion,
        version,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("kafka", "confluent-kafka") from exc

from msgsafe.compat._common import ClosesOnExit, warn
from msgsafe.compat._kafka_config import (
    DeliveryCallback,
    ProducerConfig,
    check_with_librdkafka,
    merged_config,
    options_for,
    translate_config,
)
from msgsafe.compat._kafka_direct import (
    CLOSED,
    DIRECT,
    SAFE,
    SWITCHING,
    DirectLane,
    DirectReport,
    Parked,
)
from msgsafe.compat._kafka_report import (
    OFFSET_INVALID,
    PARTITION_UA,
    STATUS_HEADER,
    DeliveredMessage,
    RecordHeaders,
    check_batch,
    kafka_error,
    record_headers,
)
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, InvalidMessage, MsgsafeError
from msgsafe.message import MESSAGE_ID_HEADER, Envelope, Receipt, new_message_id
from msgsafe.producer import Producer as _SafeProducer

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "PARTITION_UA",
    "STATUS_HEADER",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "Consumer",
    "DeliveredMessage",
    "KafkaError",
    "KafkaException",
    "Message",
    "Producer",
    "TopicPartition",
    "admin",
    "kafka_error",
    "libversion",
    "version",
]


#: Record headers as handed to rk: the id header first, then the user's.
_Produced = list[tuple[str, str | bytes | None]]

#: What a closed producer's methods raise, in confluent-kafka's words.
_CLOSED = "Producer has been closed"


def _as_bytes(what: str, value: object) -> bytes | None:
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
        owner: Producer,
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
        self.owner = owner

    def __call__(self, _future: Future[Receipt]) -> None:
        # The receipt future's done callback: queue this report for poll()/flush().
        self.owner._arrived(self)


class _Wake(enum.Enum):
    """Put in the report queue when an error event arrives: poll() then serves error_cb."""

    WAKE = 0


#: librdkafka error events kept for error_cb while nobody polls (the oldest go first).
_ERRORS_MAX = 1000


def _error_listener(
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


def _close_quietly(producer: _SafeProducer | None, lane: DirectLane | None, timeout: float) -> None:
    # At interpreter exit or garbage collection: sends in flight get their chance to be
    # confirmed or stored; what is stored stays in the outbox for the next run.
    if lane is not None:
        with contextlib.suppress(Exception):
            lane.close(timeout)
    if producer is not None:
        with contextlib.suppress(MsgsafeError):
            producer.close(timeout)


class Producer(ClosesOnExit):
    """A ``confluent_kafka.Producer`` that confirms with ``acks=all`` or stores in the outbox.

    ``Producer(config)``, ``Producer(**config)`` or both (keywords win), as
    confluent-kafka takes them; ``default.topic.config`` is merged in. See
    :func:`translate_config` for the mapping; ``msgsafe.outbox`` selects the outbox
    (default the user's data directory). A bad setting raises ``KafkaException`` with
    ``_INVALID_ARG``. Without ``bootstrap.servers`` the producer is made (as librdkafka
    does) and every message fails with ``_MSG_TIMED_OUT``. ``_url`` replaces the broker
    URL (tests point it at ``memory://``). Thread-safe like the original: ``produce``,
    ``poll`` and ``flush`` from any threads; callbacks run in ``poll``/``flush``.
    """

    def __init__(
        self,
        config: Mapping[str, object] | None = None,
        /,
        *,
        _url: str | None = None,
        **settings: object,
    ):
        merged = merged_config(config, settings)
        try:
            translated = translate_config(merged)
            check_with_librdkafka(translated.options.get("librdkafka"))
            for note in translated.warnings:
                warn(note)
            target = _url or translated.url
            producer = None
            if target:
                options = options_for(parse_url(target).protocol, translated.options)
                producer = _SafeProducer(target, outbox=translated.outbox, **options)
        except ConfigurationError as exc:
            raise KafkaException(kafka_error(exc)) from exc
        self._config: ProducerConfig = translated
        self._on_delivery = translated.on_delivery
        confirm_timeout = translated.options.get("confirm_timeout")
        self._confirm_timeout = confirm_timeout if isinstance(confirm_timeout, float) else 10.0
        self._producer = producer
        self._reports: queue.SimpleQueue[_Report | _Wake] = queue.SimpleQueue()
        #: librdkafka's error events waiting for error_cb (served by poll()/flush()).
        self._errors: deque[KafkaError] = deque(maxlen=_ERRORS_MAX)
        self._lock = threading.Lock()
        listener = None
        if translated.error_cb is not None:
            listener = _error_listener(self._errors, self._reports)
        self._lane: DirectLane | None = None
        if producer is not None and _url is None:
            try:
                self._lane = DirectLane(target, options, producer.outbox, self._lock, listener)
            except BaseException:
                producer.close(0)
                raise
            if producer.pending() > 0:
                # NOTE: rows of an earlier run wait in the outbox: their keys must not be
                # overtaken, so start on the safe path and come back once it drained.
                self._lane.state = SAFE
        elif listener is not None:
            listen = getattr(getattr(producer, "_transport", None), "listen_errors", None)
            if listen is not None:
                # NOTE: the transport's librdkafka client sees the same connection events
                # as confluent-kafka's would; error_cb gets them from poll()/flush().
                listen(listener)
        #: Safe-path produces so far (under _lock): the lane's return check compares it.
        self._safe_sent = 0
        self._next_check = 0.0  #: monotonic() of the next look at going back to the lane
        self._served = threading.Condition(self._lock)
        self._flushing = 0  #: flush() calls waiting on _served (reads need no lock)
        self._unreported = 0
        #: Without brokers: (deadline, future) of messages waiting to time out or be purged.
        self._held: list[tuple[float, Future[Receipt]]] = []
        self._closed = False
        self._admin: Any = None
        self._warned: set[str] = set()
        self._finalizer = weakref.finalize(
            self, _close_quietly, producer, self._lane, self._confirm_timeout
        )

    # --- producing ----------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = PARTITION_UA,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None = None,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Queue one message; its callback runs from a later :meth:`poll` / :meth:`flush`.

        Raises ``BufferError`` when ``queue.buffering.max.messages`` reports wait to be
        served (call ``poll``), ``TypeError`` for bad argument types, ``KafkaException``
        for a message msgsafe refuses before sending (e.g. ``MSG_SIZE_TOO_LARGE``),
        and ``RuntimeError`` after :meth:`close`. An explicit ``partition`` is ignored with a
        warning (msgsafe places messages by key).
        """
        lane = self._lane
        if (
            lane is not None
            and not headers
            and partition == -1
            and not timestamp
            and type(value) is bytes
            and (key is None or type(key) is bytes)
            and type(topic) is str
            and topic in lane.topics
            and len(value) + (0 if key is None else len(key)) <= lane.size_limit
        ):
            # The common message on the direct lane, checked in one expression: bytes,
            # no headers, a topic seen before; the rest takes _produce's general path.
            produced: list[tuple[str, str | bytes | None]] = [(MESSAGE_ID_HEADER, new_message_id())]
            cb = on_delivery or callback or self._on_delivery
            with self._lock:
                if lane.state == DIRECT:
                    lane.seq = seq = lane.seq + 1
                    try:
                        # produce(topic, value, key, partition (-1: by key), on_delivery,
                        # callback, timestamp (0: now), headers): positional, as the
                        # adapter does (keywords cost the binding about 1 µs more).
                        lane.rk.produce(
                            topic,
                            value,
                            key,
                            -1,
                            DirectReport(lane, cb, seq, produced),
                            None,
                            0,
                            produced,
                        )
                        return
                    except KafkaException:
                        pass  # the general path produces it again and handles the error
        self._produce(topic, value, key, partition, on_delivery, timestamp, headers, callback)

    def _produce(
        self,
        topic: str,
        value: str | bytes | None,
        key: str | bytes | None,
        partition: int,
        on_delivery: DeliveryCallback | None,
        timestamp: int,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None,
        callback: DeliveryCallback | None,
    ) -> None:
        """:meth:`produce`, every case: the checks, then the lane or the safe path."""
        if self._closed:  # _check_open, inlined: this runs for every message
            raise RuntimeError(_CLOSED)
        if partition not in (PARTITION_UA, None):
            if not isinstance(partition, int):
                raise TypeError(f"partition must be int, not {type(partition).__name__}")
            self._warn_once(
                "partition",
                "produce(partition=...) is ignored: msgsafe places a message by its key "
                "(messages with the same key keep their order)",
            )
        if timestamp:
            self._warn_once(
                "timestamp", "produce(timestamp=...) is ignored; the producer stamps the send time"
            )
        # value=None is a tombstone: the envelope carries the mark, Kafka gets a null value.
        body = value if type(value) is bytes else _as_bytes("value", value)
        key_bytes = key if key is None or type(key) is bytes else _as_bytes("key", key)
        record: RecordHeaders
        header_map: dict[str, str] | None
        if headers:
            record, header_map = record_headers(headers)
        else:
            record, header_map = [], None
        cb = on_delivery or callback or self._on_delivery
        lane = self._lane
        if (
            lane is not None
            and type(topic) is str
            and lane.takes(topic)
            and (
                len(body or b"") + (0 if key_bytes is None else len(key_bytes)) <= lane.size_limit
                if not record
                else not lane.too_large(topic, body, key_bytes, header_map)
            )
        ):
            # The direct lane (see _kafka_direct): the adapter's record, id header first.
            produced: _Produced = [(MESSAGE_ID_HEADER, new_message_id())]
            if record:
                produced.extend(h for h in record if h[0] != MESSAGE_ID_HEADER)
            refused: KafkaError | None = None
            with self._lock:
                state = lane.state
                if state == DIRECT:
                    lane.seq = seq = lane.seq + 1
                    # produce(topic, value, key, partition (-1: by key), on_delivery,
                    # callback, timestamp (0: now), headers): positional, as the adapter.
                    try:
                        lane.rk.produce(
                            topic,
                            body,
                            key_bytes,
                            -1,
                            DirectReport(lane, cb, seq, produced),
                            None,
                            0,
                            produced,
                        )
                        return
                    except KafkaException as exc:
                        refused = exc.args[0]
                elif state == SWITCHING:
                    if self._unreported >= self._config.queue_max:
                        raise BufferError("Local: Queue full (serve delivery reports with poll())")
                    self._unreported += 1
                    self._safe_sent += 1
                    lane.parked.append((topic, body, key_bytes, record, header_map, cb))
                    return
            if refused is not None and refused.fatal():
                # rk is done for: its messages go to the outbox before this one goes on.
                lane.broken = lane.down = True
                self._switch()
        with self._lock:
            if self._unreported >= self._config.queue_max:
                raise BufferError("Local: Queue full (serve delivery reports with poll())")
            self._unreported += 1
            self._safe_sent += 1
        self._send_safe((topic, body, key_bytes, record, header_map, cb))

    def _send_safe(self, item: Parked) -> None:
        """Send one counted message on the safe path (msgsafe's Producer); it is
        reported through the receipt future. NOTE: a message the lane's rk refused
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
            _Report(self, cb, topic, body, key_bytes, record, envelope.message_id, future)
        )

    def _send_parked(self, item: Parked) -> None:
        # A produce made while the lane switched, counted then: its errors reach its
        # callback (the produce() that parked it has returned).
        try:
            self._send_safe(item)
        except (KafkaException, MsgsafeError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) else kafka_error(exc)
            self._fail_local(item, err)

    def _fail_local(self, item: Parked, err: KafkaError) -> None:
        topic, body, key_bytes, record, _, cb = item
        msg = DeliveredMessage(
            topic=topic,
            value=body,
            key=key_bytes,
            headers=record,
            message_id="",
            status=None,
            error=err,
        )
        lane = self._lane
        if lane is not None:
            with self._lock:
                lane.deferred += 1
            lane.ready.append((cb, err, msg))

    def _switch(self) -> None:
        if self._lane is not None:
            self._lane.switch(self._send_parked)

    def _arrived(self, report: _Report) -> None:
        self._reports.put(report)
        # NOTE: a flush() counts itself in before it looks at the queue, so one that
        # missed this report sees _flushing here; without one, no lock per message.
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

    def produce_batch(
        self,
        topic: str,
        messages: list[dict[str, Any]],
        partition: int = PARTITION_UA,
        on_delivery: DeliveryCallback | None = None,
        callback: DeliveryCallback | None = None,
    ) -> int:
        """``produce`` each of ``messages`` (dicts of ``value``, ``key``, ``headers``,
        ``timestamp``, ``partition``, ``callback`` / ``on_delivery``); returns how many
        were queued. A message that could not be queued gets its error as a
        ``KafkaError`` under ``"_error"``; malformed input raises ``TypeError`` and a
        ``timestamp`` ``NotImplementedError`` before anything is queued, as with
        confluent-kafka."""
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if not isinstance(partition, int):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        check_batch(messages)
        on_delivery = on_delivery or callback
        queued = 0
        for message in messages:
            try:
                self.produce(
                    topic,
                    message.get("value"),
                    message.get("key"),
                    message.get("partition", partition),
                    message.get("callback", message.get("on_delivery", on_delivery)),
                    message.get("timestamp", 0),
                    message.get("headers"),
                )
            except KafkaException as exc:
                message["_error"] = exc.args[0]
            except (BufferError, TypeError, NotImplementedError, MsgsafeError) as exc:
                message["_error"] = KafkaError(KafkaError._INVALID_ARG, str(exc))
            else:
                queued += 1
        return queued

    def _unreported_done(self, count: int = 1) -> None:
        with self._lock:
            self._unreported -= count
            self._served.notify_all()

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, depth=2)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(_CLOSED)

    # --- delivery reports ---------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for the first
        (None or a negative value: until one arrives). Returns how many were served."""
        self._check_open()
        lane = self._lane
        if lane is None:
            return self._poll_queue(timeout)
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        wait = 0.0
        while True:
            if lane.state == DIRECT and not self._unreported:
                # Only rk has reports to come: wait in librdkafka, as the real client.
                served = self._lane_round(wait)
                served += self._poll_queue(0) if self._errors else 0
            else:
                served = self._lane_round(0)
                served += self._poll_queue(wait)
            if served:
                return served
            left = _FLUSH_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return 0
            wait = min(left, _LANE_SLICE_S)

    def _lane_round(self, timeout: float) -> int:
        """rk's reports (waiting up to ``timeout``), the switch when one failed, the
        callbacks of stored messages, and now and then a look at going back to the
        lane. Returns the number served."""
        lane = self._lane
        assert lane is not None
        served = lane.rk.poll(timeout) if lane.state != SAFE or timeout == 0 else 0
        if lane.wants_switch:
            self._switch()
        if lane.ready:
            served += lane.serve_ready()
            self._notify_served()
        if lane.state == SAFE:
            self._maybe_direct(lane)
        lane.reraise()
        return int(served)

    def _maybe_direct(self, lane: DirectLane) -> None:
        """Back to the lane once the safe path holds nothing of this wrapper and the
        outbox is empty (looked at every _BACK_EVERY_S, not per message).

        NOTE: the outbox is asked between two looks under the lock that see no
        unreported message and no new safe-path produce. A stored message is reported
        only after its row was committed, so every row of ours was in the store before
        the first look; ``pending() == 0`` after it means all were forwarded. A produce
        after the switch back goes to rk, and cannot overtake a row of its key."""
        now = time.monotonic()
        if now < self._next_check or lane.broken or now < lane.down_until:
            return
        self._next_check = now + _BACK_EVERY_S
        safe = self._producer
        with self._lock:
            if self._unreported or lane.deferred or safe is None:
                return
            sent = self._safe_sent
        if safe.pending() > 0:
            return
        with self._lock:
            if not self._unreported and not lane.deferred and self._safe_sent == sent:
                lane.state = DIRECT

    def _notify_served(self) -> None:
        if self._flushing:
            with self._served:
                self._served.notify_all()

    def _poll_queue(self, timeout: float | None) -> int:
        """Serve the safe path's reports and error events (see :meth:`poll`)."""
        if self._held:
            self._fail_held(time.monotonic(), _no_brokers)
            if self._held and (timeout is None or timeout < 0 or timeout > _FLUSH_SLICE_S):
                timeout = _FLUSH_SLICE_S  # come back to time the held messages out
        try:
            if timeout is not None and timeout == 0:
                first = self._reports.get_nowait()
            else:
                wait = None if timeout is None or timeout < 0 else timeout
                first = self._reports.get(timeout=wait)
        except queue.Empty:
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

    def flush(self, timeout: float | None = None) -> int:
        """Serve callbacks until every produced message is reported, or ``timeout``.

        Safe while other threads call ``poll``/``flush``/``produce``: a report another
        thread serves counts too. Then, while time is left, give the outbox up to that
        long (at most ``message.timeout.ms`` when no timeout is given) to forward what it
        holds, so a short-lived script leaves nothing behind when the brokers are back.
        Returns the number of messages not yet reported (0 when all are confirmed or
        stored).
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        if self._errors:
            self._serve_errors()
        lane = self._lane
        while len(self) > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return len(self)
            if lane is not None and len(lane.rk):
                # rk sends what lingers now and serves its reports here.
                lane.rk.flush(_LANE_SLICE_S if left is None else min(left, _LANE_SLICE_S))
                self._lane_round(0)
                continue
            if self.poll(0) == 0:
                # Another thread may hold the last reports: wait for a report to be
                # served anywhere (or to arrive), never on the queue alone.
                with self._served:
                    self._flushing += 1
                    try:
                        waiting = self._unreported + (0 if lane is None else lane.deferred)
                        if waiting > 0 and self._reports.empty():
                            self._served.wait(min(left or _FLUSH_SLICE_S, _FLUSH_SLICE_S))
                    finally:
                        self._flushing -= 1
        left = self._confirm_timeout if deadline is None else deadline - time.monotonic()
        if left > 0 and self._producer is not None and self._producer.pending() > 0:
            self._producer.drain(left)
        if self._errors:
            self._serve_errors()
        return len(self)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """With ``in_queue``, messages still waiting for brokers that were never configured
        fail with ``_PURGE_QUEUE`` (their callbacks run from the next ``poll``/``flush``).
        Nothing else is dropped: a message handed to the brokers is on its way to be
        confirmed or stored, and msgsafe never discards it."""
        self._check_open()
        if in_queue and self._held:
            self._fail_held(None, _purged)
        if self._producer is not None:
            self._warn_once("purge", "purge() drops nothing: produced messages stay safe")

    def _fail_held(self, now: float | None, error: Callable[[], _Unsent]) -> None:
        """Fail the held messages whose deadline is before ``now`` (None: all of them)."""
        with self._lock:
            due = [f for deadline, f in self._held if now is None or deadline <= now]
            if not due:
                return
            self._held = [(d, f) for d, f in self._held if now is not None and d > now]
        for future in due:
            future.set_exception(error())

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Use these credentials for the ``list_topics`` client from now on; the
        producing connection keeps the ones it was made with (see the migration notes)."""
        self._check_open()
        self._config.admin["sasl.username"] = username
        self._config.admin["sasl.password"] = password
        if self._admin is not None:
            self._admin.set_sasl_credentials(username, password)
        self._warn_once(
            "sasl", "set_sasl_credentials() applies to list_topics(); producing keeps its login"
        )

    def __len__(self) -> int:
        """Messages produced whose delivery callback has not been served yet."""
        lane = self._lane
        with self._lock:
            if lane is None:
                return self._unreported
            return self._unreported + lane.deferred + len(lane.rk)

    def __bool__(self) -> bool:
        # NOTE: without this, ``if producer:`` would be False whenever len() is 0.
        return True

    # --- pass-through -------------------------------------------------------------------

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Cluster metadata from a real confluent-kafka client on the same brokers."""
        self._check_open()
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(dict(self._config.admin))
        return self._admin.list_topics(topic=topic, timeout=timeout)

    # --- msgsafe additions --------------------------------------------------------------

    def pending(self) -> int:
        """Messages waiting in the outbox to be forwarded."""
        return 0 if self._producer is None else self._producer.pending()

    def close(self, timeout: float = 30.0) -> bool:
        """Flush within ``timeout`` (callbacks served), then stop; what the outbox holds
        stays there for the next producer on the same outbox. Returns True, as
        confluent-kafka; calling it again does nothing."""
        if not self._closed:
            self.flush(timeout)
            with self._lock:
                self._closed = True
                if self._lane is not None:
                    self._lane.state = CLOSED  # produce() then takes the path that raises
            self._finalizer.detach()
            _close_quietly(self._producer, self._lane, timeout)
        return True

    @property
    def is_open(self) -> bool:
        """msgsafe addition: False once :meth:`close` ran (``with`` closes on leaving)."""
        return not self._closed

    def __repr__(self) -> str:
        target = self._producer.target if self._producer is not None else "(no brokers)"
        return f"<msgsafe.compat.confluent_kafka.Producer {target}>"


#: Longest single wait of flush() for a report served by another thread.
_FLUSH_SLICE_S = 0.05
#: Longest single wait in rk (poll, flush) between looks at the switch and the queue.
_LANE_SLICE_S = 0.1
#: Seconds between looks at going back to the direct lane.
_BACK_EVERY_S = 0.5


class _Unsent(MsgsafeError):
    """A message of a producer without brokers that was never sent, with its error code."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


def _no_brokers() -> _Unsent:
    return _Unsent(KafkaError._MSG_TIMED_OUT, "Local: Message timed out (no bootstrap.servers)")


def _purged() -> _Unsent:
    return _Unsent(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
