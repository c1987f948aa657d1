"""What :mod:`msgsafe.compat.aiokafka` makes of aiokafka's producer arguments (a
confluent-kafka config for the wrapper's Kafka producer, checked as aiokafka checks
them) and of a delivery report (an aiokafka ``RecordMetadata``, or aiokafka's error).

Kept apart from the producer so it is pure: no I/O, no event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from msgsafe.errors import MissingExtra

try:
    from aiokafka import errors as aiokafka_errors
    from aiokafka.partitioner import DefaultPartitioner
    from aiokafka.structs import RecordMetadata, TopicPartition
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "aiokafka") from exc

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
)

__all__ = [
    "MISSING",
    "DeliveredRecord",
    "ProducerArguments",
    "aiokafka_error",
    "delivered_record",
    "producer_arguments",
]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


#: An argument the caller did not give (aiokafka's own default then applies).
MISSING: Any = _Missing()

_COMPRESSION = ("gzip", "snappy", "lz4", "zstd", None)
_PROTOCOLS = ("SSL", "PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL")
_SASL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: aiokafka's timestamp types (RecordMetadata.timestamp_type).
_CREATE_TIME = 0
_LOG_APPEND_TIME = 1


class DeliveredRecord(RecordMetadata):  # type: ignore[misc]
    """aiokafka's ``RecordMetadata`` of a message the wrapper delivered, plus msgsafe's
    ``stored`` (True: the message waits in the outbox and is forwarded later; its
    ``offset`` and ``partition`` are then -1) and ``message_id`` (the ``msgsafe-id``
    header the consumer sees). A ``RecordMetadata`` in every other respect."""

    stored: bool
    message_id: str


def delivered_record(msg: Any) -> DeliveredRecord:
    """The ``RecordMetadata`` of a delivery report's ``msg`` (the confluent wrapper's)."""
    topic = msg.topic()
    stored = bool(msg.stored())
    partition = msg.partition()
    offset = msg.offset()
    if stored or offset < 0:
        partition, offset = (-1, -1) if stored else (partition, -1)
    kind, stamp = msg.timestamp()
    timestamp: int | None = stamp
    if kind == TIMESTAMP_LOG_APPEND_TIME:
        timestamp_type = _LOG_APPEND_TIME
    elif kind == TIMESTAMP_CREATE_TIME:
        timestamp_type = _CREATE_TIME
    else:
        timestamp, timestamp_type = None, _CREATE_TIME
    record = DeliveredRecord(
        topic, partition, TopicPartition(topic, partition), offset, timestamp, timestamp_type, -1
    )
    record.stored = stored
    record.message_id = msg.message_id()
    return record


#: librdkafka's local error codes -> aiokafka's error class.
_LOCAL: dict[int, type[Exception]] = {
    KafkaError._MSG_TIMED_OUT: aiokafka_errors.KafkaTimeoutError,
    KafkaError._TIMED_OUT: aiokafka_errors.KafkaTimeoutError,
    KafkaError._UNKNOWN_TOPIC: aiokafka_errors.UnknownTopicOrPartitionError,
    KafkaError._UNKNOWN_PARTITION: aiokafka_errors.UnknownTopicOrPartitionError,
    KafkaError._TRANSPORT: aiokafka_errors.KafkaConnectionError,
    KafkaError._ALL_BROKERS_DOWN: aiokafka_errors.KafkaConnectionError,
    KafkaError._AUTHENTICATION: aiokafka_errors.AuthenticationFailedError,
    KafkaError._QUEUE_FULL: aiokafka_errors.KafkaTimeoutError,
    KafkaError._DESTROY: aiokafka_errors.ProducerClosed,
}


def aiokafka_error(err: KafkaError) -> Exception:
    """The aiokafka exception for a ``KafkaError`` of the wrapper: a broker's error
    code maps to aiokafka's class of that code, a local one to its nearest class
    (``KafkaError`` otherwise); the text is librdkafka's."""
    code = err.code()
    kind: type[Exception]
    if code >= 0:
        kind = aiokafka_errors.for_code(code)
    else:
        kind = _LOCAL.get(code, aiokafka_errors.KafkaError)
    return kind(err.str())


@dataclass(frozen=True, slots=True)
class ProducerArguments:
    """What :func:`producer_arguments` made of ``AIOKafkaProducer(**kwargs)``."""

    config: dict[str, Any] = field(repr=False)  #: for the confluent wrapper (credentials)
    key_serializer: Callable[[Any], Any] | None
    value_serializer: Callable[[Any], Any] | None
    max_request_size: int
    max_batch_size: int
    request_timeout_s: float
    #: Overridden or ignored arguments, for CompatWarning.
    warnings: tuple[str, ...]


