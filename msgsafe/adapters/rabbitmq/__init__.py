"""RabbitMQ (AMQP 0-9-1) adapter on pika's ``SelectConnection``.

``open_transport`` publishes persistent, ``mandatory`` messages with pipelined publisher
confirms and fails over across the URL's hosts; ``open_receiver`` consumes with manual
acknowledgement. Needs the ``rabbitmq`` extra (pika).
"""

from __future__ import annotations

from collections.abc import Mapping

from msgsafe.errors import ConfigurationError, MissingExtra

try:
    import pika  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.adapters._config import build_config
from msgsafe.adapters.rabbitmq._connection import connection_parameters
from msgsafe.adapters.rabbitmq._errors import open_error
from msgsafe.adapters.rabbitmq.config import RabbitOptions
from msgsafe.adapters.rabbitmq.receiver import RabbitReceiver
from msgsafe.adapters.rabbitmq.transport import RabbitTransport
from msgsafe.endpoints import BrokerUrl

__all__ = [
    "RabbitOptions",
    "RabbitReceiver",
    "RabbitTransport",
    "connection_parameters",
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
