"""A Celery task message as kombu would publish it, and the broker URL msgsafe reaches.

Celery hands its task message (body, headers, properties) to kombu's ``Producer.publish``,
which serializes and compresses the body and turns the rest into AMQP basic properties.
:func:`kombu_message` runs that very ``publish`` on a channel that only records what it
was given (:class:`_RecordingChannel`), so the body bytes, ``content_type``,
``content_encoding``, headers and every property are kombu's own, then converts them to
pika's ``BasicProperties``, which msgsafe's RabbitMQ adapter publishes
(:data:`~msgsafe.message.AMQP_PROPERTIES_HEADER`). A Celery worker therefore receives
the message it would have received from kombu.

:func:`broker_url` turns the app's broker connection (``broker_write_url`` or
``broker_url``, failover lists included) into one ``amqp://`` URL listing every host.

:func:`declarations_of` records what kombu's ``maybe_declare`` would declare for the
entities Celery names with a task (its queue: exchange, queue, bindings), as
:class:`~msgsafe.adapters.rabbitmq.declarations.Declaration` values the message carries, so
that whoever publishes it, now or from the outbox later, declares the same.

Pure translation, no I/O.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from msgsafe.adapters.rabbitmq.declarations import Declaration
from msgsafe.errors import ConfigurationError, InvalidMessage, MissingExtra

try:
    from kombu import connection as _kombu_connection
    from kombu import entity as _kombu_entity
    from kombu import messaging as _kombu_messaging
    from kombu.transport import base as _kombu_transport
    from pika.spec import BasicProperties
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "celery") from exc

#: kombu's classes, called untyped (kombu annotates few of their parameters).
Connection: Any = _kombu_connection.Connection
KombuProducer: Any = _kombu_messaging.Producer
#: kombu's own ``Producer.publish``, kept as imported: it builds the message even where an
#: application (or a test harness) routes ``Producer.publish`` elsewhere.
_kombu_publish: Any = _kombu_messaging.Producer.publish

#: kombu's entities and its RabbitMQ queue-argument translation, called untyped.
_Queue: Any = _kombu_entity.Queue
_Exchange: Any = _kombu_entity.Exchange
_rabbitmq_arguments: Any = _kombu_transport.to_rabbitmq_queue_arguments

__all__ = [
    "TaskMessage",
    "broker_url",
    "declarations_of",
    "encode_properties",
    "kombu_message",
    "task_id_of",
]

#: kombu transports that speak AMQP 0-9-1 to RabbitMQ.
AMQP_TRANSPORTS = ("amqp", "pyamqp", "librabbitmq")

#: AMQP basic properties by the name kombu's pyamqp transport gives them -> pika's name.
#: Anything else a caller passes (``apply_async(foo=1)``) py-amqp does not send either.
_PROPERTY_NAMES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "application_headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "type",
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One message exactly as kombu would publish it."""

    exchange: str
    routing_key: str
    body: bytes
    properties: BasicProperties

    @property
    def headers(self) -> Mapping[str, Any]:
        return self.properties.headers or {}


class _RecordingChannel:
    """The two calls kombu's ``Producer._publish`` makes on a channel, recorded.

    ``prepare_message`` keeps the arguments kombu's pyamqp transport gives
    ``amqp.Message`` (the body and its properties by py-amqp's names)."""

    def __init__(self) -> None:
        self.message: tuple[Any, dict[str, Any]] | None = None
        self.exchange = ""
        self.routing_key = ""

    def prepare_message(
        self,
        body: Any,
        priority: Any = None,
        content_type: Any = None,
        content_encoding: Any = None,
        headers: Any = None,
        properties: Any = None,
    ) -> tuple[Any, dict[str, Any]]:
        props = {
            "priority": priority,
            "content_type": content_type,
            "content_encoding": content_encoding,
            "application_headers": headers,
            **(properties or {}),
        }
        return body, props

    def basic_publish(
        self,
        message: tuple[Any, dict[str, Any]],
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
    ) -> None:
        self.message = message
        self.exchange = exchange or ""
        self.routing_key = routing_key or ""


