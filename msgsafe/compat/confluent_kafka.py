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
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import confluent_kafka as _ck
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

from msgsafe.compat._common import headers_dict, warn
from msgsafe.compat._kafka_config import (
    DeliveryCallback,
    ProducerConfig,
    options_for,
    translate_config,
)
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    InvalidMessage,
    MessageTooLarge,
    MsgsafeError,
    OutboxError,
    PermanentError,
    Rejected,
    TransientError,
    Unroutable,
)
from msgsafe.message import MESSAGE_ID_HEADER, Receipt, Status, new_message_id
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
    "libversion",
    "version",
]

#: The offset a delivery report carries when msgsafe does not know it (see DeliveredMessage).
OFFSET_INVALID: int = _ck.OFFSET_INVALID
#: librdkafka's "unassigned partition".
PARTITION_UA = -1
#: Header on delivery-report messages: b"confirmed" or b"stored" (not sent to the broker).
STATUS_HEADER = "msgsafe-status"


class DeliveredMessage:
    """The ``msg`` a delivery callback receives; the accessors of ``confluent_kafka.Message``.

    ``partition()`` is ``PARTITION_UA`` (-1) and ``offset()`` ``OFFSET_INVALID`` (-1001):
    msgsafe confirms a message without reporting where the broker put it, and a stored
    message has no offset yet. ``stored()`` / the ``msgsafe-status`` header say which;
    ``message_id()`` is the id the consumer sees in the ``msgsafe-id`` header.
    """

    __slots__ = ("_error", "_headers", "_key", "_message_id", "_status", "_topic", "_value")

    def __init__(
        self,
        *,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        message_id: str,
        status: Status | None,
        error: KafkaError | None,
    ) -> None:
        self._topic = topic
        self._value = value
        self._key = key
        self._headers = headers
        self._message_id = message_id
        self._status = status
        self._error = error

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        """The produced headers plus ``msgsafe-id`` and ``msgsafe-status``."""
        return list(self._headers)

    def partition(self) -> int:
        return PARTITION_UA

    def offset(self) -> int:
        return OFFSET_INVALID

    def error(self) -> KafkaError | None:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        return (_ck.TIMESTAMP_NOT_AVAILABLE, 0)

    def latency(self) -> float | None:
        return None

    def leader_epoch(self) -> int | None:
        return None

    def message_id(self) -> str:
        """The msgsafe id (UUIDv7) the message carries in its ``msgsafe-id`` header."""
        return self._message_id

    def stored(self) -> bool:
        """True when the message waits in the outbox (forwarded later), not yet confirmed."""
        return self._status is Status.STORED

    def len(self) -> int:
        return len(self._value or b"")

    def __len__(self) -> int:
        return len(self._value or b"")

    def __repr__(self) -> str:
        status = self._status.value if self._status else "failed"
        return f"DeliveredMessage(topic={self._topic!r}, id={self._message_id!r}, {status})"


@dataclass(frozen=True, slots=True)
class _Report:
    callback: DeliveryCallback | None
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]
    message_id: str
    future: Future[Receipt]


#: A msgsafe error class, the ``KafkaError`` code it becomes and whether that is
#: retriable; the first class that matches wins (subclasses before their bases).
_KAFKA_CODES: tuple[tuple[type[BaseException], int, bool], ...] = (
    (MessageTooLarge, KafkaError.MSG_SIZE_TOO_LARGE, False),
    (Unroutable, KafkaError._UNKNOWN_TOPIC, False),
    (AuthenticationError, KafkaError._AUTHENTICATION, False),
    (InvalidMessage, KafkaError._INVALID_ARG, False),
    (Rejected, KafkaError.INVALID_RECORD, False),
    (PermanentError, KafkaError._FAIL, False),
    (OutboxError, KafkaError._FS, True),
    (ClosedError, KafkaError._DESTROY, False),
    # Only without an outbox (or when storing failed): the message was not kept.
    (TransientError, KafkaError._MSG_TIMED_OUT, True),
)


def kafka_error(exc: BaseException) -> KafkaError:
    """The ``KafkaError`` a confluent-kafka user would see for a msgsafe error."""
    text = str(exc)
    for kind, code, retriable in _KAFKA_CODES:
        if isinstance(exc, kind):
            return KafkaError(code, text, retriable=retriable)
    return KafkaError(KafkaError._FAIL, f"{type(exc).__name__}: {text}")


