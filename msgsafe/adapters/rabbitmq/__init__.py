"""RabbitMQ (AMQP 0-9-1) adapter on pika's ``SelectConnection``.

``open_transport`` publishes persistent, ``mandatory`` messages with pipelined publisher
confirms and fails over across the URL's hosts; ``open_receiver`` consumes with manual
acknowledgement. Needs the ``rabbitmq`` extra (pika).
"""

from __future__ import annotations

try:
    import pika  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from msgsafe.errors import MissingExtra

    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.adapters.rabbitmq.adapter import open_receiver, open_transport
from msgsafe.adapters.rabbitmq.config import RabbitOptions
from msgsafe.adapters.rabbitmq.receiver import RabbitReceiver
from msgsafe.adapters.rabbitmq.transport import RabbitTransport

__all__ = ["RabbitOptions", "RabbitReceiver", "RabbitTransport", "open_receiver", "open_transport"]