#: Header value types pika's table encoder takes as they are.
_PLAIN = frozenset((str, int, bool, type(None), bytes, decimal.Decimal, datetime.datetime))


_local = threading.local()


def _recorder() -> tuple[_RecordingChannel, Any]:
    """This thread's recording channel and the kombu producer on it (made once)."""
    found: tuple[_RecordingChannel, Any] | None = getattr(_local, "recorder", None)
    if found is None:
        channel = _RecordingChannel()
        found = _local.recorder = (channel, KombuProducer(channel, auto_declare=False))
    return found


def _field(value: Any, where: str) -> Any:
    """``value`` as pika's table encoder takes it, read back by a worker as py-amqp's
    would have been: a tuple is an array (py-amqp decodes both as a list); an integral
    float its int. Raises InvalidMessage for what pika cannot encode."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict or kind is list or kind is tuple:
        if kind is dict:
            if all(type(v) in _PLAIN for v in value.values()):
                return value
            return {str(k): _field(v, f"{where}[{k!r}]") for k, v in value.items()}
        if kind is list and all(type(v) in _PLAIN for v in value):
            return value
        return [_field(item, where) for item in value]
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise InvalidMessage(
            f"{where} is the float {value!r}: msgsafe publishes through pika, which has no "
            "AMQP float field type; give a whole number or a string"
        )
    if isinstance(value, (str, int, bytes, decimal.Decimal, datetime.datetime)):
        return value  # a subclass
    if isinstance(value, (list, tuple)):
        return [_field(item, where) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _field(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise InvalidMessage(f"{where} has a {type(value).__name__} value AMQP cannot carry")


def _headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The task headers as pika encodes them (see :func:`_field`), the dict itself when
    every value already is."""
    out = headers if type(headers) is dict else dict(headers)
    for value in out.values():
        if type(value) not in _PLAIN:
            return {k: _field(v, f"header {k!r}") for k, v in out.items()}
    return out


def _pika_properties(props: Mapping[str, Any]) -> BasicProperties:
    out: dict[str, Any] = {}
    for name, value in props.items():
        pika_name = _PROPERTY_NAMES.get(name)
        if pika_name is None or value is None:
            continue
        if pika_name == "headers":
            value = _headers(value)
        elif pika_name == "timestamp" and isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        out[pika_name] = value
    return BasicProperties(**out)


def kombu_message(
    body: Any,
    *,
    exchange: Any,
    routing_key: str | None,
    headers: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> TaskMessage:
    """The message kombu's ``Producer.publish(body, exchange=..., routing_key=...,
    headers=..., **options)`` would publish (serializer, compression, delivery mode and
    properties applied by kombu itself); ``declare``, ``retry`` and the timeouts in
    ``options`` are left to the caller."""
    channel, producer = _recorder()
    kwargs = {
        k: v
        for k, v in options.items()
        if k not in ("declare", "retry", "retry_policy", "timeout", "confirm_timeout")
    }
    _kombu_publish(
        producer,
        body,
        exchange=exchange,
        routing_key=routing_key,
        headers=dict(headers or {}),
        **kwargs,
    )
    recorded, channel.message = channel.message, None
    if recorded is None:  # pragma: no cover - kombu's publish always reaches it
        raise RuntimeError("kombu's Producer.publish did not publish")
    data, props = recorded
    if isinstance(data, str):
        data = data.encode("utf-8")
    return TaskMessage(channel.exchange, channel.routing_key, bytes(data), _pika_properties(props))


def encode_properties(props: BasicProperties) -> str:
    """``props`` as AMQP encodes them (pika's encoder), base64: the value of
    :data:`~msgsafe.message.AMQP_PROPERTIES_HEADER`."""
    return base64.b64encode(b"".join(props.encode())).decode("ascii")


def task_id_of(message: TaskMessage) -> str | None:
    """The task id: the ``id`` header (task protocol 2), else ``correlation_id`` (both
    protocols set it)."""
    found = message.headers.get("id")
    if isinstance(found, str) and found:
        return found
    correlation = message.properties.correlation_id
    return correlation if isinstance(correlation, str) and correlation else None


def _host(hostname: str, port: int) -> str:
    if ":" in hostname and not hostname.startswith("["):
        hostname = f"[{hostname}]"
    return f"{hostname}:{port}"


def broker_url(connection: Any) -> str:
    """One ``amqp://`` (``amqps://`` with ``broker_use_ssl``) URL listing every host of
    a kombu connection (its failover list included). Every host must share credentials
    and virtual host. Raises :class:`ConfigurationError` for another transport."""
    urls = list(connection.alt) or [connection.as_uri(include_password=True)]
    hosts: list[str] = []
    first: tuple[str, str, str] | None = None
    for url in urls:
        conn = Connection(url)
        if conn.transport_cls not in AMQP_TRANSPORTS:
            raise ConfigurationError(
                f"msgsafe.compat.celery publishes to RabbitMQ (amqp://); the broker "
                f"transport is {conn.transport_cls!r}"
            )
        ident = (conn.userid or "guest", conn.password or "guest", conn.virtual_host or "/")
        if first is None:
            first = ident
        elif ident != first:
            raise ConfigurationError(
                "every broker URL must have the same credentials and virtual host"
            )
        host = _host(conn.hostname or "localhost", int(conn.port or 5672))
        if host not in hosts:
            hosts.append(host)
        conn.release()
    if first is None:  # pragma: no cover - a kombu connection has at least one URL
        raise ConfigurationError("no broker URL")
    user, password, vhost = first
    scheme = "amqps" if connection.ssl else "amqp"
    userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}@"
    return f"{scheme}://{userinfo}{','.join(hosts)}/{quote(vhost, safe='')}"


