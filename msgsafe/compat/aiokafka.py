"""``aiokafka`` with msgsafe's :class:`AIOKafkaProducer`; every other name is the original.

``from msgsafe.compat.aiokafka import AIOKafkaProducer`` in place of aiokafka's import
is the whole migration. The producer keeps aiokafka's API: ``start()``, ``stop()``,
``send()`` (a future resolving to ``RecordMetadata``), ``send_and_wait()``,
``create_batch()`` / ``send_batch()``, ``flush()``, ``partitions_for()`` and
``async with``. What changes:

- every message is published with ``acks=all`` and idempotence (weaker ``acks`` is
  overridden with a :class:`~msgsafe.compat.CompatWarning`);
- a message the brokers cannot take in time is stored in msgsafe's durable outbox and
  forwarded later instead of failing with ``KafkaTimeoutError``: its future resolves
  with a :class:`DeliveredRecord` whose ``stored`` is True and whose ``offset`` and
  ``partition`` are -1;
- an explicit ``partition`` and a custom ``partitioner`` are ignored with a warning
  (msgsafe places a message by its key: same key, same partition, order kept).

Underneath is the confluent-kafka drop-in's producer
(:class:`msgsafe.compat.confluent_kafka.Producer`: its librdkafka fast path while
nothing fails, msgsafe's outbox path after a failure), its reports settled on the event
loop by :class:`~msgsafe.compat._confluent_aio.LoopReports`. How the arguments
translate is in :mod:`._aiokafka_config`; ``docs/migration.md`` lists every difference.
"""

from __future__ import annotations

import asyncio
import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

from msgsafe.errors import MissingExtra

try:
    from aiokafka import (
        AIOKafkaClient,
        AIOKafkaConsumer,
        ConsumerRebalanceListener,
        ConsumerRecord,
        ConsumerStoppedError,
        IllegalOperation,
        OffsetAndMetadata,
        OffsetAndTimestamp,
        TopicPartition,
        errors,
    )
    from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, ProducerClosed
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.structs import RecordMetadata
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "aiokafka") from exc

from confluent_kafka import KafkaError, KafkaException

from msgsafe.compat._aiokafka_config import (
    MISSING,
    DeliveredRecord,
    aiokafka_error,
    delivered_record,
    producer_arguments,
)
from msgsafe.compat._common import warn
from msgsafe.compat._confluent_aio import LoopReports
from msgsafe.compat.confluent_kafka import Producer as _Producer

__all__ = [
    "AIOKafkaClient",
    "AIOKafkaConsumer",
    "AIOKafkaProducer",
    "BatchBuilder",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "ConsumerStoppedError",
    "DeliveredRecord",
    "IllegalOperation",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
    "errors",
]

#: Seconds between tries while the local queue is full (aiokafka's send() waits too).
_QUEUE_FULL_WAIT_S = 0.005


def _check_bytes(what: str, value: object) -> bytes | None:
    # aiokafka's record builder takes bytes-like values only (TypeError otherwise).
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"Not supported type for {what}: {type(value)}")


