"""Serializers and a schema registry: the glue between a message's object and its bytes.

``Producer(..., serializer=..., key_serializer=...)`` and ``Consumer(...,
deserializer=..., key_deserializer=...)`` take confluent-kafka's serializer protocol:
``serializer(obj, ctx) -> bytes`` and ``deserializer(data, ctx) -> obj``, where ``ctx`` is
a :class:`SerializationContext` (``topic``, ``field``: ``"key"`` or ``"value"``,
``headers``). confluent-kafka's ``schema_registry`` serializers (``AvroSerializer``,
``ProtobufSerializer``, ``JSONSerializer`` and their deserializers) work unchanged; so
does any callable of that shape.

The serializer runs once per message, in ``send()``, before anything is sent or stored:
a STORED message holds its final bytes, schema id included, and a replay days later
sends exactly what was accepted. ``ctx.topic`` is the destination as given to ``send()``
(the Kafka topic; the queue, ``exchange/routing-key`` or address on AMQP), so the
registry's subject (Confluent's default ``TopicNameStrategy``) is ``<destination>-value``.

What a serializer raises becomes one :class:`~msgsafe.errors.SchemaError` (nothing was
sent or stored; the caller still owns the message):

- the registry unreachable (a transport error of the registry client, or its 5xx):
  :class:`~msgsafe.errors.SchemaRegistryUnavailable`, a transient error. A serializer
  that already knows the subject's schema id (confluent's serializers cache it after
  the first message) does not ask the registry again, so a registry that goes down
  later leaves sends working;
- the registry's 409, a schema that breaks the subject's compatibility rule:
  :class:`~msgsafe.errors.SchemaIncompatible`, permanent, naming the subject and the
  rule (asked of the registry when the serializer names its client, see
  :func:`subject_rule`);
- anything else (an object that does not fit the schema, an unknown subject with
  ``auto.register.schemas`` off, bytes that do not decode):
  :class:`~msgsafe.errors.SerializationFailed`, permanent.

Received messages keep their bytes in ``Delivery.body``; ``Delivery.value`` and
``Delivery.key_value`` run the consumer's deserializers on first use (and keep the
result), so a message that does not decode still reaches the handler, which can
dead-letter it.
"""

from __future__ import annotations

import functools
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Final

from msgsafe.errors import (
    MsgsafeError,
    SchemaError,
    SchemaIncompatible,
    SchemaRegistryUnavailable,
    SerializationFailed,
)

__all__ = [
    "KEY",
    "VALUE",
    "Deserializer",
    "Deserializers",
    "SerializationContext",
    "Serializer",
    "Serializers",
    "compatibility",
    "schema_error",
    "subject_rule",
]

log = logging.getLogger("msgsafe.schemas")

#: ``ctx.field`` of a key and of a value: confluent-kafka's ``MessageField`` values.
KEY: Final = "key"
VALUE: Final = "value"

#: ``serializer(obj, ctx) -> bytes | None`` (confluent-kafka's protocol).
Serializer = Callable[[Any, Any], "bytes | None"]
#: ``deserializer(data, ctx) -> obj`` (confluent-kafka's protocol).
Deserializer = Callable[["bytes | None", Any], Any]

#: The HTTP status with which a Confluent-API registry refuses an incompatible schema.
_CONFLICT = 409