def producer_arguments(
    *,
    bootstrap_servers: str | Sequence[str],
    client_id: str | None,
    request_timeout_ms: Any,
    acks: Any,
    key_serializer: Callable[[Any], Any] | None,
    value_serializer: Callable[[Any], Any] | None,
    compression_type: str | None,
    max_batch_size: int,
    partitioner: Any,
    max_request_size: int,
    linger_ms: float,
    retry_backoff_ms: int,
    security_protocol: str,
    ssl_context: Any,
    connections_max_idle_ms: int,
    metadata_max_age_ms: int,
    enable_idempotence: bool,
    transactional_id: str | None,
    sasl_mechanism: str,
    sasl_plain_username: str | None,
    sasl_plain_password: str | None,
    outbox: Any,
    require: str,
) -> ProducerArguments:
    """aiokafka's producer arguments, checked as aiokafka checks them (``ValueError``
    with its messages), as a confluent-kafka config for the wrapper.

    ``acks`` other than ``all``/-1 is overridden to ``all`` and ``enable_idempotence``
    is always on (the promise needs both; a warning says so for ``acks``); a custom
    ``partitioner`` is ignored (msgsafe places by key). ``transactional_id`` and TLS
    (``SSL``/``SASL_SSL``: an ``ssl.SSLContext`` cannot be handed to librdkafka) raise
    ``KafkaConfigurationError``; so do GSSAPI and OAUTHBEARER.
    """
    if acks not in (0, 1, -1, "all", MISSING):
        raise ValueError("Invalid ACKS parameter")
    if compression_type not in _COMPRESSION:
        raise ValueError("Invalid compression type!")
    if enable_idempotence and acks not in ("all", -1, MISSING):
        raise ValueError(f"acks={acks} not supported if enable_idempotence=True")
    if security_protocol not in _PROTOCOLS:
        raise ValueError("`security_protocol` should be SSL or PLAINTEXT")
    if security_protocol in ("SSL", "SASL_SSL") and ssl_context is None:
        raise ValueError("`ssl_context` is mandatory if security_protocol=='SSL'")
    if transactional_id is not None:
        raise aiokafka_errors.KafkaConfigurationError(
            "transactions are not supported by msgsafe.compat.aiokafka; use "
            "msgsafe.Producer(..., outbox=PostgresOutbox(...)) for a transactional outbox"
        )
    if security_protocol in ("SSL", "SASL_SSL"):
        raise aiokafka_errors.KafkaConfigurationError(
            "msgsafe.compat.aiokafka does not carry an ssl.SSLContext to its Kafka client; "
            "use msgsafe.compat.confluent_kafka with ssl.* settings for TLS"
        )
    servers = [bootstrap_servers] if isinstance(bootstrap_servers, str) else bootstrap_servers
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(str(s) for s in servers),
        "linger.ms": linger_ms,
        "retry.backoff.ms": retry_backoff_ms,
        "connections.max.idle.ms": connections_max_idle_ms,
        "topic.metadata.refresh.interval.ms": metadata_max_age_ms,
        "message.max.bytes": max(max_request_size, 1000),
        "msgsafe.outbox": outbox,
        "msgsafe.require": require,
    }
    notes: list[str] = []
    if client_id is not None:
        config["client.id"] = client_id
    if acks not in (MISSING, "all", -1):
        notes.append(f"acks={acks} overridden to acks='all' (msgsafe keeps the promise)")
    if compression_type is not None:
        config["compression.type"] = compression_type
    if request_timeout_ms is not MISSING:
        config["message.timeout.ms"] = request_timeout_ms
    if partitioner is not MISSING and not isinstance(partitioner, DefaultPartitioner):
        notes.append("partitioner is ignored: msgsafe places a message by its key")
    if security_protocol == "SASL_PLAINTEXT":
        if sasl_mechanism not in _SASL:
            raise aiokafka_errors.KafkaConfigurationError(
                f"sasl_mechanism {sasl_mechanism!r} is not supported by msgsafe "
                "(PLAIN and SCRAM are)"
            )
        config.update(
            {
                "security.protocol": security_protocol,
                "sasl.mechanism": sasl_mechanism,
                "sasl.username": sasl_plain_username,
                "sasl.password": sasl_plain_password,
            }
        )
    return ProducerArguments(
        config=config,
        key_serializer=key_serializer,
        value_serializer=value_serializer,
        max_request_size=max_request_size,
        max_batch_size=max_batch_size,
        request_timeout_s=(40000 if request_timeout_ms is MISSING else request_timeout_ms) / 1000,
        warnings=tuple(notes),
    )
