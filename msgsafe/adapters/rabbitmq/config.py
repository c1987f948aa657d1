"""Options of the RabbitMQ adapter and the destination syntax."""

from __future__ import annotations

from dataclasses import dataclass

from msgsafe.adapters._config import TransportOptions, shown_destination
from msgsafe.errors import ConfigurationError, InvalidDestination

__all__ = [
    "QUEUE_TYPES",
    "Destination",
    "RabbitOptions",
    "check_destination",
    "parse_destination",
]

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


#: AMQP 0-9-1 carries queue and exchange names and routing keys as ``shortstr``: one
#: length byte, so at most 255 bytes of UTF-8.
SHORTSTR_MAX = 255


def parse_destination(destination: str) -> Destination:
    """``NAME`` is a queue through the default exchange; ``EXCHANGE/ROUTING-KEY`` publishes
    to that exchange (the routing key may be empty and may itself contain '/').

    :class:`~msgsafe.errors.InvalidDestination` for a name AMQP 0-9-1 cannot carry: empty,
    an empty exchange before '/', or a queue name, exchange name or routing key over
    255 bytes of UTF-8."""
    if not destination:
        raise InvalidDestination("destination must not be empty")
    exchange, sep, key = destination.partition("/")
    if not sep:
        _shortstr(destination, "queue names", destination)
        return Destination(exchange="", routing_key=destination, queue=destination)
    if not exchange:
        shown = shown_destination(destination)
        raise InvalidDestination(f"exchange name before '/' must not be empty: {shown}")
    _shortstr(exchange, "exchange names", destination)
    _shortstr(key, "routing keys", destination)
    return Destination(exchange=exchange, routing_key=key, queue=None)


def check_destination(destination: str) -> None:
    """The adapter's name check (see :mod:`msgsafe.adapters`): raises
    :class:`~msgsafe.errors.InvalidDestination` when no AMQP 0-9-1 broker can take
    ``destination`` (the rules of :func:`parse_destination`)."""
    parse_destination(destination)


def _shortstr(part: str, what: str, destination: str) -> None:
    size = len(part.encode())
    if size > SHORTSTR_MAX:
        # NOTE: the text keeps the wording RabbitMQ users search for ("at most 255 bytes").
        raise InvalidDestination(
            f"{what} are at most {SHORTSTR_MAX} bytes (AMQP 0-9-1 shortstr), this one is "
            f"{size} bytes: {shown_destination(destination)}"
        )