class SerializationContext:
    """What a serializer is told about the message: ``topic`` (the destination),
    ``field`` (:data:`KEY` or :data:`VALUE`), ``headers``. The shape of confluent-kafka's
    class of that name, which its serializers read (not imported: a RabbitMQ producer
    need not load confluent-kafka)."""

    __slots__ = ("field", "headers", "topic")

    def __init__(self, topic: str, field: str, headers: Any = None) -> None:
        self.topic = topic
        self.field = field
        self.headers = headers

    def __repr__(self) -> str:
        return f"SerializationContext(topic={self.topic!r}, field={self.field!r})"


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP transport errors a registry client raises when the registry does not
    answer: httpx2's or httpx's (what confluent-kafka's client uses), and OSError."""
    found: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


def subject_of(ctx: Any) -> str:
    """The subject under Confluent's default ``TopicNameStrategy``: ``<topic>-<field>``."""
    return f"{ctx.topic}-{ctx.field}"


def schema_error(
    exc: BaseException,
    ctx: Any,
    *,
    rule: Callable[[str], str | None] | None = None,
    message_id: str | None = None,
) -> SchemaError:
    """``exc`` (what a serializer or deserializer raised for ``ctx``) as a
    :class:`~msgsafe.errors.SchemaError` (see the module doc). ``rule`` asks the
    subject's compatibility rule of the registry (for a refusal)."""
    if isinstance(exc, SchemaError):
        return exc.with_id(message_id)
    subject = subject_of(ctx)
    cause = _cause(exc)
    status = getattr(cause, "http_status_code", None)
    what = f"{type(cause).__name__}: {cause}"
    if isinstance(cause, _transport_errors()) or (isinstance(status, int) and status >= 500):
        return SchemaRegistryUnavailable(
            f"the schema registry did not answer and no schema of {subject!r} is cached:"
            f" nothing was sent ({what})",
            subject=subject,
            message_id=message_id,
        )
    if status == _CONFLICT:
        known = None
        if rule is not None:
            try:
                known = rule(subject)
            except Exception:
                log.debug("cannot read the compatibility of %s", subject, exc_info=True)
        return SchemaIncompatible(
            f"the schema registry refused the schema of {subject!r}: it breaks the"
            f" subject's compatibility rule ({known or 'unknown'}): {cause}",
            subject=subject,
            rule=known,
            message_id=message_id,
        )
    return SerializationFailed(
        f"{ctx.field} of {ctx.topic!r} could not be (de)serialized: {what}",
        subject=subject,
        message_id=message_id,
    )


def _cause(exc: BaseException) -> BaseException:
    """The registry's or the transport's error inside ``exc``: confluent-kafka's
    ``SerializationError`` wrappers hold it as ``__cause__``/``__context__`` or as
    their first argument."""
    seen = 0
    while seen < 5:
        seen += 1
        if isinstance(exc, _transport_errors()) or hasattr(exc, "http_status_code"):
            return exc
        inner = exc.__cause__ or exc.__context__
        if inner is None and exc.args and isinstance(exc.args[0], BaseException):
            inner = exc.args[0]
        if inner is None:
            return exc
        exc = inner
    return exc


def compatibility(url: str, subject: str | None = None, *, timeout: float = 5.0) -> str:
    """The compatibility rule of ``subject`` on the registry at ``url`` (its Confluent
    API): the subject's own, else the registry's global one, said so (``"BACKWARD (the
    registry's default)"``; Apicurio answers 404 "No rule named COMPATIBILITY" for a
    subject without one). Without ``subject``: the global one. ``"unknown"`` when the
    registry names none.

    Raises :class:`~msgsafe.errors.SchemaRegistryUnavailable` when the registry does
    not answer."""
    base = url.rstrip("/")
    if subject is not None:
        name = urllib.parse.quote(subject, safe="")
        found = _get_json(f"{base}/config/{name}", subject, timeout)
        if found is not None and _own_rule(base, name, subject, timeout):
            return _level(found)
    found = _get_json(f"{base}/config", subject, timeout)
    level = "unknown" if found is None else _level(found)
    return level if subject is None or level == "unknown" else f"{level} (the registry's default)"


def _own_rule(base: str, name: str, subject: str, timeout: float) -> bool:
    """False when the registry is Apicurio and ``subject`` has no compatibility rule of
    its own.

    NOTE: Apicurio 2.0's Confluent API answers ``NONE`` for a subject without a rule of
    its own, even when its global rule is another: its native API lists the subject's
    rules."""
    cut = base.find("/apis/ccompat/")
    if cut < 0:
        return True
    rules = f"{base[:cut]}/apis/registry/v2/groups/default/artifacts/{name}/rules"
    try:
        with urllib.request.urlopen(rules, timeout=timeout) as response:
            found = json.load(response)
    except (OSError, ValueError):
        return True
    return not isinstance(found, list) or "COMPATIBILITY" in found


def _level(answer: Mapping[str, Any]) -> str:
    return str(answer.get("compatibilityLevel") or answer.get("compatibility") or "unknown")


def _get_json(url: str, subject: str | None, timeout: float) -> Mapping[str, Any] | None:
    """``GET url`` as JSON; None on 404."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            found = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise SchemaRegistryUnavailable(
            f"the schema registry answered {exc.code} to GET {url}", subject=subject
        ) from None
    except (OSError, ValueError) as exc:
        raise SchemaRegistryUnavailable(
            f"the schema registry at {url} did not answer ({type(exc).__name__}: {exc})",
            subject=subject,
        ) from None
    return found if isinstance(found, Mapping) else None


def subject_rule(serializer: object) -> Callable[[str], str | None] | None:
    """How to ask the compatibility rule of a subject of ``serializer``'s registry
    client, or None when it has none that says.

    NOTE: confluent-kafka's serializers keep their ``SchemaRegistryClient`` as
    ``_registry`` (2.x has no public accessor); only the client's public
    ``get_compatibility`` is called on it."""
    client = getattr(serializer, "_registry", None)
    ask = getattr(client, "get_compatibility", None)
    if not callable(ask):
        return None

    def rule(subject: str) -> str | None:
        try:
            own = str(ask(subject))
        except Exception:
            own = None  # no rule of its own (Confluent: 40408; Apicurio: 404)
        # NOTE: NONE refuses nothing: after a refusal it means the subject has no rule
        # of its own (Apicurio 2.0 answers NONE then) and the registry's global one
        # applies.
        if own is not None and own != "NONE":
            return own
        return f"{ask()} (the registry's default)"

    return rule


class Serializers:
    """A producer's value and key serializers, applied once per message."""

    __slots__ = ("_key", "_key_rule", "_value", "_value_rule")

    def __init__(self, value: Serializer | None, key: Serializer | None) -> None:
        self._value = value
        self._key = key
        self._value_rule = subject_rule(value) if value is not None else None
        self._key_rule = subject_rule(key) if key is not None else None

    def __call__(
        self,
        destination: str,
        body: Any,
        key: Any,
        headers: Mapping[str, str] | None,
        message_id: str | None = None,
    ) -> tuple[Any, Any]:
        """``(body, key)`` as bytes (each serializer given, else as they came). Raises a
        :class:`~msgsafe.errors.SchemaError` (see the module doc)."""
        if self._key is not None:
            key = self._run(self._key, key, destination, KEY, headers, self._key_rule, message_id)
        if self._value is not None:
            body = self._run(
                self._value, body, destination, VALUE, headers, self._value_rule, message_id
            )
        return body, key

    @staticmethod
    def _run(
        serializer: Serializer,
        obj: Any,
        destination: str,
        field: str,
        headers: Mapping[str, str] | None,
        rule: Callable[[str], str | None] | None,
        message_id: str | None,
    ) -> bytes | None:
        given = dict(headers) if headers else None
        seen = dict(given) if given is not None else {}
        ctx = SerializationContext(destination, field, seen)
        try:
            data = serializer(obj, ctx)
        except MsgsafeError:
            raise
        except Exception as exc:
            raise schema_error(exc, ctx, rule=rule, message_id=message_id) from exc
        if ctx.headers is not seen or (seen != given if given is not None else seen):
            # NOTE: confluent's header_schema_id_serializer puts the schema id (bytes) in
            # a header; msgsafe's headers are text, so the id would be lost on the way.
            raise SerializationFailed(
                f"the {field} serializer of {destination!r} wrote headers; msgsafe carries"
                " text headers only: keep the schema id in the payload (the default"
                " prefix_schema_id_serializer)",
                subject=subject_of(ctx),
                message_id=message_id,
            )
        if type(data) is bytes:
            return data
        if data is not None and not isinstance(data, bytes | bytearray | memoryview):
            raise SerializationFailed(
                f"the {field} serializer of {destination!r} returned"
                f" {type(data).__name__}, not bytes",
                subject=subject_of(ctx),
                message_id=message_id,
            )
        return bytes(data) if data is not None else None


class Deserializers:
    """A consumer's value and key deserializers, run by ``Delivery.value`` and
    ``Delivery.key_value`` on first use."""

    __slots__ = ("key", "value")

    def __init__(self, value: Deserializer | None, key: Deserializer | None) -> None:
        self.value = value
        self.key = key

    @staticmethod
    def run(
        deserializer: Deserializer | None,
        data: bytes | None,
        destination: str,
        field: str,
        headers: Mapping[str, str],
        message_id: str | None,
    ) -> Any:
        """``deserializer(data, ctx)``, or ``data`` itself without one; raises a
        :class:`~msgsafe.errors.SchemaError`."""
        if deserializer is None:
            return data
        ctx = SerializationContext(
            destination, field, [(name, value.encode()) for name, value in headers.items()]
        )
        try:
            return deserializer(data, ctx)
        except MsgsafeError:
            raise
        except Exception as exc:
            raise schema_error(exc, ctx, message_id=message_id) from exc
