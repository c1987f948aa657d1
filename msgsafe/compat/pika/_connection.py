"""msgsafe's ``BlockingConnection``: pika's blocking connection whose channels publish
through msgsafe (see :mod:`msgsafe.compat.pika`)."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import pika
    from pika import exceptions as pe
    from pika.connection import Parameters
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.compat._common import ClosesOnExit
from msgsafe.compat._pika_config import connection_url
from msgsafe.compat.pika._channel import CLOSE_WAIT_S, BlockingChannel
from msgsafe.compat.pika._url import expand
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError
from msgsafe.outbox.location import OutboxSpec
from msgsafe.producer import Producer as _SafeProducer

__all__ = ["BlockingConnection"]

#: Seconds close() gives the outbox to forward what it holds.
_CLOSE_DRAIN_S = 10.0


class BlockingConnection(ClosesOnExit):
    """A ``pika.BlockingConnection`` whose channels publish through msgsafe.

    ``parameters``: a ``ConnectionParameters`` / ``URLParameters`` or a list of them
    (every host is a fail-over candidate, tried in order); this package's
    ``URLParameters`` of a URL with several hosts counts as the list of its hosts.
    ``outbox``: where messages go while no broker can take them (msgsafe's ``outbox=``;
    default a file in the user's data directory). ``pipelined``: ``basic_publish``
    returns at once and reports failures from a later call (faster; a message whose
    publish returned may still be in flight when the process dies). ``_url`` replaces
    the broker URL (tests point it at ``memory://``).

    As pika, the constructor connects (the real pika connection that declares and
    consuming use) and raises pika's ``AMQPConnectionError`` when no host answers.
    ``lazy=True`` opts out: the constructor then does not fail while the brokers are
    down, messages are stored and forwarded when one is back, and the real connection
    opens on first use. ``require``: msgsafe's destination requirement (``"durable"``:
    publishing to a queue that a clean restart empties raises ``UnsafeDestination``;
    ``"any"`` keeps pika's behaviour).
    """

    def __init__(
        self,
        parameters: Parameters | Sequence[Parameters] | None = None,
        *,
        outbox: OutboxSpec = True,
        pipelined: bool = False,
        lazy: bool = False,
        require: str = "durable",
        _url: str | None = None,
    ) -> None:
        if parameters is None:
            params: list[Parameters] = [pika.ConnectionParameters()]
        elif isinstance(parameters, Parameters):
            params = [parameters]
        else:
            params = list(parameters)
        # A multi-host URLParameters (msgsafe's URL form) is its hosts, as a list would be.
        params = expand(params)
        url, options = connection_url(params)
        target = _url or url
        # pika's options are for the protocol its parameters speak, not for another
        # target (a test aims the wrapper at memory://).
        if parse_url(target).protocol != parse_url(url).protocol:
            options = {}
        self._parameters = params
        self.pipelined = pipelined
        # NOTE: before the producer exists, so a refused connection leaves nothing open.
        real = None if lazy or _url else pika.BlockingConnection(params)
        self._producer = _SafeProducer(target, outbox=outbox, require=require, **options)
        self._lock = threading.Lock()
        self._channels: dict[int, BlockingChannel] = {}
        self._real: Any = real  # pika.BlockingConnection for declares (reopened on use)
        #: The thread that opened the real connection: the only one publishing directly.
        self._real_thread: int | None = None if real is None else threading.get_ident()
        self._closed = False
        self._woken = threading.Event()  # set by close(): ends a wait with no connection
        self._finalizer = weakref.finalize(self, _close_quietly, self._producer)

    # --- channels ----------------------------------------------------------------------

    def channel(self, channel_number: int | None = None) -> BlockingChannel:
        """A channel (numbers are labels: publishing shares msgsafe's connection)."""
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

    @property
    def virtual_host(self) -> str:
        """The virtual host every channel publishes to (the parameters')."""
        return str(self._parameters[0].virtual_host)

    @property
    def publisher_confirms_supported(self) -> bool:
        """True: msgsafe publishes with confirms on every broker it talks to."""
        return True

    publisher_confirms = publisher_confirms_supported

    @property
    def basic_nack_supported(self) -> bool:
        return bool(self._real_connection().basic_nack_supported)

    @property
    def consumer_cancel_notify_supported(self) -> bool:
        return bool(self._real_connection().consumer_cancel_notify_supported)

    @property
    def exchange_exchange_bindings_supported(self) -> bool:
        return bool(self._real_connection().exchange_exchange_bindings_supported)

    def _check_open(self) -> None:
        if self._closed:
            raise pe.ConnectionWrongStateError("BlockingConnection.close() was called")

    # --- events ------------------------------------------------------------------------

    def process_data_events(self, time_limit: float | None = 0) -> None:
        """Process I/O for up to ``time_limit`` seconds as pika does (consumer callbacks
        of the real connection, return callbacks), then raise failures of pipelined
        publishes. With no real connection open it waits the whole ``time_limit``
        (``None``: until every publish so far is confirmed or stored)."""
        self._check_open()
        real = self._real
        if real is not None and real.is_open:
            real.process_data_events(time_limit)
        elif time_limit is None:
            self._producer.flush(None)
        elif time_limit > 0:
            self._woken.wait(time_limit)
        for channel in list(self._channels.values()):
            channel._dispatch_returns()
            channel._raise_failures()

    def sleep(self, duration: float) -> None:
        """Process events for ``duration`` seconds (pika's ``sleep``)."""
        deadline = time.monotonic() + duration
        self.process_data_events(0)
        while (left := deadline - time.monotonic()) > 0:
            self.process_data_events(left)

    def add_on_connection_blocked_callback(self, callback: Callable[..., None]) -> None:
        """``callback(connection, method_frame)`` when RabbitMQ blocks publishers (from
        the real connection's events; msgsafe's own publishing waits or stores)."""
        self._real_connection().add_on_connection_blocked_callback(
            lambda _conn, method: callback(self, method)
        )

    def add_on_connection_unblocked_callback(self, callback: Callable[..., None]) -> None:
        """``callback(connection, method_frame)`` when RabbitMQ unblocks publishers."""
        self._real_connection().add_on_connection_unblocked_callback(
            lambda _conn, method: callback(self, method)
        )

    def update_secret(self, new_secret: str, reason: str) -> None:
        """pika's ``update_secret`` on the real connection (declares and consuming); the
        publishing connection keeps the secret it logged in with (see the migration
        notes). Raises ``ConnectionWrongStateError`` once closed."""
        self._real_connection().update_secret(new_secret, reason)

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self._real_connection().add_callback_threadsafe(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        return self._real_connection().call_later(delay, callback)

    def remove_timeout(self, timeout_id: Any) -> None:
        self._real_connection().remove_timeout(timeout_id)

    # --- the real connection -------------------------------------------------------------

    def _real_connection(self) -> Any:
        """The pika connection for declares, consuming and the fast publish path (made
        by the constructor unless lazy; reopened here when it was lost)."""
        self._check_open()
        with self._lock:
            if self._real is None or not self._real.is_open:
                self._real = pika.BlockingConnection(self._parameters)
                self._real_thread = threading.get_ident()
            return self._real

    def _drop_real(self) -> None:
        real, self._real = self._real, None
        if real is not None:
            with contextlib.suppress(pe.AMQPError, OSError):
                real.close()

    # --- msgsafe -----------------------------------------------------------------------

    @property
    def producer(self) -> _SafeProducer:
        """The msgsafe producer behind every channel (outbox depth, target)."""
        return self._producer

    # --- closing -----------------------------------------------------------------------

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Wait for every confirm (up to 30 s), let the outbox forward what it holds (up
        to 10 s), then disconnect; raises ``UnroutableError`` / ``NackError`` for
        pipelined messages that failed since the last check, and
        ``ConnectionWrongStateError`` when already closed, as pika.

        Messages still in the outbox stay there for the next connection on it.
        """
        self._check_open()
        self._closed = True
        self._woken.set()
        self._producer.flush(CLOSE_WAIT_S)
        if self._producer.pending() > 0:
            with contextlib.suppress(MsgsafeError):
                self._producer.drain(_CLOSE_DRAIN_S)
        self._drop_real()
        self._finalizer()
        failures = [c for c in self._channels.values() if c._has_failures()]
        for channel in self._channels.values():
            channel._mark_closed()
        for channel in failures:
            channel._raise_failures()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<msgsafe.compat.pika.BlockingConnection {self._producer.target} {state}>"


def _close_quietly(producer: _SafeProducer) -> None:
    with contextlib.suppress(MsgsafeError):
        producer.close(CLOSE_WAIT_S)
