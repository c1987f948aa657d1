"""``aio_pika`` whose publishes go through msgsafe; every other name is aio-pika's own.

``from msgsafe.compat import aio_pika`` in place of ``import aio_pika`` is the whole
migration: ``aio_pika.Message``, ``DeliveryMode``, ``ExchangeType``, ``IncomingMessage``,
``exceptions``, ``patterns`` ... are aio-pika's; ``connect`` / ``connect_robust`` return
a connection (a subclass of aio-pika's ``Connection`` / ``RobustConnection``) whose
channels' exchanges publish through msgsafe. Declares, bindings, QoS, queues and
consuming run unchanged on that real aio-pika connection.

``await exchange.publish(message, routing_key, timeout=...)`` returns within
``timeout`` seconds (the connection's ``publish_timeout`` when None, 10 s by default)
once the message is **confirmed by the broker or stored in the outbox**; the outbox
forwards it later. The publish never hangs for an outage (aio-pika's
``connect_robust`` publish waits for the reconnection, then sends everything at once):
while the broker confirms, the message goes out on the caller's own channel; anything
else goes to msgsafe's producer, which has its own connection, fails over across the
hosts given (``failover=``), and stores what no broker confirms in time (the fast
path: :mod:`msgsafe.compat._aio_pika_publish`).

What changes for the caller (``docs/migration.md`` has the full list):

- the message is published persistent and ``mandatory`` whatever ``delivery_mode``
  says; an unroutable message published with ``mandatory=False`` is kept in the
  outbox instead of being dropped by the broker;
- the result is a :class:`PublishAck` (a ``Basic.Ack`` with msgsafe's receipt) also
  for a message the outbox stored; a nack goes to the outbox (transient for msgsafe);
- ``TimeoutError`` only when not even the outbox write finished within ``timeout``;
- float header values raise ``TypeError`` (pika, which carries the message through
  msgsafe and the outbox, has no float type).

NOTE: this module is named like aio-pika's; ``import aio_pika`` inside it is an
absolute import and finds the real aio-pika.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

from msgsafe.errors import MissingExtra

try:
    import aio_pika
    import aiormq
    from aio_pika import (
        AMQPException,
        DeliveryMode,
        ExchangeType,
        IncomingMessage,
        Message,
        MessageProcessError,
        Queue,
        RobustQueue,
        abc,
        exceptions,
        patterns,
        pool,
    )
    from aio_pika.abc import AbstractMessage, TimeoutType
    from aiormq.abc import DeliveredMessage
    from yarl import URL
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "aio-pika") from exc

from msgsafe.compat._aio_pika_publish import (
    DEFAULT_DEADLINE_S,
    FAST_FAILURES,
    Outgoing,
    PublishAck,
    Publisher,
    publish_error,
    returned_message,
)
from msgsafe.errors import ConfigurationError, MsgsafeError, Unroutable
from msgsafe.outbox.location import OutboxSpec
from msgsafe.producer import Producer

__all__ = [
    "AMQPException",
    "Channel",
    "Connection",
    "DeliveryMode",
    "Exchange",
    "ExchangeType",
    "IncomingMessage",
    "Message",
    "MessageProcessError",
    "PublishAck",
    "Queue",
    "RobustChannel",
    "RobustConnection",
    "RobustExchange",
    "RobustQueue",
    "abc",
    "connect",
    "connect_robust",
    "exceptions",
    "patterns",
    "pool",
]

log = logging.getLogger("msgsafe.compat.aio_pika")

#: Seconds close() gives the confirms in flight, and the outbox, to finish.
CLOSE_WAIT_S = 10.0
#: Publishes waiting in msgsafe's producer at once, per connection.
WINDOW = 1000
#: Room the producer's forwarder may take in the transport's window besides.
_FORWARDER_ROOM = 10_000


# --- exchanges --------------------------------------------------------------------------


class _Publishing:
    """``publish`` through msgsafe, shared by both exchange classes."""

    name: str
    internal: bool
    channel: Any

    async def publish(
        self,
        message: AbstractMessage,
        routing_key: str,
        *,
        mandatory: bool = True,
        immediate: bool = False,
        timeout: TimeoutType = None,
    ) -> Any:
        """Publish persistent and ``mandatory``; return within ``timeout`` seconds
        (None: the connection's ``publish_timeout``) once the broker confirmed the
        message or the outbox stored it.

        Returns a :class:`PublishAck` (``None`` on a channel opened with
        ``publisher_confirms=False``, as aio-pika). An unroutable message (no queue
        bound) goes to the channel's return callbacks and its ``DeliveredMessage`` is
        returned, or ``PublishError`` is raised with ``on_return_raises=True``, as
        aio-pika does. Raises ``ChannelNotFoundEntity`` for a missing exchange,
        ``DeliveryError`` for a message that failed for good, ``TimeoutError`` only when
        not even the outbox write finished in time.
        """
        if self.internal:
            raise ValueError(f"Can not publish to internal exchange: '{self.name}'!")
        channel: _ChannelMixin = self.channel
        publisher = channel._publisher()
        outgoing = Outgoing(self.name, routing_key, message)
        seconds = _seconds(timeout)
        # The caller's own channel goes first where aio-pika would wait for a confirm and
        # take a return (mandatory): see _aio_pika_publish's fast path. NOTE: awaited
        # here, not in a helper coroutine: one frame less on every resume of a publish.
        fast = (
            publisher.fast_deadline(outgoing, seconds, channel)
            if mandatory and channel.publisher_confirms
            else None
        )
        start = None
        if fast is not None:
            start, confirm_by = fast
            # The deadline: one timer for every publish in flight (Deadlines), not
            # aiormq's timer per publish.
            deadlines = publisher.deadlines
            watched = deadlines.watch(confirm_by)
            try:
                underlay = await channel.get_underlay_channel()  # type: ignore[attr-defined]
                answer = await underlay.basic_publish(
                    outgoing.body,
                    exchange=self.name,
                    routing_key=routing_key,
                    properties=outgoing.properties,
                    mandatory=True,
                )
            except aiormq.exceptions.PublishError:
                raise  # returned, on a channel with on_return_raises: aio-pika's answer
            except FAST_FAILURES as exc:
                publisher.fast_failed(outgoing, exc)
            except asyncio.CancelledError:
                if not deadlines.expired(watched):
                    raise  # the caller's cancellation
                publisher.fast_failed(outgoing, TimeoutError("no confirm by the deadline"))
            else:
                outcome = publisher.fast_answer(outgoing, answer)
                if isinstance(outcome, DeliveredMessage):
                    return outcome  # returned: the channel's return callbacks have run
                if outcome is not None:
                    return PublishAck(publisher.next_tag(), outcome)
            finally:
                deadlines.done(watched)
        try:
            receipt = await publisher.publish(outgoing, seconds, start)
        except Unroutable as exc:
            if "no such exchange" in str(exc):
                raise publish_error(exc, channel._vhost()) from exc
            envelope = outgoing.envelope()
            returned = returned_message(envelope, self.name, routing_key)
            if not mandatory:
                # NOTE: RabbitMQ drops an unroutable message published without mandatory
                # and aio-pika never hears of it; msgsafe keeps it in the outbox (the
                # forwarder tries it again and quarantines it while it stays unroutable).
                receipt = await publisher.park(envelope)
            elif channel.on_return_raises:
                raise aiormq.exceptions.PublishError(returned, returned.delivery) from exc
            else:
                channel._returned(returned)
                return returned
        except MsgsafeError as exc:
            raise publish_error(exc, channel._vhost()) from exc
        if not channel.publisher_confirms:
            return None
        return PublishAck(publisher.next_tag(), receipt)


class Exchange(_Publishing, aio_pika.Exchange):
    """aio-pika's ``Exchange`` whose ``publish`` goes through msgsafe."""


class RobustExchange(_Publishing, aio_pika.RobustExchange):
    """aio-pika's ``RobustExchange`` whose ``publish`` goes through msgsafe."""


def _seconds(timeout: TimeoutType) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, (int, float)):
        return float(timeout)
    raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")


