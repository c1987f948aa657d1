"""How pika's vocabulary maps to msgsafe's, for :mod:`msgsafe.compat.pika`.

``ConnectionParameters`` become one msgsafe URL and adapter options, an
``exchange``/``routing_key`` pair a destination, a msgsafe error the pika exception a
publisher in confirm mode would see. Kept apart from the connection and channel classes
so that each file reads as one thing: this one is pure translation, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from msgsafe.errors import MissingExtra

try:
    import pika
    from pika import exceptions as pe
    from pika.adapters.blocking_connection import ReturnedMessage
    from pika.connection import Parameters
    from pika.spec import Basic, BasicProperties
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.errors import AuthenticationError, ConfigurationError, InvalidMessage, Unroutable

__all__ = ["connection_url", "destination_of", "publish_error", "returned_message"]


#: AMQP reply code RabbitMQ returns a mandatory message with when no queue is bound.
_NO_ROUTE = 312
#: AMQP reply code RabbitMQ closes a channel with on a publish to a missing exchange.
_NOT_FOUND = 404
#: NOTE: the text msgsafe's RabbitMQ adapter gives ``Unroutable`` for that close
#: (``msgsafe.adapters.rabbitmq._errors.classify_close``); the name keeps its quotes.
_MISSING_EXCHANGE = re.compile(r"no such exchange: (.*)$")


def _host(params: Parameters) -> str:
    host = str(params.host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{params.port}"


def connection_url(parameters: Sequence[Parameters]) -> tuple[str, dict[str, Any]]:
    """The ``amqp://`` (or ``amqps://``) URL listing every host of ``parameters`` and the
    RabbitMQ adapter options taken from the first of them.

    Every entry must share credentials, virtual host and TLS (one URL carries one of
    each); only ``PlainCredentials`` are supported. Raises :class:`ConfigurationError`.
    """
    if not parameters:
        raise ConfigurationError("at least one ConnectionParameters is needed")
    first = parameters[0]
    creds = first.credentials
    if not isinstance(creds, pika.PlainCredentials):
        raise ConfigurationError(
            f"{type(creds).__name__} is not supported by msgsafe.compat.pika; use PlainCredentials"
        )
    tls = first.ssl_options is not None
    for other in parameters[1:]:
        same_creds = (
            isinstance(other.credentials, pika.PlainCredentials)
            and other.credentials.username == creds.username
            and other.credentials.password == creds.password
        )
        if (
            not same_creds
            or other.virtual_host != first.virtual_host
            or (other.ssl_options is not None) != tls
        ):
            raise ConfigurationError(
                "every ConnectionParameters in the list must have the same credentials, "
                "virtual host and TLS setting"
            )
    hosts: list[str] = []
    for params in parameters:
        host = _host(params)
        if host not in hosts:
            hosts.append(host)
    userinfo = f"{quote(creds.username, safe='')}:{quote(creds.password, safe='')}@"
    vhost = quote(first.virtual_host, safe="")
    scheme = "amqps" if tls else "amqp"
    options: dict[str, Any] = {}
    if isinstance(first.heartbeat, int) and not isinstance(first.heartbeat, bool):
        options["heartbeat"] = first.heartbeat
    if first.blocked_connection_timeout:
        options["blocked_timeout"] = float(first.blocked_connection_timeout)
    if first.socket_timeout:
        options["connect_timeout"] = float(first.socket_timeout)
    name = (first.client_properties or {}).get("connection_name")
    if isinstance(name, str) and name:
        options["client_name"] = name
    return f"{scheme}://{userinfo}{','.join(hosts)}/{vhost}", options


def returned_message(exchange: str, routing_key: str, props: BasicProperties, body: bytes) -> Any:
    method = Basic.Return(
        reply_code=_NO_ROUTE, reply_text="NO_ROUTE", exchange=exchange, routing_key=routing_key
    )
    return ReturnedMessage(method, props, body)


def publish_error(exc: BaseException, messages: Sequence[Any], vhost: str = "/") -> Exception:
    """The pika exception a publisher in confirm mode would see for a msgsafe error.

    ``Unroutable`` for a missing exchange -> ``ChannelClosedByBroker`` (404);
    ``Unroutable`` -> ``UnroutableError``; ``AuthenticationError`` ->
    ``ProbableAuthenticationError``; every other failure of a message (rejected, too
    large, not stored because the outbox is off or full) -> ``NackError``.
    """
    error: Exception
    missing = _MISSING_EXCHANGE.match(str(exc)) if isinstance(exc, Unroutable) else None
    if missing is not None:
        # pika: the broker closes the channel (404) on a publish to a missing exchange.
        error = pe.ChannelClosedByBroker(
            _NOT_FOUND, f"NOT_FOUND - no exchange {missing.group(1)} in vhost '{vhost}'"
        )
    elif isinstance(exc, Unroutable):
        error = pe.UnroutableError(list(messages))
    elif isinstance(exc, AuthenticationError):
        error = pe.ProbableAuthenticationError(str(exc))
    else:
        error = pe.NackError(list(messages))
    return error


def destination_of(exchange: str, routing_key: str) -> str:
    """msgsafe's RabbitMQ destination: a queue name through the default exchange, or
    ``exchange/routing-key``."""
    if not exchange:
        return routing_key
    if "/" in exchange:
        raise InvalidMessage(
            f"exchange names containing '/' are not supported by msgsafe ({exchange!r})"
        )
    return f"{exchange}/{routing_key}"
