"""Options of the Kafka adapter and the librdkafka settings built from them.

Defaults keep the promise: ``acks=all`` with idempotence (no loss, no reordering, no
duplicates from the client's own retries), a bounded ``message.timeout.ms`` tied to
``confirm_timeout`` (every delivery report arrives in time for the outbox to take it),
and a capped reconnect backoff so fail-over takes seconds, not librdkafka's 10 s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from msgsafe.adapters._config import TransportOptions, shown_destination, to_number
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError, InvalidDestination

__all__ = [
    "FETCH_QUEUE_BACKOFF_MS",
    "KafkaOptions",
    "check_destination",
    "client_settings",
    "consumer_settings",
    "producer_settings",
    "setting_number",
]

log = logging.getLogger("msgsafe.kafka")
#: Where librdkafka's own lines go (served by the client's poll()): a caller's
#: ``debug`` setting raises librdkafka's level above ``log_level`` 0, and the lines
#: still reach only this logger, never stderr.
librdkafka_log = logging.getLogger("msgsafe.librdkafka")

#: Settings msgsafe owns: a pass-through may not replace them.
_RESERVED = frozenset(
    {
        "bootstrap.servers",
        "metadata.broker.list",
        "on_delivery",
        "error_cb",
        "on_commit",
        "group.id",
        "sasl.username",
        "sasl.password",
        "enable.auto.offset.store",
    }
)

#: Consumer: milliseconds librdkafka waits before it looks again at a partition whose
#: prefetch it paused (the local queue past ``queued.min.messages`` or
#: ``queued.max.messages.kbytes``; librdkafka's default: 1000). A reader that falls that
#: far behind a fast fetch (a burst, a backlog read at the broker's speed) drains the
#: queue in a fraction of that second, then waits for the next fetch with nothing to
#: read (stalls of 0.1 to 0.8 s in a read of 200,000 messages, see
#: ``benchmarks/bench_consume.py``). Looking again every 20 ms keeps the prefetch
#: ahead; a paused partition costs a timer wake-up per look, no request. A
#: ``librdkafka={"fetch.queue.backoff.ms": ...}`` pass-through replaces it.
FETCH_QUEUE_BACKOFF_MS = 20

_UNSAFE_ACKS = frozenset({"0", "1"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaOptions(TransportOptions):
    """``kafka://`` options (URL query or keywords), on top of the common ones.

    ``librdkafka`` passes further client settings through, by their librdkafka names
    (keyword only, a mapping). Settings that weaken the promise (``acks`` 0/1,
    ``enable.idempotence=false``, ``enable.auto.commit=true``) are refused unless
    ``allow_unsafe=True``, and then logged as a warning.
    """

    #: librdkafka's local queue (messages produced, not yet confirmed).
    max_in_flight: int = 100_000
    #: Producer acknowledgement level; only "all" keeps the promise.
    acks: str = "all"
    #: Idempotent producer: retries never duplicate or reorder within a partition.
    enable_idempotence: bool = True
    #: How long the producer waits to fill a batch.
    linger_ms: float = 5.0
    #: Most messages in one batch.
    batch_num_messages: int = 10_000
    #: Upper bound of the reconnect backoff, so fail-over happens within seconds.
    reconnect_backoff_max_ms: int = 1000
    #: none, gzip, snappy, lz4 or zstd.
    compression: str = "none"
    #: Client id the brokers see in their logs.
    client_id: str = "msgsafe"
    #: SASL mechanism when the URL has credentials (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    sasl_mechanism: str = "PLAIN"
    #: Consumer: where a new group starts (earliest or latest).
    auto_offset_reset: str = "earliest"
    #: Consumer: the group coordinator's session timeout (also bounds rebalance waits).
    session_timeout_ms: int = 10_000
    #: Consumer: heartbeat interval (at most a third of the session timeout).
    heartbeat_interval_ms: int = 1_000
    #: Consumer: the application must call receive() at least this often.
    max_poll_interval_ms: int = 300_000
    #: Further librdkafka settings by their own names (keyword only).
    librdkafka: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Accept pass-through settings that weaken the guarantee (logged as a warning).
    allow_unsafe: bool = False

    def __post_init__(self) -> None:
        TransportOptions.__post_init__(self)
        if not isinstance(self.librdkafka, Mapping):
            raise ConfigurationError(
                "option 'librdkafka' must be a mapping of librdkafka setting names to values "
                "(pass it as a keyword, not in the URL)"
            )
        frozen: dict[str, str] = {}
        for name, value in self.librdkafka.items():
            if not isinstance(name, str):
                raise ConfigurationError("librdkafka setting names must be strings")
            if name in _RESERVED:
                raise ConfigurationError(
                    f"librdkafka setting {name!r} is set by msgsafe; use the URL or options"
                )
            frozen[name] = value if isinstance(value, str) else str(value).lower()
        object.__setattr__(self, "librdkafka", MappingProxyType(frozen))
        if self.acks not in ("all", "-1") and not self.allow_unsafe:
            raise ConfigurationError(
                "acks must be 'all' to keep the promise (allow_unsafe=True to override)"
            )
        if not self.enable_idempotence and not self.allow_unsafe:
            raise ConfigurationError(
                "enable_idempotence=False can reorder or duplicate on retry "
                "(allow_unsafe=True to override)"
            )
        for name, value in frozen.items():
            weak = (
                (name in ("acks", "request.required.acks") and value in _UNSAFE_ACKS)
                or (name == "enable.idempotence" and value.lower() in _FALSE)
                or (name == "enable.auto.commit" and value.lower() not in _FALSE)
            )
            if weak and not self.allow_unsafe:
                raise ConfigurationError(
                    f"librdkafka setting {name}={value} weakens the guarantee "
                    "(allow_unsafe=True to override)"
                )
            if weak:
                log.warning("unsafe librdkafka setting %s=%s accepted (allow_unsafe)", name, value)
        if self.linger_ms < 0 or self.batch_num_messages < 1:
            raise ConfigurationError("linger_ms must be >= 0 and batch_num_messages >= 1")
        if self.reconnect_backoff_max_ms < 10:
            raise ConfigurationError("reconnect_backoff_max_ms must be >= 10")
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ConfigurationError("heartbeat_interval_ms must be at most session_timeout_ms/3")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ConfigurationError("auto_offset_reset must be 'earliest' or 'latest'")


def setting_number(name: str, value: object) -> float:
    """A librdkafka setting's ``value`` (a number, or its text) as a float, by the rules
    the options follow in a URL; :class:`ConfigurationError` naming ``name`` (never the
    value) for anything else."""
    return to_number(name, value, float)


def _message_timeout_ms(options: KafkaOptions) -> int:
    # librdkafka reports every message within message.timeout.ms of produce(), checked
    # on a one-second timer scan; keep that inside confirm_timeout so the report (and the
    # outbox detour) beats the transport's own deadline.
    return max(500, int(options.confirm_timeout * 1000) - 1200)


def client_settings(url: BrokerUrl, options: KafkaOptions) -> dict[str, object]:
    """The settings every librdkafka client of ``url`` shares (servers, timeouts, SASL,
    TLS): the producer's, the consumer's, and the destination checks' AdminClient
    (:mod:`msgsafe.adapters.kafka.check`), so a check reaches the cluster exactly when they do."""
    settings: dict[str, object] = {
        "bootstrap.servers": ",".join(str(e) for e in url.endpoints),
        "client.id": options.client_id,
        "reconnect.backoff.ms": min(100, options.reconnect_backoff_max_ms),
        "reconnect.backoff.max.ms": options.reconnect_backoff_max_ms,
        "socket.connection.setup.timeout.ms": max(1000, int(options.connect_timeout * 1000)),
        # NOTE: librdkafka logs every refused connection at level 3; the adapter
        # reports them through error_cb and the Python logger instead. Whatever it
        # does log (a ``debug`` setting) goes to ``logging``, not to stderr.
        "log_level": 0,
        "logger": librdkafka_log,
    }
    if url.username is not None:
        settings["security.protocol"] = "SASL_SSL" if url.tls else "SASL_PLAINTEXT"
        settings["sasl.mechanism"] = options.sasl_mechanism
        settings["sasl.username"] = url.username
        settings["sasl.password"] = url.password.reveal() if url.password else ""
    elif url.tls:
        settings["security.protocol"] = "SSL"
    if url.tls:
        settings["enable.ssl.certificate.verification"] = options.tls_verify
        if not options.tls_verify:
            settings["ssl.endpoint.identification.algorithm"] = "none"
        if options.tls_ca_file:
            settings["ssl.ca.location"] = options.tls_ca_file
        if options.tls_cert_file:
            settings["ssl.certificate.location"] = options.tls_cert_file
        if options.tls_key_file:
            settings["ssl.key.location"] = options.tls_key_file
    return settings


def producer_settings(url: BrokerUrl, options: KafkaOptions) -> dict[str, object]:
    """librdkafka producer settings (without callbacks)."""
    settings = client_settings(url, options)
    settings.update(
        {
            "acks": options.acks,
            "enable.idempotence": options.enable_idempotence,
            "message.timeout.ms": _message_timeout_ms(options),
            "linger.ms": options.linger_ms,
            "batch.num.messages": options.batch_num_messages,
            "queue.buffering.max.messages": options.max_in_flight,
            "message.max.bytes": max(options.max_message_size + 4096, 1_000_000),
            "compression.codec": options.compression,
            "retry.backoff.max.ms": options.reconnect_backoff_max_ms,
            # NOTE: with broker-side auto-create off, librdkafka holds messages for an
            # unknown topic for 30 s by default, past message.timeout.ms; half the message
            # timeout lets UNKNOWN_TOPIC (permanent: Unroutable) arrive first.
            "topic.metadata.propagation.max.ms": max(1, _message_timeout_ms(options) // 2),
        }
    )
    settings.update(options.librdkafka)
    return settings


def consumer_settings(url: BrokerUrl, options: KafkaOptions, group: str) -> dict[str, object]:
    """librdkafka consumer settings (without callbacks): manual commits only."""
    settings = client_settings(url, options)
    settings.update(
        {
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": options.auto_offset_reset,
            "session.timeout.ms": options.session_timeout_ms,
            "heartbeat.interval.ms": options.heartbeat_interval_ms,
            "max.poll.interval.ms": options.max_poll_interval_ms,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    settings.update(options.librdkafka)
    return settings


#: Kafka's topic rule (``org.apache.kafka.common.internals.Topic.validate``, which
#: brokers apply to every topic they create or are asked for): 1 to 249 characters of
#: ASCII letters, digits, '.', '_' and '-', and not "." or "..".
TOPIC_MAX = 249
_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")


def check_destination(destination: str) -> None:
    """The adapter's name check (see :mod:`msgsafe.adapters`): raises
    :class:`~msgsafe.errors.InvalidDestination` for a topic name Kafka refuses
    (:data:`TOPIC_MAX`, the legal characters, "." and "..")."""
    shown = shown_destination(destination)
    if destination in ("", ".", ".."):
        raise InvalidDestination(f"a Kafka topic cannot be named {shown}")
    if len(destination) > TOPIC_MAX:
        raise InvalidDestination(
            f"Kafka topic names are at most {TOPIC_MAX} characters, this one is "
            f"{len(destination)}: {shown}"
        )
    if _TOPIC.fullmatch(destination) is None:
        raise InvalidDestination(
            "Kafka topic names hold only ASCII letters, digits, '.', '_' and '-': " + shown
        )
