"""What ``KafkaProducer.send()`` of :mod:`msgsafe.compat.kafka_python` returns: a
:class:`FutureRecordMetadata` that resolves to kafka-python's ``RecordMetadata``, and
the kafka-python exception a failed message's future carries.

The future is kafka-python's own class (``isinstance`` holds, and ``add_callback``,
``add_errback``, ``add_both``, ``chain``, ``is_done``, ``succeeded()``, ``failed()``,
``exception``, ``value`` and ``await`` are kafka-python's code); what differs is where
its result comes from: the confluent-kafka drop-in's delivery report, which calls the
future itself (``future(err, msg)``) on the producer's reporting thread.
"""

from __future__ import annotations

import threading
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import kafka.errors as kafka_errors
    from kafka.future import Future as _KafkaFuture
    from kafka.producer.future import FutureRecordMetadata as _RealFutureRecordMetadata
    from kafka.producer.future import RecordMetadata
    from kafka.structs import TopicPartition
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "kafka-python") from exc

from confluent_kafka import KafkaError

__all__ = [
    "FutureRecordMetadata",
    "Outcomes",
    "RecordMetadata",
    "StoredRecordMetadata",
    "kafka_python_error",
]


class StoredRecordMetadata(RecordMetadata):  # type: ignore[misc]
    """The ``RecordMetadata`` of a message msgsafe stored in its outbox (the brokers
    could not take it in time; it is forwarded later): ``partition`` and ``offset`` are
    -1, ``timestamp`` is the send time. A ``RecordMetadata`` in every other way
    (``isinstance``, fields, equality); ``stored`` tells it apart."""

    __slots__ = ()

    #: True: the message waits in the outbox (a confirmed one's metadata has no such field).
    stored = True


class Outcomes:
    """A producer's count of the futures that failed and of those resolved as stored
    (the rare outcomes: a confirmed one is not counted, so the common path takes no lock)."""

    __slots__ = ("_lock", "failed", "stored")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed = 0
        self.stored = 0

    def add(self, *, failed: bool) -> None:
        with self._lock:
            if failed:
                self.failed += 1
            else:
                self.stored += 1


