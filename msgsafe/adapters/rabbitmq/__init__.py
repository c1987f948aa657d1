"""RabbitMQ (AMQP 0-9-1) adapter on pika's ``SelectConnection``.

``open_transport`` publishes persistent, ``mandatory`` messages with pipelined publisher
confirms and fails over across the URL's hosts; ``open_receiver`` consumes with manual
acknowledgement. Needs the ``rabbitmq`` extra (pika).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgsafe.errors import (
    ConfigurationError,
    ConnectError,
    MissingExtra,
    MsgsafeError,
    PermanentError,
)

try:
    import pika
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.adapters._config import build_config
from msgsafe.adapters.rabbitmq._connection import connection_parameters
from msgsafe.adapters.rabbitmq._errors import open_error
from msgsafe.adapters.rabbitmq.config import RabbitOptions, check_destination
from msgsafe.adapters.rabbitmq.receiver import RabbitReceiver
from msgsafe.adapters.rabbitmq.transport import RabbitTransport
from msgsafe.endpoints import BrokerUrl

__all__ = [
    "RabbitOptions",
    "RabbitReceiver",
    "RabbitTransport",
    "check_destination",
    "connection_parameters",
    "open_blocking_connection",
    "open_error",
    "open_receiver",
    "open_transport",
]


def _check(url: BrokerUrl) -> None:
    if url.protocol != "rabbitmq":
        raise ConfigurationError(f"the rabbitmq adapter cannot open {url.scheme}:// URLs")


def open_transport(url: BrokerUrl, options: Mapping[str, object]) -> RabbitTransport:
    """A publishing transport for ``url`` (options from the URL query overlaid by ``options``)."""
    _check(url)
    return RabbitTransport(url, build_config(RabbitOptions, url, options))


def open_receiver(
    url: BrokerUrl, options: Mapping[str, object], *, group: str | None = None
) -> RabbitReceiver:
    """A consuming receiver for ``url``.

    ``group`` names the shared queue when a receiver subscribes to ``exchange/routing-key``
    (it is declared and bound); for a bare queue name it is not needed.
    """
    _check(url)
    return RabbitReceiver(url, build_config(RabbitOptions, url, options), group=group)


def open_blocking_connection(
    url: BrokerUrl, options: RabbitOptions | Mapping[str, object] | None = None
) -> Any:
    """A pika ``BlockingConnection`` with the transport's own parameters (credentials,
    virtual host, TLS, ``connect_timeout``: :func:`connection_parameters`) to the first
    host of ``url`` that takes it. A refused login, a certificate that does not verify
    or a peer of another protocol raise their permanent error at once (the transport
    would meet the same); otherwise :class:`~msgsafe.errors.ConnectError` once every host
    failed."""
    if isinstance(options, RabbitOptions):
        opts = options
    else:
        opts = build_config(RabbitOptions, url, options or {})
    last: MsgsafeError | None = None
    for endpoint in url.endpoints:
        try:
            return pika.BlockingConnection(connection_parameters(url, opts, endpoint))
        except Exception as exc:  # pika's connector errors are not all AMQPError
            error = open_error(exc, str(endpoint), tls=endpoint.tls)
            if isinstance(error, PermanentError):
                raise error from exc
            last = error
    raise ConnectError(
        f"no RabbitMQ node answered: {last.message if last else 'no endpoint'}",
        endpoint=url.redacted(),
    ) from last
