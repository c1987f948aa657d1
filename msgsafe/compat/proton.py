"""``proton.utils``' blocking API whose senders send through msgsafe.

``from msgsafe.compat.proton import BlockingConnection`` in place of ``from proton.utils
import BlockingConnection`` is the migration; ``Message``, ``Delivery``, ``Timeout``,
``SendException``, ``BlockingReceiver`` ... are proton's own, re-exported here.

``BlockingConnection(url or [url, ...], timeout=..., urls=[...])`` takes proton's
arguments; ``create_sender(address)`` returns a :class:`BlockingSender` whose
``send(msg)`` returns once the broker **accepted** the message (durable) **or the outbox
stored it**, within ``timeout``. Sending gains what ``proton.utils`` lacks at run time:
reconnect, fail-over across the listed hosts and the ones the broker advertises
(``failover-server-list``, as ActiveMQ Artemis sends), and the outbox. Receivers
(``create_receiver``) are proton's own, on a real ``proton.utils.BlockingConnection``
to the same hosts.

What changes for the caller (``docs/migration.md`` has the full list): ``send`` returns
a :class:`Sent` (``remote_state`` ``ACCEPTED``, ``receipt``) instead of a proton
``Delivery``; a message the broker releases or modifies is stored and sent again
later (proton raises ``SendException(RELEASED)``); only the body (bytes or text), the
id and the application properties (as text) are carried.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import proton.utils as _utils
    from proton import (
        ConnectionException,
        Delivery,
        Endpoint,
        LinkException,
        Message,
        ProtonException,
        SSLDomain,
        Timeout,
        Url,
    )
    from proton.utils import (
        BlockingReceiver,
        ConnectionClosed,
        LinkDetached,
        SendException,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("amqp10", "python-qpid-proton") from exc

from msgsafe.compat._common import ClosesOnExit, warn
from msgsafe.compat._proton_fast import FastSender
from msgsafe.compat._proton_send import (
    envelope_of,
    msgsafe_url,
    send_error,
    send_within,
    set_fields,
)
from msgsafe.errors import InvalidMessage, MsgsafeError
from msgsafe.message import Receipt, Status
from msgsafe.outbox.location import OutboxSpec
from msgsafe.producer import Producer

__all__ = [
    "BlockingConnection",
    "BlockingReceiver",
    "BlockingSender",
    "ConnectionClosed",
    "ConnectionException",
    "Delivery",
    "Endpoint",
    "LinkDetached",
    "LinkException",
    "Message",
    "ProtonException",
    "SSLDomain",
    "SendException",
    "Sent",
    "Timeout",
    "Url",
]

log = logging.getLogger("msgsafe.compat.proton")

#: Seconds close() gives the confirms in flight, and the outbox, to finish.
CLOSE_WAIT_S = 10.0
#: The states ``send`` raises ``SendException`` for unless told otherwise (proton's).
_ERROR_STATES = (Delivery.REJECTED, Delivery.RELEASED)
#: proton's default timeout of a BlockingConnection (seconds).
_PROTON_TIMEOUT_S = 60.0


class Sent:
    """What :meth:`BlockingSender.send` returns in place of a proton ``Delivery``: the
    outcome (``remote_state``: ``Delivery.ACCEPTED``, or the failed state a caller's
    ``error_states`` left out; always settled) and msgsafe's :class:`~msgsafe.Receipt`
    (``receipt.status``: accepted by the broker, or stored; None when it failed)."""

    __slots__ = ("link", "local_state", "receipt", "remote_state", "tag")

    settled = True

    def __init__(
        self,
        link: BlockingSender,
        tag: str,
        receipt: Receipt | None,
        remote_state: Any = Delivery.ACCEPTED,
    ) -> None:
        self.link = link
        self.tag = tag
        self.receipt = receipt
        self.remote_state = remote_state
        self.local_state = remote_state

    def __repr__(self) -> str:
        return f"<Sent {self.tag} {self.remote_state}>"


class BlockingSender(ClosesOnExit):
    """A sender of :class:`BlockingConnection` (``proton.utils.BlockingSender``'s
    ``send`` and ``close``) that sends through msgsafe."""

    def __init__(self, connection: BlockingConnection, address: str | None, name: str) -> None:
        self.connection = connection
        self.address = address
        self.name = name
        self._closed = False
        self._warned: set[str] = set()

    @property
    def is_open(self) -> bool:
        return not self._closed and not self.connection.closing

    def send(
        self,
        msg: Message,
        timeout: float | bool | None = False,
        error_states: Sequence[Any] | None = None,
    ) -> Sent:
        """Send ``msg`` durable; return once the broker accepted it or the outbox stored
        it, within ``timeout`` seconds (``False``: the connection's timeout; ``None``:
        until msgsafe's own outcome).

        Raises ``SendException(REJECTED)`` for a message the broker refused for good
        (when ``REJECTED`` is in ``error_states``, the default), ``SendException``
        (``RELEASED``) for one neither accepted nor stored (no outbox, or a full one),
        ``proton.Timeout`` when there is no outbox and the deadline passed,
        ``TypeError`` for a body or property msgsafe cannot carry, and
        ``ConnectionException`` after ``close()``.
        """
        if not self.is_open:
            raise ConnectionException(f"sender {self.name} is closed")
        for name in set_fields(msg):
            if name not in self._warned:
                self._warned.add(name)
                warn(f"Message.{name} is not carried by msgsafe (body, id and properties are)")
        envelope = envelope_of(self.address, msg)
        limit = self.connection.timeout if timeout is False else timeout
        seconds = None if limit is None else float(limit)
        fast = self.connection._fast
        if fast is not None:
            started = time.monotonic()
            if (accepted := fast.send(envelope, seconds)) is not None:
                return Sent(self, envelope.message_id, accepted)  # on this thread
            if seconds is not None:
                seconds = max(0.0, seconds - (time.monotonic() - started))
        try:
            receipt = send_within(self.connection.producer, envelope, seconds)
        except InvalidMessage:
            raise
        except MsgsafeError as exc:
            error = send_error(exc)
            bad = _ERROR_STATES if error_states is None else error_states
            if isinstance(error, SendException) and error.state not in bad:
                # proton returns such a delivery: its remote_state says what happened.
                return Sent(self, envelope.message_id, None, error.state)
            raise error from exc
        if fast is not None and receipt.status is Status.CONFIRMED:
            fast.path.confirmed_safe()
        return Sent(self, envelope.message_id, receipt)

    def close(self) -> None:
        """Close the sender (what it sent is confirmed or stored already)."""
        self._closed = True

    def __repr__(self) -> str:
        return f"<msgsafe.compat.proton.BlockingSender {self.name} to {self.address!r}>"


class BlockingConnection(ClosesOnExit):
    """``proton.utils.BlockingConnection`` whose senders send through msgsafe.

    ``url``: one URL or a list of them (every host a fail-over candidate, tried in
    order); ``urls`` adds more, as proton's. ``timeout`` is the default deadline of a
    send and of receiver calls (proton's default: 60 s). ``user``/``password`` as
    proton's ``Container.connect`` keywords. msgsafe's: ``outbox`` (where messages wait
    while no broker accepts them; default a file in the user's data directory),
    ``require`` (``"durable"`` or ``"any"``), ``lazy`` (no real proton connection
    until a receiver needs one: the constructor does not fail while the brokers are
    down), ``fast_path`` (False: every send through msgsafe's producer, none on the
    caller's thread; see :mod:`msgsafe.compat._proton_fast`; its former name ``direct``
    is still accepted, with a ``DeprecationWarning``) and ``_url`` (replaces msgsafe's
    URL; tests use ``memory://``).

    As proton's, the constructor connects (the real connection receivers use) and
    raises proton's ``ConnectionException`` / ``Timeout`` when no host answers.
    """

    def __init__(
        self,
        url: str | Url | Sequence[str | Url] | None = None,
        timeout: float | None = None,
        container: Any = None,
        ssl_domain: SSLDomain | None = None,
        heartbeat: float | None = None,
        urls: Sequence[str] | None = None,
        reconnect: Any = None,
        *,
        outbox: OutboxSpec = True,
        require: str = "durable",
        lazy: bool = False,
        fast_path: bool = True,
        direct: bool | None = None,
        user: str | None = None,
        password: str | None = None,
        _url: str | None = None,
        **kwargs: Any,
    ) -> None:
        if url is None or isinstance(url, (str, Url)):
            listed: list[str | Url] = [] if url is None else [url]
        else:
            listed = list(url)
        listed += list(urls or [])
        if not listed:
            listed = ["amqp://localhost:5672"]
        self.timeout = _PROTON_TIMEOUT_S if timeout is None else timeout
        self.closing = False
        self._lock = threading.Lock()
        self._senders = 0
        self._real_args: dict[str, Any] = {
            "url": None if len(listed) > 1 else str(listed[0]),
            "urls": [str(u) for u in listed] if len(listed) > 1 else None,
            "timeout": timeout,
            "container": container,
            "ssl_domain": ssl_domain,
            "heartbeat": heartbeat,
            "reconnect": reconnect,
            **({"user": user} if user else {}),
            **({"password": password} if password else {}),
            **kwargs,
        }
        target, options = msgsafe_url(listed, user=user, password=password)
        if heartbeat:
            options["heartbeat"] = float(heartbeat)
        if _url is not None:
            target, options = _url, {}
        # NOTE: before the producer exists, so a refused connection leaves nothing open.
        self._real: Any = None if lazy or _url else _utils.BlockingConnection(**self._real_args)
        try:
            self._producer = Producer(target, outbox=outbox, require=require, **options)
        except BaseException:
            if self._real is not None:
                self._real.close()
            raise
        # Sends go on the caller's thread while the broker accepts them (its own real
        # connection, opened on the first send); not with a test's URL, or when asked.
        self._fast: FastSender | None = None
        if direct is not None:
            warnings.warn(
                "BlockingConnection(direct=...) is now fast_path=...", DeprecationWarning, 2
            )
            fast_path = direct
        if fast_path and _url is None:
            self._fast = FastSender(
                lambda: _utils.BlockingConnection(**self._real_args), self._producer
            )
        self._finalizer = weakref.finalize(self, _close_quietly, self._producer, self._fast)

    # --- senders, receivers ------------------------------------------------------------

    def create_sender(
        self,
        address: str | None,
        handler: Any = None,
        name: str | None = None,
        options: Any = None,
    ) -> BlockingSender:
        """A sender to ``address`` (None: each message's own ``address``). ``handler``
        and ``options`` have no effect on msgsafe's links (a ``CompatWarning`` says so)."""
        self._check_open()
        if handler is not None or options is not None:
            warn("create_sender(handler=, options=) is not used: msgsafe opens its own links")
        with self._lock:
            self._senders += 1
            label = name or f"sender-{self._senders}"
        return BlockingSender(self, address, label)

    def create_receiver(self, *args: Any, **kwargs: Any) -> BlockingReceiver:
        """proton's ``create_receiver`` on the real connection (same arguments)."""
        receiver: BlockingReceiver = self._real_connection().create_receiver(*args, **kwargs)
        return receiver

    def _real_connection(self) -> Any:
        self._check_open()
        with self._lock:
            if self._real is None:
                self._real = _utils.BlockingConnection(**self._real_args)
            return self._real

    # --- state -------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return not self.closing

    @property
    def url(self) -> str:
        """The address of the real connection, or of msgsafe's target while it has none."""
        if self._real is not None and self._real.conn is not None:
            return str(self._real.url)
        return self._producer.target

    @property
    def fast_sends(self) -> int:
        """msgsafe addition: how many sends the broker accepted on the caller's thread,
        over the fast path (the others went through :attr:`producer`)."""
        return 0 if self._fast is None else self._fast.path.accepted

    #: The former name of :attr:`fast_sends`.
    direct_sends = fast_sends

    @property
    def producer(self) -> Producer:
        """msgsafe's producer behind every sender (outbox depth, target)."""
        return self._producer

    def _check_open(self) -> None:
        if self.closing:
            raise ConnectionException("BlockingConnection.close() was called")

    def wait(self, condition: Any, timeout: Any = False, msg: str | None = None) -> None:
        """proton's ``wait`` on the real connection (receivers' events)."""
        self._real_connection().wait(condition, timeout=timeout, msg=msg)

    def run(self) -> None:
        self._real_connection().run()

    # --- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for every send in flight (up to 10 s), let the outbox forward what it
        holds (up to 10 s), then close the real connection. Idempotent, as proton's.
        Messages still in the outbox stay there for the next connection on it."""
        if self.closing:
            return
        self.closing = True
        try:
            self._producer.flush(CLOSE_WAIT_S)
            if self._producer.pending() > 0:
                with contextlib.suppress(MsgsafeError):
                    self._producer.drain(CLOSE_WAIT_S)
        finally:
            self._finalizer()
            real, self._real = self._real, None
            if real is not None:
                try:
                    real.close()
                except ProtonException as exc:
                    # NOTE: proton's close raises when the peer is gone; the sends are
                    # safe either way, so a dead receivers' connection does not fail it.
                    log.debug("closing the receivers' connection: %r", exc)

    def __repr__(self) -> str:
        state = "closed" if self.closing else "open"
        return f"<msgsafe.compat.proton.BlockingConnection {self._producer.target} {state}>"


def _close_quietly(producer: Producer, fast: FastSender | None) -> None:
    if fast is not None:
        fast.close()
    with contextlib.suppress(MsgsafeError):
        producer.close(CLOSE_WAIT_S)
