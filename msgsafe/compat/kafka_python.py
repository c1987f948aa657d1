"""``kafka`` (kafka-python) with msgsafe's :class:`KafkaProducer`; every other name is the
original.

``from msgsafe.compat.kafka_python import KafkaProducer`` in place of
``from kafka import KafkaProducer`` is the whole migration. The producer keeps
kafka-python's constructor (keyword settings, see :func:`._kafka_python_config.translate`),
``send()`` returning a :class:`FutureRecordMetadata` (``get(timeout)``,
``add_callback``, ``add_errback``), ``flush``, ``close``, ``partitions_for`` and
``metrics``, for kafka-python 2.x and 3.x code alike. What changes:

- every message is published with ``acks=all`` and idempotence (weaker settings are
  overridden with a :class:`~msgsafe.compat.CompatWarning`);
- a message the brokers cannot take in time goes to msgsafe's durable outbox and is
  forwarded later: its future succeeds with a :class:`StoredRecordMetadata`
  (``partition`` and ``offset`` -1, ``stored`` True; ``future.stored()`` says the same)
  instead of failing with ``KafkaTimeoutError``;
- ``send()`` never waits for metadata: with every broker down it returns at once and
  the message is stored; the constructor connects nowhere (kafka-python 3 bootstraps
  there and raises when no broker answers);
- ``partition=`` and ``timestamp_ms=`` are ignored with a warning: msgsafe places a
  message by its key (murmur2, as kafka-python's default partitioner) so that a key's
  order holds through the outbox.

Underneath is :class:`msgsafe.compat.confluent_kafka.Producer` (librdkafka on msgsafe's
Kafka fast path while nothing fails, msgsafe's Producer and outbox otherwise); a reporting
thread serves its delivery reports and resolves the futures, as kafka-python's sender
thread does. ``docs/migration.md`` lists every difference.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import kafka
    import kafka.errors as errors
    from kafka import (
        ConsumerRebalanceListener,
        KafkaAdminClient,
        KafkaConsumer,
        OffsetAndMetadata,
        TopicPartition,
    )
    from kafka.serializer import Deserializer, Serializer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "kafka-python") from exc

from confluent_kafka import KafkaError, KafkaException

from msgsafe.compat._common import ClosesOnExit, warn
from msgsafe.compat._kafka_python_config import KAFKA_PYTHON_3, translate
from msgsafe.compat._kafka_python_future import (
    FutureRecordMetadata,
    Outcomes,
    RecordMetadata,
    StoredRecordMetadata,
    kafka_python_error,
)
from msgsafe.compat.confluent_kafka import Producer as _Librdkafka

__all__ = [
    "ConsumerRebalanceListener",
    "Deserializer",
    "FutureRecordMetadata",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaProducer",
    "OffsetAndMetadata",
    "RecordMetadata",
    "Serializer",
    "StoredRecordMetadata",
    "TopicPartition",
    "errors",
]

log = logging.getLogger("msgsafe.compat")

#: Longest wait of the reporting thread in one poll (also how soon it sees a close).
_REPORT_SLICE_S = 0.1
#: Longest single wait of flush() in the drop-in (then it looks at the time left).
_FLUSH_SLICE_S = 0.1
#: Pause of send() while librdkafka's queue is full (the reporting thread empties it).
_FULL_PAUSE_S = 0.005
#: Pause between metadata requests of partitions_for() while a topic has none yet.
_METADATA_PAUSE_S = 0.1
#: Metadata errors of a topic that is being created: asked again.
_TOPIC_NOT_READY = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE)
#: Seconds close() without a timeout gives the outbox to forward what it holds once every
#: future is resolved (what is left stays for the next producer on the same outbox).
_CLOSE_GRACE_S = 5.0


def _serve_reports(inner: _Librdkafka, stop: threading.Event, closing: list[bool]) -> None:
    """The reporting thread: serve the drop-in's delivery reports (each resolves a
    future) until ``stop``; a close() called from a callback on this thread is done here
    once that callback returned (``closing``)."""
    while not stop.is_set():
        try:
            inner.poll(_REPORT_SLICE_S)
        except RuntimeError:  # the drop-in was closed under us
            return
        except Exception:  # a callback's error with error_on_callbacks: kafka-python logs it
            log.exception("kafka-python wrapper: error in a delivery callback")
    if closing[0]:
        inner.close(0)


def _shutdown(
    inner: _Librdkafka, stop: threading.Event, thread: threading.Thread, timeout: float
) -> None:
    # At garbage collection or interpreter exit (kafka-python closes with timeout=1
    # there): what is in flight gets its chance; what is stored stays in the outbox.
    stop.set()
    if thread is not threading.current_thread():
        thread.join(timeout + _REPORT_SLICE_S)
    try:
        inner.close(timeout)
    except Exception:  # pragma: no cover - best effort at exit
        log.debug("closing the kafka-python wrapper at exit", exc_info=True)


class KafkaProducer(ClosesOnExit):
    """kafka-python's ``KafkaProducer`` that confirms with ``acks=all`` or stores in the
    outbox.

    ``KafkaProducer(**configs)`` with kafka-python's setting names (an unknown one raises
    ``ValueError``), plus ``msgsafe_outbox`` (True, False or a file path; default: the
    user's data directory) and ``msgsafe_require``. ``_url`` replaces the broker URL
    (tests point it at ``memory://``). Thread-safe, as kafka-python's: ``send``,
    ``flush`` and ``close`` from any thread; futures resolve on the reporting thread.
    """

    def __init__(self, **configs: Any) -> None:
        url = configs.pop("_url", None)
        settings = translate(configs)
        for note in settings.warnings:
            warn(note)
        try:
            inner = _Librdkafka(settings.librdkafka, _url=url)
        except KafkaException as exc:
            raise errors.KafkaConfigurationError(str(exc.args[0].str())) from exc
        #: kafka-python's defaults with the given settings, as in force (``acks`` -1,
        #: ``enable_idempotence`` True).
        self.config: dict[str, Any] = settings.config
        self._inner = inner
        self._key_serializer = settings.key_serializer
        self._value_serializer = settings.value_serializer
        self._max_block_s = settings.max_block_s
        self._closed = False
        self._warned: set[str] = set()
        self._counts = Outcomes()
        self._stop = threading.Event()
        self._closing = [False]
        self._reporter = threading.Thread(
            target=_serve_reports,
            args=(inner, self._stop, self._closing),
            name=f"msgsafe-kafka-python-{self.config['client_id']}",
            daemon=True,
        )
        self._reporter.start()
        self._finalizer = weakref.finalize(self, _shutdown, inner, self._stop, self._reporter, 1.0)

    # --- sending --------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: list[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Publish a message; the future resolves once it is confirmed (``acks=all``) or
        stored in the outbox, or fails with a kafka-python error.

        Raises as the installed kafka-python does before anything is sent. With 3.x:
        ``ValueError`` without key and value, ``TypeError`` for bad headers or a
        serializer that returns no bytes, ``MessageSizeTooLargeError``,
        ``KafkaTimeoutError`` when the queue stayed full for ``max_block_ms``, and
        ``IllegalStateError`` after :meth:`close`. 2.x checks the first three and the
        closed producer with ``assert`` (``AssertionError``, same text) and returns an
        oversize message as a failed future instead of raising.
        """
        if self._closed:
            raise _usage_error(errors.IllegalStateError("KafkaProducer already closed!"))
        if value is None and key is None:
            raise _usage_error(ValueError("Need at least one: key or value"))
        if headers is None:
            headers = []
        elif not isinstance(headers, list):
            raise _usage_error(TypeError("headers must be list-type"))
        elif not all(
            isinstance(h, tuple)
            and len(h) == 2
            and isinstance(h[0], str)
            and isinstance(h[1], bytes)
            for h in headers
        ):
            raise _usage_error(TypeError("All headers items must be (str, bytes) tuples"))
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        serialize = self._key_serializer
        key_bytes = key if serialize is None else serialize(topic, headers, key)
        serialize = self._value_serializer
        value_bytes = value if serialize is None else serialize(topic, headers, value)
        if type(key_bytes) is not bytes:
            key_bytes = _as_bytes("key", key_bytes)
        if type(value_bytes) is not bytes:
            value_bytes = _as_bytes("value", value_bytes)
        if partition is not None:
            self._check_partition(partition)
        if timestamp_ms is not None:
            self._warn_once(
                "timestamp", "send(timestamp_ms=...) is ignored: the producer stamps the send time"
            )
        header_size = (
            sum(len(name.encode("utf-8")) + len(data) for name, data in headers) if headers else -1
        )
        future = FutureRecordMetadata(
            topic,
            -1 if key_bytes is None else len(key_bytes),
            -1 if value_bytes is None else len(value_bytes),
            header_size,
            int(time.time() * 1000),
            self._counts,
        )
        try:
            self._produce(topic, value_bytes, key_bytes, future, headers or None)
        except errors.BrokerResponseError as exc:
            if KAFKA_PYTHON_3:
                raise
            # kafka-python 2.x: a broker error found before the send (an oversize
            # message) fails the future it returns.
            log.error("%s: Exception occurred during message send: %s", self, exc)
            future.failure(exc)
        return future

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        future: FutureRecordMetadata,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        deadline = 0.0
        while True:
            try:
                # (topic, value, key, partition, on_delivery, timestamp, headers):
                # positional, the drop-in's fast path for the common message.
                self._inner.produce(topic, value, key, -1, future, 0, headers)
                return
            except BufferError:
                # kafka-python blocks up to max_block_ms for room in its buffer.
                now = time.monotonic()
                if not deadline:
                    deadline = now + self._max_block_s
                elif now >= deadline:
                    raise errors.KafkaTimeoutError(
                        "Failed to allocate memory within the configured max blocking time "
                        f"{self._max_block_s * 1000:.0f} ms."
                    ) from None
                time.sleep(_FULL_PAUSE_S)
            except KafkaException as exc:
                raise kafka_python_error(exc.args[0]) from exc
            except RuntimeError as exc:  # closed by another thread meanwhile
                raise errors.IllegalStateError("KafkaProducer already closed!") from exc

    def _check_partition(self, partition: object) -> None:
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        if partition < 0:
            raise ValueError("partition must be >= 0")
        self._warn_once(
            "partition",
            "send(partition=...) is ignored: msgsafe places a message by its key "
            "(messages with the same key keep their order)",
        )

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, depth=2)

    # --- waiting ------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send what lingers now and wait until every message sent so far is resolved
        (confirmed, stored or failed): ``KafkaTimeoutError`` after ``timeout`` seconds
        (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        inner = self._inner
        while len(inner) > 0:
            left = _FLUSH_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise errors.KafkaTimeoutError(
                    f"Timeout after waiting for {timeout} secs."
                ) from None
            try:
                inner.flush(min(left, _FLUSH_SLICE_S))
            except RuntimeError:  # closed meanwhile: nothing is left to wait for
                return

    def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
        """Flush within ``timeout`` seconds (None: no limit), give the outbox up to 5 s of
        what is left to forward what it holds, then stop the reporting thread and the
        producer. What the outbox still holds stays there for the next producer on the
        same outbox; calling it again does nothing. From a callback (the reporting
        thread) it does not wait, as kafka-python's."""
        del null_logger  # kafka-python's switch for its own logger at exit
        if self._closed:
            return
        if timeout is not None and not 0 <= timeout <= threading.TIMEOUT_MAX:
            raise ValueError(f"Invalid timeout: {timeout}")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._closed = True
        self._finalizer.detach()
        if threading.current_thread() is self._reporter:
            log.warning("KafkaProducer.close() from a callback: not waiting for sends")
            self._closing[0] = True
            self._stop.set()
            return
        try:
            self.flush(timeout)
        except errors.KafkaTimeoutError:
            log.info("kafka-python wrapper: closing with messages not yet reported")
        self._stop.set()
        self._reporter.join()
        left = _CLOSE_GRACE_S if deadline is None else max(0.0, deadline - time.monotonic())
        self._inner.close(min(left, _CLOSE_GRACE_S))

    # --- metadata -----------------------------------------------------------------------

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of ``topic`` (made by the brokers if they create topics on
        first use), waiting up to ``max_block_ms``: ``KafkaTimeoutError`` after that."""
        self._check_open()
        deadline = time.monotonic() + self._max_block_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.KafkaTimeoutError(
                    f"Failed to update metadata after {self._max_block_s:.1f} secs."
                )
            try:
                metadata = self._inner.list_topics(topic, timeout=left)
            except KafkaException as exc:
                if exc.args[0].code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
                    continue
                raise kafka_python_error(exc.args[0]) from exc
            found = metadata.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return set(found.partitions)
            if (
                found is not None
                and found.error is not None
                and not found.error.retriable()
                and found.error.code() not in _TOPIC_NOT_READY
            ):
                raise kafka_python_error(found.error)
            time.sleep(min(_METADATA_PAUSE_S, max(0.0, deadline - time.monotonic())))

    def bootstrap_connected(self) -> bool:
        """Whether a broker answers a metadata request now (within a second)."""
        self._check_open()
        try:
            self._inner.list_topics(timeout=1.0)
        except KafkaException:
            return False
        return True

    def metrics(self, raw: bool = False) -> dict[str, Any] | None:
        """What msgsafe counts, in kafka-python's shape (``{group: {name: value}}``; None
        with ``metrics_enabled=False``): messages not yet resolved, futures failed,
        messages stored, outbox rows waiting. ``raw`` gives the same dict."""
        del raw
        if not self.config.get("metrics_enabled", True):
            return None
        failed, stored = self._counts.failed, self._counts.stored
        return {
            "producer-metrics": {
                "record-queue-size": len(self._inner),
                "record-error-total": failed,
            },
            "msgsafe": {
                "record-stored-total": stored,
                "outbox-pending": self._inner.pending(),
            },
        }

    # --- transactions: refused at construction, as without a transactional_id ------------

    def init_transactions(self) -> None:
        raise errors.IllegalStateError(
            "Cannot call init_transactions without setting a transactional_id."
        )

    def begin_transaction(self) -> None:
        raise errors.IllegalStateError(
            "Cannot use transactional methods without enabling transactions"
        )

    def send_offsets_to_transaction(self, offsets: object, group_metadata: object) -> None:
        raise errors.IllegalStateError(
            "Cannot use transactional methods without enabling transactions"
        )

    def commit_transaction(self) -> None:
        raise errors.IllegalStateError(
            "Cannot commit transaction since transactions are not enabled"
        )

    def abort_transaction(self) -> None:
        raise errors.IllegalStateError(
            "Cannot abort transaction since transactions are not enabled."
        )

    # --- msgsafe additions --------------------------------------------------------------

    def pending(self) -> int:
        """Messages waiting in the outbox to be forwarded."""
        return self._inner.pending()

    @property
    def is_open(self) -> bool:
        """msgsafe addition: False once :meth:`close` ran (``with`` closes on leaving)."""
        return not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("KafkaProducer already closed!")

    def __str__(self) -> str:
        return (
            f"<KafkaProducer client_id={self.config.get('client_id')} "
            "transactional_id=None (msgsafe)>"
        )

    __repr__ = __str__


def _usage_error(exc: Exception) -> Exception:
    """What the installed kafka-python raises for a misuse that 3.x reports as ``exc``:
    ``exc`` itself, or with 2.x, whose ``send`` checks it with ``assert``, an
    ``AssertionError`` of the same text."""
    return exc if KAFKA_PYTHON_3 else AssertionError(str(exc))


def _as_bytes(what: str, data: object) -> bytes | None:
    """A serialized key or value as librdkafka takes it; what kafka-python raises
    (:func:`_usage_error` of a TypeError) for anything but bytes, bytearray,
    memoryview or None."""
    if data is None:
        return None
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, bytes):  # a bytes subclass
        return bytes(data)
    raise _usage_error(TypeError(f"Unsupported type for serialized {what}: {type(data)}"))


def __getattr__(name: str) -> Any:
    # Every other name of ``kafka`` (IsolationLevel, DefaultSerializer, admin, ...) is
    # the original, whichever kafka-python is installed.
    return getattr(kafka, name)