# --- channels ---------------------------------------------------------------------------


class _ChannelMixin:
    """What both channel classes add: the way to the connection's publisher."""

    _connection: Any
    on_return_raises: bool
    publisher_confirms: bool

    def _publisher(self) -> Publisher:
        connection = self._connection
        if connection.close_called:
            raise aiormq.exceptions.ChannelInvalidStateError(f"{connection!r} closed")
        publisher: Publisher = connection.publisher
        return publisher

    def can_publish(self) -> bool:
        """Whether a publish on this channel goes out now: the channel open and its
        connection up (a robust connection reconnecting is not)."""
        return not self.is_closed and bool(self._connection.connected.is_set())  # type: ignore[attr-defined]

    def _vhost(self) -> str:
        return str(self._connection.url.path[1:] or "/")

    def _returned(self, message: Any) -> None:
        # aio-pika's own handling of a return frame: the return callbacks, whose errors
        # are logged and dropped (aiormq: "Unhandled return callback exception").
        try:
            self._on_return(message)  # type: ignore[attr-defined]
        except Exception:
            log.exception("Unhandled return callback exception")


class Channel(_ChannelMixin, aio_pika.Channel):
    """aio-pika's ``Channel`` whose exchanges publish through msgsafe."""

    EXCHANGE_CLASS = Exchange