def _as_bytes(what: str, value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def _close_quietly(producer: _SafeProducer, timeout: float) -> None:
    # At interpreter exit or garbage collection: sends in flight get their chance to be
    # confirmed or stored; what is stored stays in the outbox for the next run.
    with contextlib.suppress(MsgsafeError):
        producer.close(timeout)


class Producer:
    """A ``confluent_kafka.Producer`` that confirms with ``acks=all`` or stores in the outbox.

    ``config`` is the confluent-kafka dict (see :func:`translate_config` for the mapping;
    ``msgsafe.outbox`` selects the outbox, default the user's data directory). ``_url``
    replaces the broker URL (tests point it at ``memory://``). Thread-safe like the
    original: ``produce`` from any thread; callbacks run in ``poll``/``flush``.
    """

    def __init__(self, config: Mapping[str, object] | None = None, /, *, _url: str | None = None):
        translated = translate_config(config or {})
        for note in translated.warnings:
            warn(note)
        url = parse_url(_url or translated.url)
        options = options_for(url.protocol, translated.options)
        self._config: ProducerConfig = translated
        confirm_timeout = translated.options.get("confirm_timeout")
        self._confirm_timeout = confirm_timeout if isinstance(confirm_timeout, float) else 10.0
        self._producer = _SafeProducer(_url or translated.url, outbox=translated.outbox, **options)
        self._reports: queue.SimpleQueue[_Report] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unreported = 0
        self._admin: Any = None
        self._warned: set[str] = set()
        self._finalizer = weakref.finalize(
            self, _close_quietly, self._producer, self._confirm_timeout
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
        for a message msgsafe refuses before sending (e.g. ``MSG_SIZE_TOO_LARGE``) and
        ``NotImplementedError`` for an explicit ``partition`` (msgsafe partitions by key).
        """
        if partition not in (PARTITION_UA, None):
            raise NotImplementedError(
                "msgsafe.compat.confluent_kafka does not produce to an explicit partition; "
                "use a key (messages with the same key keep their order)"
            )
        if timestamp:
            self._warn_once(
                "timestamp", "produce(timestamp=...) is ignored; the producer stamps the send time"
            )
        body = _as_bytes("value", value)
        if body is None:
            raise TypeError(
                "msgsafe does not produce tombstones (value=None); pass b'' or use "
                "confluent_kafka directly for compacted-topic deletes"
            )
        key_bytes = _as_bytes("key", key)
        header_map = headers_dict(headers)
        with self._lock:
            if self._unreported >= self._config.queue_max:
                raise BufferError("Local: Queue full (serve delivery reports with poll())")
            self._unreported += 1
        message_id = new_message_id()
        try:
            future = self._producer.send_async(
                topic, body, key=key_bytes, headers=header_map, message_id=message_id
            )
        except InvalidMessage:
            self._unreported_done()
            raise
        except MsgsafeError as exc:
            self._unreported_done()
            raise KafkaException(kafka_error(exc)) from exc
        except BaseException:
            self._unreported_done()
            raise
        report = _Report(
            callback=on_delivery or callback or self._config.on_delivery,
            topic=topic,
            value=body,
            key=key_bytes,
            headers=[(k, v.encode()) for k, v in header_map.items()],
            message_id=message_id,
            future=future,
        )
        future.add_done_callback(lambda _f: self._reports.put(report))

    def _unreported_done(self) -> None:
        with self._lock:
            self._unreported -= 1

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, depth=2)

    # --- delivery reports ---------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for the first
        (None or a negative value: until one arrives). Returns how many were served."""
        try:
            if timeout is not None and timeout == 0:
                first = self._reports.get_nowait()
            else:
                wait = None if timeout is None or timeout < 0 else timeout
                first = self._reports.get(timeout=wait)
        except queue.Empty:
            return 0
        served = 1
        self._serve(first)
        while True:
            try:
                report = self._reports.get_nowait()
            except queue.Empty:
                return served
            served += 1
            self._serve(report)

    def _serve(self, report: _Report) -> None:
        self._unreported_done()
        exc = report.future.exception()
        status = report.future.result().status if exc is None else None
        message_id = report.message_id
        headers = [
            *report.headers,
            (MESSAGE_ID_HEADER, message_id.encode()),
            (STATUS_HEADER, status.value.encode() if status else b"failed"),
        ]
        error = kafka_error(exc) if exc is not None else None
        msg = DeliveredMessage(
            topic=report.topic,
            value=report.value,
            key=report.key,
            headers=headers,
            message_id=message_id,
            status=status,
            error=error,
        )
        if report.callback is not None:
            # NOTE: like confluent-kafka, an exception in the callback propagates out of
            # poll()/flush(); the report counts as served.
            report.callback(error, msg)

    def flush(self, timeout: float | None = None) -> int:
        """Serve callbacks until every produced message is reported, or ``timeout``.

        Then, while time is left, give the outbox up to that long (at most
        ``message.timeout.ms`` when no timeout is given) to forward what it holds, so a
        short-lived script leaves nothing behind when the brokers are back. Returns the
        number of messages not yet reported (0 when all are confirmed or stored).
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while len(self) > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return len(self)
            self.poll(left)
        left = self._confirm_timeout if deadline is None else deadline - time.monotonic()
        if left > 0 and self._producer.pending() > 0:
            self._producer.drain(left)
        return len(self)

    def __len__(self) -> int:
        """Messages produced whose delivery callback has not been served yet."""
        with self._lock:
            return self._unreported

    def __bool__(self) -> bool:
        # NOTE: without this, ``if producer:`` would be False whenever len() is 0.
        return True

    # --- pass-through -------------------------------------------------------------------

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Cluster metadata from a real confluent-kafka client on the same brokers."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            if not self._config.admin:
                raise ConfigurationError("list_topics needs 'bootstrap.servers'")
            self._admin = AdminClient(dict(self._config.admin))
        return self._admin.list_topics(topic=topic, timeout=timeout)

    # --- msgsafe additions --------------------------------------------------------------

    def pending(self) -> int:
        """Messages waiting in the outbox to be forwarded."""
        return self._producer.pending()

    def close(self, timeout: float = 30.0) -> None:
        """Flush within ``timeout`` (callbacks served), then stop; what the outbox holds
        stays there for the next producer on the same outbox. Idempotent."""
        if self._finalizer.alive:
            self.flush(timeout)
            self._finalizer.detach()
            _close_quietly(self._producer, timeout)

    def __repr__(self) -> str:
        return f"<msgsafe.compat.confluent_kafka.Producer {self._producer.target}>"
