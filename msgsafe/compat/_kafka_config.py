"""A confluent-kafka configuration dict turned into a msgsafe URL and Kafka options.

Kept apart from the producer so it is pure (no I/O, no client) and testable on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from msgsafe.adapters.kafka.config import setting_number
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError
from msgsafe.outbox.location import OutboxSpec

__all__ = [
    "DEFAULT_QUEUE_MAX",
    "DeliveryCallback",
    "ProducerConfig",
    "check_with_librdkafka",
    "merged_config",
    "options_for",
    "translate_config",
]

#: ``on_delivery(err, msg)`` as confluent-kafka calls it.
DeliveryCallback = Callable[[object, object], object]

#: librdkafka settings that only weaken the guarantee; overridden to the safe value.
_ACKS = ("acks", "request.required.acks")
_SAFE_ACKS = frozenset({"all", "-1"})
_FALSE = frozenset({"false", "0", "no", "off"})

#: librdkafka name -> msgsafe Kafka option (and how to convert the value).
_MAPPED: Mapping[str, tuple[str, Callable[[object], object]]] = {
    "client.id": ("client_id", str),
    "linger.ms": ("linger_ms", lambda v: _number("linger.ms", v)),
    "queue.buffering.max.ms": ("linger_ms", lambda v: _number("queue.buffering.max.ms", v)),
    "batch.num.messages": ("batch_num_messages", lambda v: int(_number("batch.num.messages", v))),
    "compression.type": ("compression", str),
    "compression.codec": ("compression", str),
    "reconnect.backoff.max.ms": (
        "reconnect_backoff_max_ms",
        lambda v: int(_number("reconnect.backoff.max.ms", v)),
    ),
    "sasl.mechanism": ("sasl_mechanism", str),
    "sasl.mechanisms": ("sasl_mechanism", str),
    "ssl.ca.location": ("tls_ca_file", str),
    "ssl.certificate.location": ("tls_cert_file", str),
    "ssl.key.location": ("tls_key_file", str),
    "enable.ssl.certificate.verification": (
        "tls_verify",
        lambda v: str(v).lower() not in _FALSE,
    ),
}

#: Options every adapter accepts (kept when a test points the wrapper at memory://).
_COMMON = frozenset(
    {
        "confirm_timeout",
        "max_in_flight",
        "max_message_size",
        "tls_verify",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
    }
)

#: Callables confluent-kafka accepts in the config that msgsafe does not call.
_IGNORED_CALLBACKS = ("stats_cb", "throttle_cb", "oauth_cb")

#: Settings the list_topics() metadata client needs (connection and security only).
_ADMIN_PREFIXES = ("bootstrap.servers", "metadata.broker.list", "security.", "sasl.", "ssl.")

#: librdkafka's default queue.buffering.max.messages: produce() raises BufferError at it.
DEFAULT_QUEUE_MAX = 100_000


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """What :func:`translate_config` made of a confluent-kafka config dict."""

    url: str = field(repr=False)  #: may hold SASL credentials: never log it; "" without brokers
    options: dict[str, Any]
    outbox: OutboxSpec
    on_delivery: DeliveryCallback | None
    #: ``error_cb(KafkaError)``: librdkafka's global error events, served by poll()/flush()
    error_cb: Callable[[Any], object] | None
    queue_max: int  #: reports not yet served at which produce() raises BufferError
    admin: dict[str, Any] = field(repr=False)  #: settings of the list_topics() client
    warnings: tuple[str, ...]  #: overrides and ignored settings, for CompatWarning
    #: ``msgsafe.require``: the destination requirement (see msgsafe.checks.gate).
    require: str = "durable"


def _bootstrap_url(config: Mapping[str, object]) -> tuple[str, list[str]]:
    servers = config.get("bootstrap.servers", config.get("metadata.broker.list"))
    if servers is None or servers == "":
        # NOTE: librdkafka makes a producer without brokers (it warns, and its messages
        # time out): the URL is empty and the wrapper fails each message.
        return "", []
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigurationError("'bootstrap.servers' must name at least one broker")
    hosts = []
    for item in servers.split(","):
        host = item.strip()
        # librdkafka accepts "PLAINTEXT://host:port"; the protocol comes from security.protocol.
        host = host.split("://", 1)[-1]
        if host:
            hosts.append(host)
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    notes: list[str] = []
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ConfigurationError(f"unknown security.protocol {protocol!r}")
    scheme = "kafka+ssl" if protocol.endswith("SSL") else "kafka"
    userinfo = ""
    if protocol.startswith("SASL"):
        user, password = config.get("sasl.username"), config.get("sasl.password")
        if not isinstance(user, str) or not user:
            raise ConfigurationError(
                "SASL needs 'sasl.username' and 'sasl.password' (msgsafe supports PLAIN "
                "and SCRAM; GSSAPI and OAUTHBEARER are not supported by the wrapper)"
            )
        userinfo = f"{quote(user, safe='')}:{quote(str(password or ''), safe='')}@"
    return f"{scheme}://{userinfo}{','.join(hosts)}", notes


def translate_config(config: Mapping[str, object]) -> ProducerConfig:
    """Map a confluent-kafka producer config onto msgsafe.

    ``bootstrap.servers`` and ``security.protocol`` (with ``sasl.username`` /
    ``sasl.password``) become the ``kafka://`` or ``kafka+ssl://`` URL; settings msgsafe
    has an option for become that option; ``message.timeout.ms`` (or
    ``delivery.timeout.ms``) becomes ``confirm_timeout``; weak ``acks`` and
    ``enable.idempotence=false`` are overridden (with a warning); ``transactional.id`` is
    refused; every other setting passes through to librdkafka unchanged.

    ``msgsafe.outbox`` (True, False or a file path) selects the outbox; default True.
    Raises :class:`ConfigurationError` for what cannot be honoured.
    """
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"config must be a dict, not {type(config).__name__}")
    for name in config:
        if not isinstance(name, str):
            raise ConfigurationError("config keys must be librdkafka setting names (str)")
    url, notes = _bootstrap_url(config)
    options: dict[str, Any] = {}
    passthrough: dict[str, str] = {}
    on_delivery: DeliveryCallback | None = None
    error_cb: Callable[[Any], object] | None = None
    outbox: OutboxSpec = True
    require = "durable"
    queue_max = DEFAULT_QUEUE_MAX
    for name, value in config.items():
        if name in ("bootstrap.servers", "metadata.broker.list", "security.protocol"):
            continue
        if name in ("sasl.username", "sasl.password"):
            continue
        if name == "msgsafe.outbox":
            if not isinstance(value, (bool, str)):
                raise ConfigurationError("'msgsafe.outbox' must be True, False or a file path")
            outbox = value
        elif name == "msgsafe.require":
            if value not in ("any", "durable", "replicated"):
                raise ConfigurationError(
                    "'msgsafe.require' must be 'any', 'durable' or 'replicated'"
                )
            require = str(value)
        elif name in ("on_delivery", "delivery.report.callback"):
            if not callable(value):
                raise ConfigurationError(f"{name!r} must be callable")
            on_delivery = value
        elif name == "error_cb":
            if not callable(value):
                raise ConfigurationError("'error_cb' must be callable")
            error_cb = value
        elif name == "logger":
            # librdkafka's log lines go to it; msgsafe logs through ``logging`` itself.
            continue
        elif name in _IGNORED_CALLBACKS:
            notes.append(
                f"{name!r} is not called by msgsafe (connection errors are handled by "
                "fail-over and the outbox); it is ignored"
            )
        elif name == "transactional.id":
            raise ConfigurationError(
                "transactions are not supported by msgsafe.compat.confluent_kafka; use "
                "msgsafe.Producer(..., outbox=PostgresOutbox(...)) for a transactional outbox"
            )
        elif name in _ACKS:
            if str(value).lower() not in _SAFE_ACKS:
                notes.append(f"{name}={value} overridden to acks=all (msgsafe keeps the promise)")
        elif name == "enable.idempotence":
            if str(value).lower() in _FALSE:
                notes.append("enable.idempotence=false overridden to true (no reorder on retry)")
        elif name in ("message.timeout.ms", "delivery.timeout.ms"):
            ms = _number(name, value)
            if ms > 0:  # 0 means "infinite" to librdkafka: keep msgsafe's bounded default
                options["confirm_timeout"] = ms / 1000.0
        elif name == "queue.buffering.max.messages":
            queue_max = int(_number(name, value))
            options["max_in_flight"] = queue_max
        elif name == "message.max.bytes":
            options["max_message_size"] = int(_number(name, value))
        elif name in _MAPPED:
            option, convert = _MAPPED[name]
            try:
                options[option] = convert(value)
            except (TypeError, ValueError):
                raise ConfigurationError(f"invalid value for {name!r}") from None
        elif callable(value):
            raise ConfigurationError(f"{name!r}: msgsafe does not take callables here")
        else:
            passthrough[name] = str(value).lower() if isinstance(value, bool) else str(value)
    # NOTE: librdkafka refuses a message over message.max.bytes in produce() itself,
    # and its default is 1,000,000 bytes: without the setting, msgsafe's own default
    # (8 MiB) would take messages the real client refuses.
    options.setdefault("max_message_size", _LIBRDKAFKA_MESSAGE_MAX_BYTES)
    if passthrough:
        options["librdkafka"] = passthrough
    admin = {
        name: value
        for name, value in config.items()
        if name.startswith(_ADMIN_PREFIXES) or name == "client.id"
    }
    return ProducerConfig(
        url=url,
        options=options,
        outbox=outbox,
        on_delivery=on_delivery,
        error_cb=error_cb,
        queue_max=queue_max,
        admin=admin,
        warnings=tuple(notes),
        require=require,
    )


#: librdkafka's default ``message.max.bytes``.
_LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000


def options_for(target: str, translated: ProducerConfig) -> dict[str, Any]:
    """The options to give the adapter of ``target``: all of them when it is the protocol
    they were translated for (``translated.url``'s), only the common ones for another
    (a test pointing the wrapper at ``memory://``)."""
    own = translated.url and parse_url(translated.url).protocol
    if parse_url(target).protocol == own:
        return dict(translated.options)
    return {k: v for k, v in translated.options.items() if k in _COMMON}


def _number(name: str, value: object) -> float:
    # The adapters' conversion: one set of rules for URL options and librdkafka values.
    return setting_number(name, value)


def check_with_librdkafka(settings: Mapping[str, str] | None) -> None:
    """Raise librdkafka's own ``KafkaException`` for a setting it does not know or a value
    it refuses, at construction as confluent-kafka does (a short-lived client without
    brokers checks them; it connects nowhere)."""
    if settings:
        from confluent_kafka import Producer as _Probe

        # NOTE: a caller's ``debug`` raises librdkafka's log level above ``log_level``;
        # the probe's lines go to a logger that keeps them, never to stderr.
        _Probe({**settings, "log_level": 0, "logger": _PROBE_LOG})


#: Where the settings probe's librdkafka lines go: nowhere (a probe has nothing to say).
_PROBE_LOG = logging.getLogger("msgsafe.compat.confluent_kafka.settings_probe")
_PROBE_LOG.addHandler(logging.NullHandler())
_PROBE_LOG.propagate = False


def merged_config(
    config: Mapping[str, object] | None, settings: Mapping[str, object]
) -> dict[str, object]:
    """``config`` and keyword ``settings`` as one dict, ``default.topic.config`` merged
    in underneath (librdkafka applies it to every topic)."""
    if config is None and not settings:
        raise TypeError("expected configuration dict")  # as confluent-kafka's Producer()
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"expected configuration dict, not {type(config).__name__}")
    merged = {**(config or {}), **settings}
    topic_config = merged.pop("default.topic.config", None)
    if isinstance(topic_config, Mapping):
        for name, value in topic_config.items():
            merged.setdefault(name, value)
    return merged