class RobustChannel(_ChannelMixin, aio_pika.RobustChannel):
    """aio-pika's ``RobustChannel`` whose exchanges publish through msgsafe."""

    EXCHANGE_CLASS = RobustExchange


# --- connections ------------------------------------------------------------------------


class _ConnectionMixin:
    """What both connection classes add: msgsafe's producer, and closing it."""

    _publisher_: Publisher | None = None
    _finalizer: Any = None

    def attach(self, publisher: Publisher) -> None:
        """Publish through ``publisher`` (``connect`` / ``connect_robust`` do this)."""
        self._publisher_ = publisher
        self._finalizer = weakref.finalize(self, publisher.close, 0.0)

    @property
    def publisher(self) -> Publisher:
        publisher = self._publisher_
        if publisher is None:
            raise RuntimeError("connection made without msgsafe.compat.aio_pika.connect")
        return publisher

    @property
    def producer(self) -> Producer:
        """msgsafe's producer behind every exchange (outbox depth, target)."""
        return self.publisher.producer

    async def _close_publisher(self) -> None:
        publisher, self._publisher_ = self._publisher_, None
        if publisher is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        await asyncio.to_thread(publisher.close, CLOSE_WAIT_S)


class Connection(_ConnectionMixin, aio_pika.Connection):
    """aio-pika's ``Connection`` whose channels publish through msgsafe."""

    CHANNEL_CLASS = Channel

    async def close(self, exc: Any = aiormq.exceptions.ConnectionClosed) -> None:
        """Close the aio-pika connection, then wait for the confirms in flight and let
        the outbox forward what it holds (up to 10 s each); messages still in the
        outbox stay there for the next connection."""
        await aio_pika.Connection.close(self, exc)
        await self._close_publisher()


class RobustConnection(_ConnectionMixin, aio_pika.RobustConnection):
    """aio-pika's ``RobustConnection`` whose channels publish through msgsafe."""

    CHANNEL_CLASS = RobustChannel

    async def close(self, exc: Any = asyncio.CancelledError) -> None:
        """As :meth:`Connection.close`."""
        await aio_pika.RobustConnection.close(self, exc)
        await self._close_publisher()


# --- connecting -------------------------------------------------------------------------