class BatchBuilder:
    """aiokafka's ``BatchBuilder``: records for :meth:`AIOKafkaProducer.send_batch`.

    ``append()`` returns the record's metadata, or None once the batch is full
    (``max_batch_size``; the first record is always taken) or closed: the sizes are
    aiokafka's own record batch builder's. The records are produced one by one; the
    batch's future resolves when every one is confirmed or stored.
    """

    def __init__(
        self,
        batch_size: int,
        key_serializer: Callable[[Any], Any] | None,
        value_serializer: Callable[[Any], Any] | None,
    ) -> None:
        self._builder = DefaultRecordBatchBuilder(
            2, 0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=0,
            batch_size=batch_size,
        )  # fmt: skip
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._closed = False
        #: (key, value, headers) in append order.
        self.records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []

    def append(
        self,
        *,
        timestamp: float | None,
        key: Any,
        value: Any,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Any:
        """Add a record; its metadata, or None when the batch is full or closed."""
        if self._closed:
            return None
        if self._key_serializer is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None:
            value = self._value_serializer(value)
        key_bytes, value_bytes = _check_bytes("key", key), _check_bytes("value", value)
        header_list = list(headers or [])
        metadata = self._builder.append(
            len(self.records), timestamp, key=key_bytes, value=value_bytes, headers=header_list
        )
        if metadata is None:
            self.close()
            return None
        self.records.append((key_bytes, value_bytes, header_list))
        return metadata

    def close(self) -> None:
        """No more records (as aiokafka's: a closed batch takes none)."""
        self._closed = True

    def closed(self) -> bool:
        return self._closed

    def size(self) -> int:
        """The batch's size in bytes, as aiokafka's builder counts it."""
        return int(self._builder.size())

    def record_count(self) -> int:
        return len(self.records)


class AIOKafkaProducer:
    """An ``aiokafka.AIOKafkaProducer`` that confirms with ``acks=all`` or stores.

    Takes aiokafka's keyword arguments (checked as aiokafka checks them) and two of
    msgsafe's: ``msgsafe_outbox`` (True: the default outbox file, False, or a path) and
    ``msgsafe_require`` (``"durable"``: see :mod:`msgsafe.checks.gate`). The wrapper's
    Kafka client is made by :meth:`start`; every blocking call runs in the event loop's
    default executor. ``_url`` replaces the broker URL (tests point it at ``memory://``).
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        bootstrap_servers: str | Sequence[str] = "localhost",
        client_id: str | None = None,
        metadata_max_age_ms: int = 300000,
        request_timeout_ms: Any = MISSING,
        api_version: Any = None,
        acks: Any = MISSING,
        key_serializer: Callable[[Any], Any] | None = None,
        value_serializer: Callable[[Any], Any] | None = None,
        compression_type: str | None = None,
        max_batch_size: int = 16384,
        partitioner: Any = MISSING,
        max_request_size: int = 1048576,
        linger_ms: float = 0,
        retry_backoff_ms: int = 100,
        security_protocol: str = "PLAINTEXT",
        ssl_context: Any = None,
        connections_max_idle_ms: int = 540000,
        enable_idempotence: bool = False,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60000,
        sasl_mechanism: str = "PLAIN",
        sasl_plain_password: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_kerberos_service_name: str = "kafka",
        sasl_kerberos_domain_name: str | None = None,
        sasl_oauth_token_provider: Any = None,
        msgsafe_outbox: bool | str = True,
        msgsafe_require: str = "durable",
        _url: str | None = None,
    ) -> None:
        if loop is None:
            loop = asyncio.get_running_loop()
        else:
            warnings.warn(
                "The `loop` parameter has been deprecated since 0.7.1 "
                "and will be removed in a future release.",
                DeprecationWarning,
                stacklevel=2,
            )
        if api_version is not None:
            warnings.warn(
                "The `api_version` parameter has been deprecated since 0.13.0. "
                "It is now a no-op and will be removed in a future release. ",
                DeprecationWarning,
                stacklevel=2,
            )
        self._loop = loop
        self._producer: _Producer | None = None
        self._reports: LoopReports | None = None
        self._arguments = producer_arguments(
            bootstrap_servers=bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            acks=acks,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            compression_type=compression_type,
            max_batch_size=max_batch_size,
            partitioner=partitioner,
            max_request_size=max_request_size,
            linger_ms=linger_ms,
            retry_backoff_ms=retry_backoff_ms,
            security_protocol=security_protocol,
            ssl_context=ssl_context,
            connections_max_idle_ms=connections_max_idle_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            enable_idempotence=enable_idempotence,
            transactional_id=transactional_id,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
            outbox=msgsafe_outbox,
            require=msgsafe_require,
        )
        for note in self._arguments.warnings:
            warn(note)
        self._url = _url
        self._topics: set[str] = set()
        self._warned: set[str] = set()
        self._closed = False  #: as aiokafka's: True once stop() began (set last, as there)

    # --- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Make the wrapper's Kafka client (off the loop) and its report thread."""
        if self._producer is not None:
            return
        if self._closed:
            raise ProducerClosed()
        config = dict(self._arguments.config)
        try:
            producer = await self._loop.run_in_executor(
                None, functools.partial(_Producer, config, _url=self._url)
            )
        except KafkaException as exc:
            raise errors.KafkaConfigurationError(exc.args[0].str()) from exc
        self._producer = producer
        self._reports = LoopReports(self._loop, producer, aiokafka_error, delivered_record)
        weakref.finalize(self, self._reports.stop)

    async def stop(self) -> None:
        """Flush (every future confirmed or stored), then close; again: nothing."""
        if self._closed:
            return
        self._closed = True
        producer, reports = self._producer, self._reports
        if producer is None or reports is None:
            return
        try:
            await self._loop.run_in_executor(None, producer.flush)
        finally:
            await self._loop.run_in_executor(None, reports.join)
            await self._loop.run_in_executor(None, producer.close)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __del__(self, _warnings: Any = warnings) -> None:
        if getattr(self, "_closed", True) is False:
            _warnings.warn(f"Unclosed AIOKafkaProducer {self!r}", ResourceWarning, source=self)
            context = {"producer": self, "message": "Unclosed AIOKafkaProducer"}
            if not self._loop.is_closed():
                self._loop.call_exception_handler(context)

    # --- sending ------------------------------------------------------------------------

    def _open(self) -> _Producer:
        producer = self._producer
        if self._closed:
            raise ProducerClosed()
        if producer is None:
            raise IllegalOperation("the producer is not started: await producer.start()")
        return producer

    def _ignored(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, depth=2)

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one message; the future resolves to its :class:`DeliveredRecord`
        (``stored`` True: in the outbox, forwarded later) or fails with aiokafka's
        error. Raises ``ProducerClosed`` after :meth:`stop`, ``TypeError`` for a value or
        key that is not bytes (after the serializers), ``MessageSizeTooLargeError``
        over ``max_request_size``, ``KafkaTimeoutError`` when the local queue stays full
        for ``request_timeout_ms``."""
        producer = self._open()
        if value is None and key is None:
            # NOTE: aiokafka's own check, an assert there (AssertionError).
            raise AssertionError("Need at least one: key or value")
        arguments = self._arguments
        if arguments.key_serializer is not None:
            key = arguments.key_serializer(key)
        if arguments.value_serializer is not None:
            value = arguments.value_serializer(value)
        key_bytes, value_bytes = _check_bytes("key", key), _check_bytes("value", value)
        header_list = list(headers) if headers else []
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key_bytes, value_bytes, header_list)
        if size > arguments.max_request_size:
            raise MessageSizeTooLargeError(
                f"The message is {size} bytes when serialized which is larger than the "
                "maximum request size you have configured with the max_request_size "
                "configuration"
            )
        if partition is not None:
            self._ignored(
                "partition", "send(partition=...) is ignored: msgsafe places a message by its key"
            )
        if timestamp_ms is not None:
            self._ignored(
                "timestamp", "send(timestamp_ms=...) is ignored; the producer stamps the send time"
            )
        future: asyncio.Future[RecordMetadata] = self._loop.create_future()
        assert self._reports is not None  # set with _producer
        report = self._reports.report(future)
        await self._produce(producer, topic, value_bytes, key_bytes, report, header_list or None)
        return future

    async def _produce(
        self,
        producer: _Producer,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        report: Callable[[Any, Any], None],
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        deadline = self._loop.time() + self._arguments.request_timeout_s
        while True:
            try:
                if topic in self._topics:
                    producer.produce(topic, value, key, -1, report, 0, headers)
                else:
                    # The first message of a topic: the producer checks the topic once
                    # (metadata from the brokers), off the event loop.
                    await self._loop.run_in_executor(
                        None,
                        functools.partial(
                            producer.produce, topic, value, key, -1, report, 0, headers
                        ),
                    )
                    self._topics.add(topic)
                return
            except BufferError:
                if self._loop.time() >= deadline:
                    raise KafkaTimeoutError() from None
                await asyncio.sleep(_QUEUE_FULL_WAIT_S)
            except KafkaException as exc:
                raise aiokafka_error(exc.args[0]) from exc
            except RuntimeError as exc:  # closed meanwhile
                raise ProducerClosed() from exc

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> RecordMetadata:
        """:meth:`send`, and wait for the result."""
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future

    def create_batch(self) -> BatchBuilder:
        """An empty :class:`BatchBuilder` (``max_batch_size``, the serializers)."""
        arguments = self._arguments
        return BatchBuilder(
            arguments.max_batch_size, arguments.key_serializer, arguments.value_serializer
        )

    async def send_batch(
        self, batch: BatchBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[RecordMetadata]:
        """Send the batch's records (the batch is closed); the future resolves to the
        first record's :class:`DeliveredRecord` once every record is confirmed or
        stored, or fails with the first error. ``partition`` is ignored, as in
        :meth:`send`."""
        producer = self._open()
        batch.close()
        self._ignored("partition", "send_batch(partition=...) is ignored: msgsafe places by key")
        assert self._reports is not None  # set with _producer
        futures: list[asyncio.Future[RecordMetadata]] = []
        for key, value, headers in batch.records:
            future: asyncio.Future[RecordMetadata] = self._loop.create_future()
            report = self._reports.report(future)
            await self._produce(producer, topic, value, key, report, headers or None)
            futures.append(future)
        return asyncio.ensure_future(_first_of(futures))

    async def flush(self) -> None:
        """Wait until every message sent so far is confirmed or stored (its future
        resolved); as the confluent wrapper's ``flush()``, then let the outbox forward
        what it holds for up to the confirm timeout."""
        producer = self._open()
        await self._loop.run_in_executor(None, producer.flush)

    async def partitions_for(self, topic: str) -> set[int]:
        """The topic's partitions, from the brokers' metadata."""
        producer = self._open()
        timeout = self._arguments.request_timeout_s
        metadata = await self._loop.run_in_executor(
            None, functools.partial(producer.list_topics, topic, timeout)
        )
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise aiokafka_error(
                described.error
                if described is not None
                else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            )
        return set(described.partitions)

    def pending(self) -> int:
        """msgsafe addition: messages waiting in the outbox to be forwarded."""
        return 0 if self._producer is None else self._producer.pending()

    # --- transactions: not wrapped (transactional_id is refused) ------------------------

    def _not_transactional(self) -> None:
        raise IllegalOperation("You need to configure transaction_id to use transactions")

    async def begin_transaction(self) -> None:
        self._not_transactional()

    async def commit_transaction(self) -> None:
        self._not_transactional()

    async def abort_transaction(self) -> None:
        self._not_transactional()

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        self._not_transactional()

    def transaction(self) -> Any:
        self._not_transactional()

    def __repr__(self) -> str:
        inner = "not started" if self._producer is None else repr(self._producer)
        return f"<msgsafe.compat.aiokafka.AIOKafkaProducer {inner}>"


async def _first_of(futures: list[asyncio.Future[RecordMetadata]]) -> RecordMetadata:
    """The first record's metadata once every future resolved (the first error raised)."""
    results = await asyncio.gather(*futures)
    if not results:
        raise ValueError("the batch has no records")
    return results[0]
