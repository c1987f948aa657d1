"""``pika`` with msgsafe's ``BlockingConnection``; every other name is pika's own.

``from msgsafe.compat import pika`` in place of ``import pika`` is the whole migration:
``pika.ConnectionParameters``, ``pika.BasicProperties``, ``pika.exceptions`` ... are
pika's, ``pika.BlockingConnection`` publishes through msgsafe.

``BlockingConnection(parameters)`` takes the same ``ConnectionParameters`` /
``URLParameters`` (or a list of them: the hosts to fail over across) and
``channel()`` returns a channel whose ``basic_publish`` goes through msgsafe: persistent,
``mandatory``, pipelined publisher confirms, fail-over to the next host, and the durable
outbox when no broker can take the message. Declares (``queue_declare``,
``exchange_declare``, ``queue_bind`` ...) go unchanged to a real pika connection on the
same hosts. How parameters, destinations and errors translate is in
:mod:`msgsafe.compat._pika_config`.

What changes for the caller (``docs/migration.md`` has the full list):

- ``basic_publish`` returns as soon as the message is handed over; confirms arrive in the
  background. A message the broker refuses for good raises ``UnroutableError`` /
  ``NackError`` (with that message in ``.messages``) from the *next* ``basic_publish``,
  from ``wait_for_confirms()``, ``process_data_events()`` or ``close()``;
- a message no broker can take now is stored and forwarded later: no exception;
- consuming is not wrapped: use ``msgsafe.Consumer`` or pika itself.

NOTE: this module is named like the library it wraps; ``import pika`` below is an
absolute import and finds the real pika.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

from msgsafe.errors import MissingExtra

try:
    import pika
    from pika import (
        BasicProperties,
        ConnectionParameters,
        DeliveryMode,
        PlainCredentials,
        SSLOptions,
        URLParameters,
        adapters,
        channel,
        connection,
        credentials,
        exceptions,
        spec,
    )
    from pika import exceptions as pe
    from pika.connection import Parameters
    from pika.exchange_type import ExchangeType
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.compat._common import headers_dict, warn
from msgsafe.compat._pika_config import (
    NOT_CARRIED,
    connection_url,
    destination_of,
    publish_error,
    returned_message,
)
from msgsafe.endpoints import parse_url
from msgsafe.errors import ClosedError, InvalidMessage, MsgsafeError
from msgsafe.message import Receipt
from msgsafe.outbox.location import OutboxSpec
from msgsafe.producer import Producer as _SafeProducer

__all__ = [
    "BasicProperties",
    "BlockingChannel",
    "BlockingConnection",
    "ConnectionParameters",
    "DeliveryMode",
    "ExchangeType",
    "PlainCredentials",
    "SSLOptions",
    "URLParameters",
    "adapters",
    "channel",
    "connection",
    "credentials",
    "exceptions",
    "spec",
]

T = TypeVar("T")

#: Seconds close() waits for confirms of messages in flight.
_CLOSE_WAIT_S = 30.0
#: Seconds close() then gives the outbox to forward what it holds.
_CLOSE_DRAIN_S = 10.0


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException
    message: Any  #: a pika ReturnedMessage


class BlockingConnection:
    """A ``pika.BlockingConnection`` whose channels publish through msgsafe.

    ``parameters``: a ``ConnectionParameters`` / ``URLParameters`` or a list of them
    (every host is a fail-over candidate, tried in order). ``outbox``: where messages go
    while no broker can take them (msgsafe's ``outbox=``; default a file in the user's
    data directory). ``_url`` replaces the broker URL (tests point it at ``memory://``).

    Unlike pika, the constructor does not fail while the brokers are down: messages are
    stored and forwarded when one is back.
    """

    def __init__(
        self,
        parameters: Parameters | Sequence[Parameters] | None = None,
        *,
        outbox: OutboxSpec = True,
        _url: str | None = None,
    ) -> None:
        if parameters is None:
            params: list[Parameters] = [pika.ConnectionParameters()]
        elif isinstance(parameters, Parameters):
            params = [parameters]
        else:
            params = list(parameters)
        url, options = connection_url(params)
        target = _url or url
        if parse_url(target).protocol != "rabbitmq":
            options = {}
        self._parameters = params
        self._producer = _SafeProducer(target, outbox=outbox, **options)
        self._lock = threading.Lock()
        self._channels: dict[int, BlockingChannel] = {}
        self._real: Any = None  # pika.BlockingConnection for declares, opened on first use
        self._real_channel: Any = None
        self._closed = False
        self._warned: set[str] = set()
        self._finalizer = weakref.finalize(self, _close_quietly, self._producer)

    # --- channels ----------------------------------------------------------------------

    def channel(self, channel_number: int | None = None) -> BlockingChannel:
        """A publishing channel (numbers are only labels: all share msgsafe's connection)."""
        self._check_open()
        with self._lock:
            number = channel_number or max(self._channels, default=0) + 1
            existing = self._channels.get(number)
            if existing is not None and existing.is_open:
                return existing
            channel = BlockingChannel(self, number)
            self._channels[number] = channel
            return channel

    # --- state -------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return not self._closed

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise pe.ConnectionWrongStateError("BlockingConnection.close() was called")

    def process_data_events(self, time_limit: float | None = 0) -> None:
        """Raise failures of earlier publishes, as pika would when it processes confirms."""
        self._check_open()
        if time_limit:
            self._producer.flush(time_limit)
        for channel in list(self._channels.values()):
            channel._raise_failures()

    def sleep(self, duration: float) -> None:
        """Wait ``duration`` seconds while confirms arrive; raises earlier failures."""
        self.process_data_events(duration)

    # --- the declare connection --------------------------------------------------------

    def _declare(self, operation: Callable[[Any], T]) -> T:
        """Run ``operation`` on a real pika channel; reconnect once if the connection died
        (declares are idempotent, and the host list lets pika move to a live node)."""
        self._check_open()
        for attempt in (1, 2):
            try:
                return operation(self._declare_channel())
            except (pe.AMQPConnectionError, pe.ConnectionWrongStateError):
                self._drop_real()
                if attempt == 2:
                    raise
            except (pe.ChannelClosed, pe.ChannelWrongStateError):
                self._real_channel = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _declare_channel(self) -> Any:
        if self._real is None or not self._real.is_open:
            self._real = pika.BlockingConnection(self._parameters)
            self._real_channel = None
        if self._real_channel is None or not self._real_channel.is_open:
            self._real_channel = self._real.channel()
        return self._real_channel

    def _drop_real(self) -> None:
        real, self._real, self._real_channel = self._real, None, None
        if real is not None:
            with contextlib.suppress(pe.AMQPError, OSError):
                real.close()

    # --- msgsafe -----------------------------------------------------------------------

    @property
    def producer(self) -> _SafeProducer:
        """The msgsafe producer behind every channel (outbox depth, target)."""
        return self._producer

    def _warn_once(self, what: str, message: str) -> None:
        with self._lock:
            if what in self._warned:
                return
            self._warned.add(what)
        warn(message, depth=2)

    # --- closing -----------------------------------------------------------------------

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Wait for every confirm (up to 30 s), let the outbox forward what it holds (up
        to 10 s), then disconnect; raises ``UnroutableError`` / ``NackError``
        for messages that failed since the last check. Idempotent.

        Messages still in the outbox stay there for the next connection on it.
        """
        if self._closed:
            return
        self._closed = True
        self._producer.flush(_CLOSE_WAIT_S)
        if self._producer.pending() > 0:
            with contextlib.suppress(MsgsafeError):
                self._producer.drain(_CLOSE_DRAIN_S)
        self._drop_real()
        self._finalizer()
        failures = [c for c in self._channels.values() if c._has_failures()]
        for channel in self._channels.values():
            channel._closed = True
        for channel in failures:
            channel._raise_failures()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<msgsafe.compat.pika.BlockingConnection {self._producer.target} {state}>"


def _close_quietly(producer: _SafeProducer) -> None:
    with contextlib.suppress(MsgsafeError):
        producer.close(_CLOSE_WAIT_S)


class BlockingChannel:
    """The publishing half of ``pika.BlockingChannel``; see the module docstring."""

    def __init__(self, connection: BlockingConnection, channel_number: int) -> None:
        self._conn = connection
        self.channel_number = channel_number
        self._lock = threading.Lock()
        self._failures: list[_Failure] = []
        self._closed = False

    # --- state -------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return not self._closed and self._conn.is_open

    @property
    def is_closed(self) -> bool:
        return not self.is_open

    @property
    def connection(self) -> BlockingConnection:
        return self._conn

    def _check_open(self) -> None:
        if not self.is_open:
            raise pe.ChannelWrongStateError("Channel is closed.")

    # --- publishing --------------------------------------------------------------------

    def confirm_delivery(self) -> None:
        """Accepted for compatibility: msgsafe always publishes with confirms."""
        self._check_open()

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
    ) -> None:
        """Publish persistent and ``mandatory`` (whatever ``mandatory`` says) with a
        pipelined confirm; returns without waiting for it.

        Raises ``UnroutableError`` / ``NackError`` for *earlier* messages that failed for
        good (each exception lists exactly those messages); ``TypeError`` for a bad body
        or header. A message no broker can take now is stored: no exception.
        """
        self._check_open()
        self._raise_failures()
        if isinstance(body, str):
            body = body.encode("utf-8")
        props = properties if properties is not None else BasicProperties()
        destination = destination_of(exchange, routing_key)
        headers = headers_dict(props.headers)
        dropped = [name for name in NOT_CARRIED if getattr(props, name, None) is not None]
        if dropped:
            self._conn._warn_once(
                ",".join(dropped),
                f"BasicProperties not carried by msgsafe: {', '.join(dropped)} "
                "(headers and message_id are)",
            )
        returned = returned_message(exchange, routing_key, props, bytes(body))
        try:
            future = self._conn.producer.send_async(
                destination, body, headers=headers, message_id=props.message_id or None
            )
        except InvalidMessage:
            raise
        except ClosedError as exc:
            raise pe.ChannelWrongStateError("Channel is closed.") from exc
        except MsgsafeError as exc:
            raise publish_error(exc, [returned]) from exc
        future.add_done_callback(lambda f: self._settled(returned, f))

    def _settled(self, returned: Any, future: Future[Receipt]) -> None:
        # Runs on msgsafe's I/O or outbox thread: record, never raise here.
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self._failures.append(_Failure(exc, returned))

    def _has_failures(self) -> bool:
        with self._lock:
            return bool(self._failures)

    def _raise_failures(self) -> None:
        """Raise one pika exception for the failures of one kind recorded so far (the
        others stay for the next call)."""
        with self._lock:
            if not self._failures:
                return
            kind = type(publish_error(self._failures[0].error, []))
            taken = [f for f in self._failures if type(publish_error(f.error, [])) is kind]
            self._failures = [f for f in self._failures if f not in taken]
        error = publish_error(taken[0].error, [f.message for f in taken])
        raise error from taken[0].error

    def wait_for_confirms(self, timeout: float | None = None) -> bool:
        """msgsafe addition: wait until every message published so far is confirmed or
        stored, then raise failures. Returns False if ``timeout`` passed first."""
        done = self._conn.producer.flush(timeout)
        self._raise_failures()
        return done

    # --- declares, passed through ------------------------------------------------------

    def queue_declare(
        self,
        queue: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Any:
        """``pika.BlockingChannel.queue_declare`` on a real connection to the same hosts."""
        return self._passed(
            "queue_declare",
            queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )

    def exchange_declare(
        self,
        exchange: str,
        exchange_type: ExchangeType | str = ExchangeType.direct,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Any:
        """``pika.BlockingChannel.exchange_declare`` on a real connection."""
        return self._passed(
            "exchange_declare",
            exchange,
            exchange_type=exchange_type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )

    def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Any:
        """``pika.BlockingChannel.queue_bind`` on a real connection."""
        return self._passed(
            "queue_bind", queue, exchange, routing_key=routing_key, arguments=arguments
        )

    def queue_purge(self, queue: str) -> Any:
        """``pika.BlockingChannel.queue_purge`` on a real connection."""
        return self._passed("queue_purge", queue)

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False) -> Any:
        """``pika.BlockingChannel.queue_delete`` on a real connection."""
        return self._passed("queue_delete", queue, if_unused=if_unused, if_empty=if_empty)

    def _passed(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # The declare runs on a real pika channel: msgsafe publishes, pika declares.
        self._check_open()
        return self._conn._declare(lambda ch: getattr(ch, method)(*args, **kwargs))

    # --- closing -----------------------------------------------------------------------

    def close(self, reply_code: int = 0, reply_text: str = "Normal shutdown") -> None:
        """Wait for the confirms in flight (the connection's), then raise failures."""
        if self._closed:
            return
        self._conn.producer.flush(_CLOSE_WAIT_S)
        self._closed = True
        self._raise_failures()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<msgsafe.compat.pika.BlockingChannel number={self.channel_number}>"
