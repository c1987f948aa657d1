"""Options of the AMQP 1.0 adapter: URL query options or keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from msgsafe.adapters._config import TransportOptions, build_config, shown_destination
from msgsafe.endpoints import BrokerUrl, Endpoint, MergePolicy
from msgsafe.errors import ConfigurationError, InvalidDestination

__all__ = ["Amqp10Options", "check_destination", "load_options"]

_MECHANISMS = {"PLAIN", "ANONYMOUS", "EXTERNAL"}
#: Queue types ``declare=`` accepts (RabbitMQ's ``x-queue-type``).
_QUEUE_TYPES = ("classic", "quorum", "stream")


@dataclass(frozen=True, slots=True, kw_only=True)
class Amqp10Options(TransportOptions):
    """AMQP 1.0 options on top of :class:`~msgsafe.adapters._config.TransportOptions`.

    ``max_in_flight`` bounds unsettled sends; ``credit`` is the receiver's window
    (credit issued plus deliveries handed out and not yet settled).
    """

    #: How the broker's ``failover-server-list`` combines with the URL's hosts:
    #: ``replace`` (default, as Qpid JMS), ``add`` or ``ignore``.
    failover_merge: str = "replace"
    #: Comma-separated ``host`` or ``host:port`` items; when set, an advertised
    #: candidate outside it is never followed.
    failover_allow: str | None = None
    #: Capability symbol sent on every link's terminus (the target of a sender, the
    #: source of a receiver), as Qpid JMS does for a queue. Artemis reads it to route to
    #: an anycast queue of the address's name; without it, under Artemis's default
    #: (multicast) routing, a first send creates an address with no queue and every
    #: accepted message is dropped. Empty: no capability.
    address_capability: str = "queue"
    #: Receiver window: credit plus unsettled deliveries, at most.
    credit: int = 100
    #: SASL mechanisms offered, space separated (None: PLAIN with credentials,
    #: ANONYMOUS without).
    sasl_mechanisms: str | None = None
    #: Allow SASL PLAIN over a connection without TLS (RabbitMQ's 5672 needs it).
    sasl_allow_insecure: bool = True
    #: Idle timeout (seconds) negotiated with the peer: a silent peer is a dead peer.
    heartbeat: float = 10.0
    #: AMQP open ``hostname`` (RabbitMQ reads ``vhost:NAME``); None: the host connected to.
    virtual_host: str | None = None
    #: Initial and maximum backoff (seconds) between reconnect attempts to one endpoint.
    #: Half a second at most, as the outbox's probes: a broker back after an outage is
    #: found within it (two seconds had the first confirm wait up to that long).
    reconnect_initial: float = 0.05
    reconnect_maximum: float = 0.5
    #: RabbitMQ only: the destination check declares a missing ``/amq/queue/NAME``
    #: queue durable, of this type (``quorum``, ``classic`` or ``stream``), over AMQP
    #: 0-9-1 on the same port before the first message (AMQP 1.0 cannot: RabbitMQ's
    #: plugin declares transient queues). None: a missing queue is refused.
    declare: str | None = None

    def __post_init__(self) -> None:
        TransportOptions.__post_init__(self)
        try:
            MergePolicy(self.failover_merge.lower())
        except ValueError:
            raise ConfigurationError(
                "failover_merge must be one of: replace, add, ignore"
            ) from None
        if self.declare is not None and self.declare not in _QUEUE_TYPES:
            raise ConfigurationError(f"declare must be one of {', '.join(_QUEUE_TYPES)} (or None)")
        if self.credit < 1:
            raise ConfigurationError("credit must be >= 1")
        if self.heartbeat < 0:
            raise ConfigurationError("heartbeat must be >= 0 (0 turns it off)")
        if not 0 < self.reconnect_initial <= self.reconnect_maximum:
            raise ConfigurationError("reconnect needs 0 < reconnect_initial <= reconnect_maximum")
        if self.sasl_mechanisms is not None:
            unknown = set(self.sasl_mechanisms.upper().split()) - _MECHANISMS
            if unknown or not self.sasl_mechanisms.split():
                raise ConfigurationError(
                    f"sasl_mechanisms must be among: {', '.join(sorted(_MECHANISMS))}"
                )
        self.allow_list()

    @property
    def merge_policy(self) -> MergePolicy:
        """``failover_merge`` as a :class:`MergePolicy`."""
        return MergePolicy(self.failover_merge.lower())

    def allow_list(self) -> frozenset[tuple[str, int | None]]:
        """``failover_allow`` parsed into (host, port-or-None) pairs."""
        items: set[tuple[str, int | None]] = set()
        for raw in (self.failover_allow or "").split(","):
            item = raw.strip()
            if not item:
                continue
            if item.startswith("["):
                host, _, rest = item[1:].partition("]")
                port = rest[1:] if rest.startswith(":") else rest
            elif item.count(":") == 1:
                host, _, port = item.partition(":")
            else:  # a bare name, or an IPv6 address without brackets
                host, port = item, ""
            if port and not port.isdigit():
                raise ConfigurationError("failover_allow items are host, host:port or [v6]:port")
            items.add((host.lower(), int(port) if port else None))
        return frozenset(items)

    def allows(self, endpoint: Endpoint) -> bool:
        """True when ``endpoint`` passes ``failover_allow`` (always when it is unset)."""
        allowed = self.allow_list()
        if not allowed:
            return True
        host = endpoint.host.lower()
        return (host, None) in allowed or (host, endpoint.port) in allowed


def load_options(url: BrokerUrl, options: Mapping[str, object]) -> Amqp10Options:
    """Validated options from the URL's query and keyword ``options``."""
    return build_config(Amqp10Options, url, options)


def check_destination(destination: str) -> None:
    """The adapter's name check (see :mod:`msgsafe.adapters`): raises
    :class:`~msgsafe.errors.InvalidDestination` for an address proton cannot send.

    An AMQP 1.0 address is any string, and brokers read it their own way (Artemis and
    Broker-J: an address or queue name; RabbitMQ: ``/amq/queue/NAME``,
    ``/exchange/NAME/KEY``), so only what no broker can receive is refused: a NUL
    character, at which proton's C string ends (the link would attach to the address
    cut there, another destination). Its length is left to the broker: the attach
    frame's limit is the peer's ``max-frame-size``, known only once connected."""
    if "\x00" in destination:
        raise InvalidDestination(
            "AMQP 1.0 addresses cannot hold a NUL character (proton would cut the address "
            f"there): {shown_destination(destination)}"
        )
