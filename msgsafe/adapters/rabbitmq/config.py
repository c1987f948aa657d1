"""Options of the RabbitMQ adapter and the destination syntax."""

from __future__ import annotations

from dataclasses import dataclass

from msgsafe.adapters._config import TransportOptions
from msgsafe.errors import ConfigurationError

__all__ = ["QUEUE_TYPES", "Destination", "RabbitOptions", "parse_destination"]

#: Queue types ``declare=`` accepts (the ``x-queue-type`` argument).
QUEUE_TYPES = ("classic", "quorum", "stream")

#: NOTE: RabbitMQ 3.10 refuses bodies over ``max_message_size`` (128 MiB by default,
#: hard limit 512 MiB) by closing the channel; checking before sending keeps the
#: channel, and every other message in flight on it, alive.
BROKER_MAX_MESSAGE_SIZE = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class RabbitOptions(TransportOptions):
    """Options of ``amqp://`` URLs (query string or keyword arguments)."""

    #: Heartbeat interval in seconds (0 disables; not recommended): a dead or frozen
    #: node is noticed after about heartbeat + 5 s.
    heartbeat: int = 10
    #: Seconds a ``connection.blocked`` (memory or disk alarm) may last before the
    #: connection is dropped and another host tried.
    blocked_timeout: float = 30.0
    #: Declare the destination queue (durable) with this type on first use:
    #: None (never declare), "classic", "quorum" or "stream".
    declare: str | None = None
    #: Unacknowledged deliveries a receiver may hold (basic.qos prefetch count).
    prefetch: int = 100
    #: Client-proposed AMQP frame size (the broker may lower it).
    frame_max: int = 131072
    #: Connection name shown in the management UI.
    client_name: str = "msgsafe"

    def __post_init__(self) -> None:
        TransportOptions.__post_init__(self)
        if self.heartbeat < 0:
            raise ConfigurationError("heartbeat must be >= 0")
        if self.blocked_timeout <= 0:
            raise ConfigurationError("blocked_timeout must be > 0")
        if self.declare is not None and self.declare not in QUEUE_TYPES:
            raise ConfigurationError(f"declare must be one of {', '.join(QUEUE_TYPES)} (or None)")
        if self.prefetch < 0 or self.prefetch > 65535:
            raise ConfigurationError("prefetch must be between 0 and 65535")
        if self.frame_max < 4096:
            raise ConfigurationError("frame_max must be >= 4096")

    @property
    def size_limit(self) -> int:
        """``max_message_size``, capped at what the broker accepts."""
        return min(self.max_message_size, BROKER_MAX_MESSAGE_SIZE)


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a message goes: ``exchange`` ("" is the default exchange) and ``routing_key``;
    ``queue`` is the queue name when the destination names a queue directly."""

    exchange: str
    routing_key: str
    queue: str | None


def parse_destination(destination: str) -> Destination:
    """``NAME`` is a queue through the default exchange; ``EXCHANGE/ROUTING-KEY`` publishes
    to that exchange (the routing key may be empty and may itself contain '/')."""
    if not destination:
        raise ConfigurationError("destination must not be empty")
    exchange, sep, key = destination.partition("/")
    if not sep:
        if len(destination.encode()) > 255:
            raise ConfigurationError("queue names are at most 255 bytes")
        return Destination(exchange="", routing_key=destination, queue=destination)
    if not exchange:
        raise ConfigurationError("exchange name before '/' must not be empty")
    if len(exchange.encode()) > 255 or len(key.encode()) > 255:
        raise ConfigurationError("exchange names and routing keys are at most 255 bytes")
    return Destination(exchange=exchange, routing_key=key, queue=None)
