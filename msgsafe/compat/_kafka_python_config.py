"""kafka-python's ``KafkaProducer(**configs)`` turned into a librdkafka config dict for
:class:`msgsafe.compat.confluent_kafka.Producer`, which the kafka-python drop-in drives.

Pure (no I/O, no client), so it is testable on its own. Only what the user gave is
translated: kafka-python's own defaults (``delivery_timeout_ms`` 120 s, ``retries``
infinite, ``acks`` 1 in 2.x or ``all`` in 3.x) never replace msgsafe's, which keep the
promise whichever kafka-python the code was written for.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import kafka
    import kafka.errors as kafka_errors
    from kafka import KafkaProducer as _RealProducer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "kafka-python") from exc

__all__ = [
    "KAFKA_PYTHON_3",
    "MSGSAFE_OPTIONS",
    "ProducerSettings",
    "Serialize",
    "translate",
]

#: Whether the installed kafka-python is 3.x: serializers receive the record's headers
#: (``serialize(topic, headers, data)``) and ``acks='all'`` with idempotence is the
#: default (KIP-679). 2.x calls ``serializer(data)`` and defaults to ``acks=1``.
KAFKA_PYTHON_3 = int(str(kafka.__version__).split(".", 1)[0]) >= 3

#: msgsafe's own keyword options: the outbox (True, False or a file path) and the
#: destination requirement (``any``, ``durable``, ``replicated``).
MSGSAFE_OPTIONS = ("msgsafe_outbox", "msgsafe_require")

#: ``serialize(topic, headers, data) -> bytes | None``, as the producer calls it.
Serialize = Callable[[str, list[tuple[str, bytes]], Any], Any]

#: kafka-python name -> librdkafka name, the value passed as it is.
_SAME: Mapping[str, str] = {
    "client_id": "client.id",
    "linger_ms": "linger.ms",
    "batch_size": "batch.size",
    "request_timeout_ms": "request.timeout.ms",
    "retry_backoff_ms": "retry.backoff.ms",
    "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "metadata_max_age_ms": "metadata.max.age.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "send_buffer_bytes": "socket.send.buffer.bytes",
    "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "security_protocol": "security.protocol",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
    "ssl_ciphers": "ssl.cipher.suites",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "client_dns_lookup": "client.dns.lookup",
    "allow_auto_create_topics": "allow.auto.create.topics",
    "delivery_timeout_ms": "message.timeout.ms",
    "max_request_size": "message.max.bytes",
}

#: Settings of kafka-python's own networking that librdkafka replaces: accepted, unused.
_NOT_USED = frozenset(
    {
        "api_version",
        "api_version_auto_timeout_ms",
        "bootstrap_timeout_ms",
        "buffer_memory",
        "kafka_client",
        "metric_reporters",
        "metrics_enabled",
        "metrics_num_samples",
        "metrics_sample_window_ms",
        "receive_message_max_bytes",
        "selector",
        "socket_options",
        "transaction_timeout_ms",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "max_block_ms",
        "key_serializer",
        "value_serializer",
    }
)

#: What librdkafka cannot do for the wrapper: refused at construction.
_REFUSED: Mapping[str, str] = {
    "transactional_id": "transactions are not supported by msgsafe.compat.kafka_python; use "
    "msgsafe.Producer(..., outbox=PostgresOutbox(...)) for a transactional outbox",
    "ssl_context": "ssl_context is not supported: give ssl_cafile / ssl_certfile / ssl_keyfile",
    "sasl_oauth_token_provider": "SASL OAUTHBEARER is not supported by the wrapper",
    "sasl_kerberos_name": "SASL GSSAPI is not supported by the wrapper",
    "proxy_url": "connecting through a SOCKS proxy is not supported by the wrapper",
    "socks5_proxy": "connecting through a SOCKS proxy is not supported by the wrapper",
}

#: kafka-python 2.x settings 3.x dropped (accepted whichever is installed).
_OLDER_NAMES = frozenset({"api_version_auto_timeout_ms", "buffer_memory"})

#: The most in-flight requests librdkafka allows an idempotent producer.
_IDEMPOTENT_IN_FLIGHT_MAX = 5


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """What :func:`translate` made of ``KafkaProducer(**configs)``."""

    #: librdkafka settings for :class:`msgsafe.compat.confluent_kafka.Producer` (may
    #: hold SASL credentials: never logged).
    librdkafka: dict[str, object] = field(repr=False)
    #: ``producer.config``: kafka-python's defaults with the user's values, as in force
    #: (``acks`` -1 and ``enable_idempotence`` True whatever was asked).
    config: dict[str, Any] = field(repr=False)
    key_serializer: Serialize | None
    value_serializer: Serialize | None
    #: Seconds send() may wait for room in the queue; partitions_for() for metadata.
    max_block_s: float
    warnings: tuple[str, ...]


def _servers(value: object) -> str:
    if isinstance(value, str):
        hosts = [h.strip() for h in value.split(",")]
    elif isinstance(value, (list, tuple)):
        hosts = [str(h).strip() for h in value]
    else:
        raise kafka_errors.KafkaConfigurationError(
            "bootstrap_servers must be a 'host[:port]' string or a list of them"
        )
    # kafka-python's default port is 9092, as librdkafka's; "PLAINTEXT://h:p" is
    # accepted by both.
    hosts = [h for h in hosts if h]
    if not hosts:
        raise kafka_errors.KafkaConfigurationError("bootstrap_servers names no broker")
    return ",".join(hosts)


def _serializer(name: str, value: object) -> Serialize | None:
    """The serializer as a ``(topic, headers, data)`` callable, called as the installed
    kafka-python calls it: 3.x passes the headers to a ``Serializer`` and wraps a plain
    callable (with its DeprecationWarning); 2.x calls ``serialize(topic, data)`` or
    ``f(data)``."""
    if value is None:
        return None
    base = kafka.serializer.Serializer
    if isinstance(value, base):
        serialize = value.serialize
        if KAFKA_PYTHON_3:

            def with_headers(topic: str, headers: list[tuple[str, bytes]], data: Any) -> Any:
                try:
                    return serialize(topic, headers, data)
                except TypeError:
                    # kafka-python 3 retries a serializer of the 2.x signature.
                    return serialize(topic, data)

            return with_headers
        return lambda topic, _headers, data: serialize(topic, data)
    if not callable(value):
        raise kafka_errors.KafkaConfigurationError(f"{name} must be callable")
    if KAFKA_PYTHON_3:
        # Where kafka-python 3 puts it (stacklevel=3 from its __init__): the frame above
        # the one that called KafkaProducer(...), not that line. Frames here: this
        # function, translate, KafkaProducer.__init__, the caller, the caller's caller.
        # NOTE: a DeprecationWarning is shown by default only when attributed to
        # __main__; one level lower it would show for a script's module-level producer
        # where kafka-python shows nothing.
        warnings.warn(
            f"{name} does not implement kafka.serializer.Serializer",
            category=DeprecationWarning,
            stacklevel=5,
        )
    fn = value
    return lambda _topic, _headers, data: fn(data)


def _explicit_idempotence_conflicts(configs: Mapping[str, Any]) -> None:
    """kafka-python 3.x: ``enable_idempotence=True`` given explicitly with a setting that
    contradicts it raises, with the same message."""
    conflicts = []
    acks = configs.get("acks", -1)
    if "acks" in configs and acks not in (-1, "all", "-1"):
        conflicts.append(("acks", acks))
    if "retries" in configs and configs["retries"] == 0:
        conflicts.append(("retries", 0))
    in_flight = configs.get("max_in_flight_requests_per_connection", 5)
    if isinstance(in_flight, int) and in_flight > _IDEMPOTENT_IN_FLIGHT_MAX:
        conflicts.append(("max_in_flight_requests_per_connection", in_flight))
    if conflicts:
        text = ", ".join(f"{k}={v!r}" for k, v in conflicts)
        raise kafka_errors.KafkaConfigurationError(
            f"enable_idempotence=True is incompatible with user-provided {text}"
        )


def _check_idempotence(configs: Mapping[str, Any]) -> None:
    """kafka-python 3.x's checks of an explicit ``enable_idempotence=True`` (or a
    ``transactional_id``, which implies it), with its messages: a contradicting setting
    or an ``api_version`` below 0.11 raises ``KafkaConfigurationError``."""
    transactional = configs.get("transactional_id") is not None
    if transactional and configs.get("enable_idempotence") is False:
        raise kafka_errors.KafkaConfigurationError(
            "Cannot set transactional_id without enable_idempotence."
        )
    if not (transactional or configs.get("enable_idempotence") is True):
        return
    _explicit_idempotence_conflicts(configs)
    api_version = configs.get("api_version")
    if isinstance(api_version, tuple) and api_version < (0, 11):
        raise kafka_errors.KafkaConfigurationError(
            "Idempotent/Transactional producer requires broker >= 0.11 "
            f"(got api_version={api_version})"
        )


def translate(configs: Mapping[str, Any]) -> ProducerSettings:
    """Map ``KafkaProducer(**configs)`` onto the confluent-kafka drop-in's config dict.

    - ``bootstrap_servers`` (a string or a list) becomes ``bootstrap.servers``
      (kafka-python's default ``localhost``);
    - settings librdkafka has (``linger_ms``, ``batch_size``, ``compression_type``,
      timeouts, TLS, SASL PLAIN/SCRAM ...) become its settings; ``delivery_timeout_ms``
      bounds the wait before the outbox takes a message, as ``message.timeout.ms`` does;
    - weak ``acks`` (0, 1), ``enable_idempotence=False`` and ``retries=0`` are
      overridden with a warning (kafka-python 3.x's explicit ``enable_idempotence=True``
      with one of them raises ``KafkaConfigurationError``, as kafka-python does);
    - a ``partitioner`` is not called: keyed messages go where kafka-python's default
      partitioner puts them (murmur2, librdkafka's ``murmur2_random``);
    - ``transactional_id``, ``ssl_context``, OAUTHBEARER, GSSAPI and proxies raise
      ``KafkaConfigurationError``; kafka-python's own networking knobs are accepted and
      unused; an unknown name raises ``ValueError('Unrecognized configs: ...')``;
    - ``msgsafe_outbox`` and ``msgsafe_require`` are msgsafe's options.
    """
    known = set(_RealProducer.DEFAULT_CONFIG) | _OLDER_NAMES | set(MSGSAFE_OPTIONS)
    unknown = {k: v for k, v in configs.items() if k not in known}
    if unknown:
        raise ValueError(f"Unrecognized configs: {unknown}")
    _check_idempotence(configs)
    for name, why in _REFUSED.items():
        if configs.get(name) is not None:
            raise kafka_errors.KafkaConfigurationError(why)
    notes: list[str] = []
    settings: dict[str, object] = {
        "bootstrap.servers": _servers(configs.get("bootstrap_servers", "localhost")),
        # kafka-python places keyed messages with murmur2 (the Java client's hash).
        "partitioner": "murmur2_random",
    }
    for name, value in configs.items():
        if value is None or name in _NOT_USED or name == "bootstrap_servers":
            continue
        if name in _SAME:
            settings[_SAME[name]] = value
        elif name == "compression_type":
            settings["compression.type"] = value
        elif name == "ssl_check_hostname":
            if not value:
                settings["ssl.endpoint.identification.algorithm"] = "none"
        elif name == "acks":
            if value not in (-1, "all", "-1"):
                notes.append(f"acks={value!r} overridden to acks='all' (msgsafe keeps the promise)")
        elif name == "enable_idempotence":
            if not value:
                notes.append("enable_idempotence=False overridden to True (no reorder on retry)")
        elif name == "retries":
            if value == 0:
                notes.append("retries=0 overridden: librdkafka retries, then the outbox takes it")
        elif name == "max_in_flight_requests_per_connection":
            if int(value) > _IDEMPOTENT_IN_FLIGHT_MAX:
                notes.append(
                    f"max_in_flight_requests_per_connection={value} lowered to 5 "
                    "(the most an idempotent producer may have)"
                )
            settings["max.in.flight"] = min(int(value), _IDEMPOTENT_IN_FLIGHT_MAX)
        elif name == "partitioner":
            if not isinstance(value, kafka.partitioner.DefaultPartitioner):
                notes.append(
                    "partitioner is not called: keyed messages are placed by murmur2 "
                    "(kafka-python's default partitioner)"
                )
        elif name == "msgsafe_outbox":
            settings["msgsafe.outbox"] = value
        elif name == "msgsafe_require":
            settings["msgsafe.require"] = value
    # NOTE: kafka-python refuses a record over max_request_size (1 MiB by default) in
    # send(); without this the wrapper would take what the real client refuses.
    settings.setdefault("message.max.bytes", _RealProducer.DEFAULT_CONFIG["max_request_size"])
    config = dict(_RealProducer.DEFAULT_CONFIG)
    config.update(configs)
    config["acks"] = -1
    config["enable_idempotence"] = True
    if config.get("client_id") is None:
        config["client_id"] = f"kafka-python-producer-{next(_CLIENT_IDS)}"
        settings["client.id"] = config["client_id"]
    max_block_ms = configs.get("max_block_ms", _RealProducer.DEFAULT_CONFIG["max_block_ms"])
    return ProducerSettings(
        librdkafka=settings,
        config=config,
        key_serializer=_serializer("key_serializer", configs.get("key_serializer")),
        value_serializer=_serializer("value_serializer", configs.get("value_serializer")),
        max_block_s=float(max_block_ms) / 1000.0,
        warnings=tuple(notes),
    )


#: kafka-python numbers its producers' default client ids from 1 per process.
_CLIENT_IDS = itertools.count(1)
