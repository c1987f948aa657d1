"""What a delivery callback of :mod:`msgsafe.compat.confluent_kafka` receives: the
``DeliveredMessage`` and the ``KafkaError`` a msgsafe error becomes; and how record
headers travel whole (repeated names, ``None``, any bytes) through msgsafe's text
headers and the outbox."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping

from msgsafe.errors import MissingExtra

try:
    import confluent_kafka as _ck
    from confluent_kafka import KafkaError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("kafka", "confluent-kafka") from exc

from msgsafe.errors import (
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    InvalidMessage,
    MessageTooLarge,
    OutboxError,
    PermanentError,
    Rejected,
    TransientError,
    Unroutable,
    UnsafeDestination,
)
from msgsafe.message import MESSAGE_ID_HEADER, RECORD_HEADERS_HEADER, Status

__all__ = [
    "OFFSET_INVALID",
    "PARTITION_UA",
    "STATUS_HEADER",
    "DeliveredMessage",
    "RecordHeaders",
    "check_batch",
    "kafka_error",
    "record_headers",
]

#: The offset a delivery report carries when msgsafe does not know it (see DeliveredMessage).
OFFSET_INVALID: int = _ck.OFFSET_INVALID
#: librdkafka's "unassigned partition".
PARTITION_UA = -1

#: Record headers as a delivery report and the broker hold them.
RecordHeaders = list[tuple[str, bytes | None]]


#: Header on delivery-report messages: b"confirmed" or b"stored" (not sent to the broker).
STATUS_HEADER = "msgsafe-status"


def record_headers(
    headers: Mapping[str, object] | Iterable[tuple[str, object]] | None,
) -> tuple[RecordHeaders, dict[str, str]]:
    """``produce(headers=...)`` as the record's header list (order, repeated names,
    ``None`` and bytes kept) and as msgsafe headers: one
    :data:`~msgsafe.message.RECORD_HEADERS_HEADER` holding that list, which the Kafka
    adapter writes out in its place. Raises ``TypeError`` for what confluent-kafka
    refuses (a value that is not ``None``, ``bytes`` or ``str``)."""
    if not headers:
        return [], {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: RecordHeaders = []
    for item in pairs:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise TypeError("headers must be a dict or a list of (name, value) tuples") from None
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        elif value is not None and not isinstance(value, bytes):
            raise TypeError(
                "expected header value to be None, binary, or unicode string, "
                f"not {type(value).__name__}"
            )
        out.append((name, value))
    encoded = json.dumps(
        [[n, None if v is None else base64.b64encode(v).decode("ascii")] for n, v in out]
    )
    return out, {RECORD_HEADERS_HEADER: encoded}


class DeliveredMessage:
    """The ``msg`` a delivery callback receives; the accessors of ``confluent_kafka.Message``.

    ``partition()`` is ``PARTITION_UA`` (-1) and ``offset()`` ``OFFSET_INVALID`` (-1001):
    msgsafe confirms a message without reporting where the broker put it, and a stored
    message has no offset yet (a message confirmed on the fast path gets a
    :class:`~msgsafe.compat._kafka_fast.FastReport`, with librdkafka's).
    ``stored()`` / the ``msgsafe-status`` header say which; ``message_id()`` is the id
    the consumer sees in the ``msgsafe-id`` header.
    """

    __slots__ = ("_error", "_headers", "_key", "_message_id", "_status", "_topic", "_value")

    def __init__(
        self,
        *,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]],
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

    def headers(self) -> list[tuple[str, bytes | None]]:
        """The produced headers plus ``msgsafe-id`` and ``msgsafe-status`` (made on
        request: most callbacks never look)."""
        status = self._status.value.encode() if self._status is not None else b"failed"
        return [
            *self._headers,
            (MESSAGE_ID_HEADER, self._message_id.encode()),
            (STATUS_HEADER, status),
        ]

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


#: A msgsafe error class, the ``KafkaError`` code it becomes and whether that is
#: retriable; the first class that matches wins (subclasses before their bases).
_KAFKA_CODES: tuple[tuple[type[BaseException], int, bool], ...] = (
    (MessageTooLarge, KafkaError.MSG_SIZE_TOO_LARGE, False),
    (Unroutable, KafkaError._UNKNOWN_TOPIC, False),
    (AuthenticationError, KafkaError._AUTHENTICATION, False),
    (InvalidMessage, KafkaError._INVALID_ARG, False),
    (Rejected, KafkaError.INVALID_RECORD, False),
    (ConfigurationError, KafkaError._INVALID_ARG, False),
    (UnsafeDestination, KafkaError.POLICY_VIOLATION, False),
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


def check_batch(messages: object) -> None:
    """confluent-kafka's checks of ``produce_batch`` input, with its messages."""
    if not isinstance(messages, list):
        raise TypeError("messages must be a list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"Message at index {index} must be a dict")
        for field in ("value", "key"):
            item = message.get(field)
            if item is not None and not isinstance(item, (str, bytes)):
                raise TypeError(f"Message {field} at index {index} must be bytes or str")
        if not isinstance(message.get("partition", PARTITION_UA), int):
            raise TypeError(f"Message partition at index {index} must be int")
        if "timestamp" in message:
            raise NotImplementedError("Message timestamps are not currently supported")