def msgsafe_url(url: URL, failover: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """The ``amqp://`` URL msgsafe publishes to (``url``'s host first, then
    ``failover``'s ``host:port`` entries) and the RabbitMQ adapter options read from
    ``url``'s query (``heartbeat``, ``name``)."""
    if url.scheme not in ("amqp", "amqps"):
        raise ConfigurationError(f"unsupported scheme {url.scheme!r}: amqp:// or amqps://")
    tls = url.scheme == "amqps"
    port = url.port or (5671 if tls else 5672)
    hosts = [f"{url.host or 'localhost'}:{port}"]
    for entry in failover:
        _host, sep, number = str(entry).rpartition(":")
        if not sep or not number.isdigit():
            raise ConfigurationError(f"failover entries are host:port, not {entry!r}")
        if entry not in hosts:
            hosts.append(entry)
    user = quote(url.user or "guest", safe="")
    password = quote(url.password or "guest", safe="")
    vhost = quote(url.path[1:] or "/", safe="")
    options: dict[str, Any] = {}
    heartbeat = url.query.get("heartbeat")
    if heartbeat is not None and heartbeat.isdigit():
        options["heartbeat"] = int(heartbeat)
    name = url.query.get("name")
    if name:
        options["client_name"] = name
    return f"{url.scheme}://{user}:{password}@{','.join(hosts)}/{vhost}", options


async def _open(
    opener: Callable[..., Awaitable[Any]],
    url: str | URL | None,
    *,
    failover: Sequence[str],
    outbox: OutboxSpec,
    require: str,
    publish_timeout: float,
    msgsafe_target: str | None,
    **kwargs: Any,
) -> Any:
    """``opener`` (aio-pika's ``connect`` or ``connect_robust``) with ``kwargs``, and
    msgsafe's publisher attached to the connection it returns."""
    if publish_timeout <= 0:
        raise ConfigurationError("publish_timeout must be > 0")
    connection = await opener(url, **kwargs)
    if not isinstance(connection, (Connection, RobustConnection)):
        await connection.close()
        raise TypeError("connection_class must be msgsafe.compat.aio_pika's Connection class")
    target, options = msgsafe_url(connection.url, failover)
    if msgsafe_target is not None:
        target, options = msgsafe_target, {}
    else:
        options["max_in_flight"] = WINDOW + _FORWARDER_ROOM
    try:
        producer = await asyncio.to_thread(
            Producer, target, outbox=outbox, require=require, **options
        )
    except BaseException:
        await connection.close()
        raise
    connection.attach(Publisher(producer, deadline=publish_timeout, window=WINDOW))
    return connection


async def connect(
    url: str | URL | None = None,
    *,
    failover: Sequence[str] = (),
    outbox: OutboxSpec = True,
    require: str = "durable",
    publish_timeout: float = DEFAULT_DEADLINE_S,
    connection_class: type[Connection] = Connection,
    _url: str | None = None,
    **kwargs: Any,
) -> Connection:
    """aio-pika's ``connect`` (same arguments) returning a :class:`Connection` whose
    exchanges publish through msgsafe.

    msgsafe's additions: ``failover`` (more ``host:port`` to publish to when the first
    is down), ``outbox`` (where messages wait while no broker confirms them; default a
    file in the user's data directory), ``require`` (``"durable"``: publishing to a
    queue a clean restart empties raises ``UnsafeDestination``; ``"any"`` keeps
    aio-pika's behaviour) and ``publish_timeout`` (the deadline of a publish given no
    ``timeout``). ``_url`` replaces msgsafe's broker URL (tests: ``memory://``).
    """
    return await _open(  # type: ignore[no-any-return]
        aio_pika.connect,
        url,
        failover=failover,
        outbox=outbox,
        require=require,
        publish_timeout=publish_timeout,
        msgsafe_target=_url,
        connection_class=connection_class,
        **kwargs,
    )


async def connect_robust(
    url: str | URL | None = None,
    *,
    failover: Sequence[str] = (),
    outbox: OutboxSpec = True,
    require: str = "durable",
    publish_timeout: float = DEFAULT_DEADLINE_S,
    connection_class: type[RobustConnection] = RobustConnection,
    _url: str | None = None,
    **kwargs: Any,
) -> RobustConnection:
    """aio-pika's ``connect_robust`` returning a :class:`RobustConnection` whose
    exchanges publish through msgsafe; msgsafe's arguments as :func:`connect`. The
    aio-pika connection reconnects as aio-pika's does (declares, queues, consumers);
    publishing does not wait for it."""
    return await _open(  # type: ignore[no-any-return]
        aio_pika.connect_robust,
        url,
        failover=failover,
        outbox=outbox,
        require=require,
        publish_timeout=publish_timeout,
        msgsafe_target=_url,
        connection_class=connection_class,
        **kwargs,
    )


# The public home of the classes (reprs, docs, pickling by name).
for _cls in (Connection, RobustConnection, Channel, RobustChannel, Exchange, RobustExchange):
    _cls.__module__ = __name__


def __getattr__(name: str) -> Any:
    # Every other name of ``aio_pika`` (its submodules ``message``, ``channel``,
    # ``connection``, ``robust_*``, ``transaction``, ``log``, ...) is the original:
    # application code reaches them as ``aio_pika.message.IncomingMessage``.
    return getattr(aio_pika, name)