class FutureRecordMetadata(_RealFutureRecordMetadata):  # type: ignore[misc]
    """kafka-python's future of one sent message, resolved by msgsafe's delivery report.

    ``get(timeout)`` waits up to ``timeout`` seconds (None: no limit) and returns the
    ``RecordMetadata``, raises ``KafkaTimeoutError`` when it did not resolve in time, or
    raises the message's error. Callbacks run on the producer's reporting thread (as
    kafka-python runs them on its sender thread); what they raise is logged, not
    propagated, as in kafka-python. msgsafe additions: :meth:`stored` and
    :meth:`message_id`.
    """

    __slots__ = ("_counts", "_msg", "_sizes", "_timestamp", "_topic", "_waiter")

    def __init__(
        self,
        topic: str,
        key_size: int,
        value_size: int,
        header_size: int,
        timestamp: int,
        counts: Outcomes,
    ) -> None:
        # NOTE: kafka-python's own __init__ binds the future to a batch of its
        # accumulator; this one is bound to a delivery report, so only the base
        # Future's state is set up.
        _KafkaFuture.__init__(self)
        self._topic = topic
        self._sizes = (key_size, value_size, header_size)
        self._timestamp = timestamp
        self._waiter: threading.Event | None = None
        self._msg: Any = None
        self._counts = counts

    # --- the delivery report ----------------------------------------------------------

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        """The delivery report (confluent-kafka drop-in's callback): resolve this future."""
        self._msg = msg
        topic = self._topic
        key_size, value_size, header_size = self._sizes
        if err is not None:
            self._counts.add(failed=True)
            self.failure(kafka_python_error(err))
        elif msg.stored():
            self._counts.add(failed=False)
            self.success(
                StoredRecordMetadata(
                    topic,
                    -1,
                    TopicPartition(topic, -1),
                    -1,
                    self._timestamp,
                    None,
                    key_size,
                    value_size,
                    header_size,
                )
            )
        else:
            partition = msg.partition()
            stamp = msg.timestamp()[1]
            self.success(
                RecordMetadata(
                    topic,
                    partition,
                    TopicPartition(topic, partition),
                    msg.offset(),
                    stamp if stamp > 0 else self._timestamp,
                    None,
                    key_size,
                    value_size,
                    header_size,
                )
            )

    def success(self, value: Any) -> Any:
        done = _KafkaFuture.success(self, value)
        self._wake()
        return done

    def failure(self, e: Any) -> Any:
        done = _KafkaFuture.failure(self, e)
        self._wake()
        return done

    def _wake(self) -> None:
        # Read after the base class set is_done under its lock: a get() that saw it
        # unset had put its waiter here first (under the same lock).
        waiter = self._waiter
        if waiter is not None:
            waiter.set()

    # --- kafka-python's API -----------------------------------------------------------

    def get(self, timeout: float | None = None) -> Any:
        """Wait up to ``timeout`` seconds for the outcome; the ``RecordMetadata``, or the
        error raised (``KafkaTimeoutError`` if still pending)."""
        if not self.is_done:
            with self._lock:
                if not self.is_done and self._waiter is None:
                    self._waiter = threading.Event()
                waiter = self._waiter
            if waiter is not None and not waiter.wait(timeout) and not self.is_done:
                raise kafka_errors.KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")
        if self.exception is not None:
            raise self.exception
        return self.value

    def rebind(self, *_args: object) -> None:
        """kafka-python re-binds a future when it splits a batch; msgsafe's are bound to
        one delivery report each."""
        raise NotImplementedError("a msgsafe future is bound to one delivery report")

    # --- msgsafe additions ------------------------------------------------------------

    def stored(self) -> bool:
        """True when the message waits in msgsafe's outbox (resolved with a
        :class:`StoredRecordMetadata`); False while pending, confirmed or failed."""
        return self.is_done and isinstance(self.value, StoredRecordMetadata)

    def message_id(self) -> str | None:
        """The msgsafe id (UUIDv7) in the record's ``msgsafe-id`` header, once resolved."""
        msg = self._msg
        return None if msg is None else str(msg.message_id()) or None

    def __repr__(self) -> str:
        state = "pending"
        if self.is_done:
            state = "failed" if self.exception is not None else "done"
        return f"<FutureRecordMetadata topic={self._topic!r} {state}>"


#: librdkafka's local error codes and the kafka-python exception each becomes (broker
#: codes, > 0, are the Kafka protocol's: kafka-python's ``for_code`` maps them).
_LOCAL_ERRORS: dict[int, type[Exception]] = {
    KafkaError._MSG_TIMED_OUT: kafka_errors.KafkaTimeoutError,
    KafkaError._TIMED_OUT: kafka_errors.KafkaTimeoutError,
    KafkaError._UNKNOWN_TOPIC: kafka_errors.UnknownTopicOrPartitionError,
    KafkaError._UNKNOWN_PARTITION: kafka_errors.UnknownTopicOrPartitionError,
    KafkaError._AUTHENTICATION: kafka_errors.SaslAuthenticationFailedError,
    KafkaError._ALL_BROKERS_DOWN: kafka_errors.KafkaConnectionError,
    KafkaError._TRANSPORT: kafka_errors.KafkaConnectionError,
    KafkaError._DESTROY: kafka_errors.IllegalStateError,
}


def kafka_python_error(err: KafkaError) -> Exception:
    """The kafka-python exception for a ``KafkaError`` of the confluent-kafka drop-in:
    the broker's error class by its code (``MessageSizeTooLargeError``,
    ``PolicyViolationError`` ...), ``KafkaTimeoutError`` for a message that was not
    kept (no outbox), else ``kafka.errors.KafkaError`` with librdkafka's text."""
    code = err.code()
    text = str(err.str())
    if code > 0:
        broker_error: Exception = kafka_errors.for_code(code)(text)
        return broker_error
    kind: type[Exception] = _LOCAL_ERRORS.get(code, kafka_errors.KafkaError)
    return kind(f"{err.name()}: {text}")