class _DeclaringChannel:
    """The declaring calls kombu's entities make on a channel, recorded in order."""

    def __init__(self) -> None:
        self.made: list[Declaration] = []

    def prepare_queue_arguments(self, arguments: Any, **options: Any) -> Any:
        return _rabbitmq_arguments(arguments, **options)

    def exchange_declare(
        self,
        exchange: str,
        type: str,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: Any = None,
        nowait: bool = False,
        passive: bool = False,
    ) -> None:
        if not passive:
            self.made.append(
                Declaration(
                    "exchange",
                    exchange,
                    type=type,
                    durable=bool(durable),
                    auto_delete=bool(auto_delete),
                    arguments=dict(arguments or {}),
                )
            )

    def queue_declare(
        self,
        queue: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = True,
        arguments: Any = None,
        nowait: bool = False,
    ) -> tuple[str, int, int]:
        if not passive:
            self.made.append(
                Declaration(
                    "queue",
                    queue,
                    durable=bool(durable),
                    exclusive=bool(exclusive),
                    auto_delete=bool(auto_delete),
                    arguments=dict(arguments or {}),
                )
            )
        return queue, 0, 0

    def queue_bind(
        self,
        queue: str,
        exchange: str = "",
        routing_key: str = "",
        arguments: Any = None,
        nowait: bool = False,
    ) -> None:
        self.made.append(
            Declaration(
                "bind",
                queue,
                source=exchange,
                routing_key=routing_key or "",
                arguments=dict(arguments or {}),
            )
        )

    def exchange_bind(
        self,
        destination: str,
        source: str = "",
        routing_key: str = "",
        nowait: bool = False,
        arguments: Any = None,
    ) -> None:
        self.made.append(
            Declaration(
                "exchange_bind",
                destination,
                source=source,
                routing_key=routing_key or "",
                arguments=dict(arguments or {}),
            )
        )


def declarations_of(entities: Any) -> tuple[Declaration, ...]:
    """What kombu declares for ``entities`` (the ``declare=`` of a publish: queues and
    exchanges), in kombu's order: each queue's exchange, the queue, its bindings. A
    queue without a name (the broker names it) or marked ``no_declare`` adds nothing."""
    channel = _DeclaringChannel()
    for entity in entities or ():
        if isinstance(entity, _Queue):
            if not entity.name or entity.no_declare:
                continue
            entity(channel).declare()
        elif isinstance(entity, _Exchange):
            entity(channel).declare()
    return tuple(channel.made)
