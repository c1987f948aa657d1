"""Publishing: persistent, ``mandatory`` messages with pipelined publisher confirms.

Every envelope becomes an item with a future and a deadline (call time +
``confirm_timeout``). Items wait in ``pending`` (in ``publish`` order) until the channel
is ready, then go ``in_flight`` keyed by delivery tag until the broker's ``basic.ack``
(success, or :class:`~msgsafe.errors.Unroutable` when a ``basic.return`` came first),
``basic.nack`` (:class:`~msgsafe.errors.Refused`) or the deadline
(:class:`~msgsafe.errors.ConfirmTimeout`). When the connection is lost, everything in
flight goes back to the front of ``pending`` and is resent, same ``message_id``, on the
next host. All of that state belongs to the I/O thread; callers only append to
``incoming`` and wait on futures.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import pika
from pika.channel import Channel
from pika.spec import Basic

from msgsafe.adapters.rabbitmq._errors import channel_close_error, describe, lost_error
from msgsafe.adapters.rabbitmq._link import IoThread, Link, log
from msgsafe.adapters.rabbitmq.config import (
    BROKER_MAX_MESSAGE_SIZE,
    Destination,
    RabbitOptions,
    parse_destination,
)
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    MsgsafeError,
    Refused,
    Rejected,
    Unroutable,
)
from msgsafe.message import MESSAGE_ID_HEADER, Envelope

__all__ = ["KEY_HEADER", "RabbitTransport"]

#: Header carrying the message key (bytes) next to ``msgsafe-id``.
KEY_HEADER = "msgsafe-key"

#: Bytes kept free in a frame for the content header's fixed fields.
_HEADER_FRAME_RESERVE = 512

_TICK_S = 0.1

#: reply code of a channel this side closed on purpose
_REPLY_SUCCESS = 200


@dataclass(slots=True, eq=False)
class _Item:
    envelope: Envelope
    dest: Destination
    properties: pika.BasicProperties
    future: Future[None]
    deadline: float
    queued_at: float
    attempts: int = 0


@dataclass(slots=True)
class _Declare:
    queue: str
    done: bool = False
    running: bool = False
    error: MsgsafeError | None = None


def _properties(envelope: Envelope) -> pika.BasicProperties:
    headers: dict[str, object] = dict(envelope.headers)
    headers[MESSAGE_ID_HEADER] = envelope.message_id
    if envelope.key is not None:
        headers[KEY_HEADER] = envelope.key
    return pika.BasicProperties(
        delivery_mode=2,  # persistent
        message_id=envelope.message_id,
        headers=headers,
        timestamp=int(envelope.created_at),
    )


class RabbitTransport:
    """A :class:`~msgsafe.ports.Transport` over pika's ``SelectConnection``.

    Contract, beyond the Protocol's: messages are persistent and ``mandatory``; the
    future resolves only on the broker's ``basic.ack`` with no ``basic.return`` before
    it. ``Unroutable`` and ``MessageTooLarge``, ``AuthenticationError`` and ``Rejected``
    are permanent; ``Refused`` (nack, blocked connection, full window), ``ConfirmTimeout``,
    ``ConnectionLost`` and ``ConnectError`` are transient. An envelope whose connection
    drops is resent on the next host with the same ``message_id`` while its deadline
    allows. With no host reachable for ``connect_timeout`` the waiting futures fail with
    ``ConnectError`` (or ``ConnectionLost`` when a copy was already sent).
    """

    def __init__(self, url: BrokerUrl, options: RabbitOptions) -> None:
        if url.protocol != "rabbitmq":
            raise ConfigurationError(f"not an AMQP 0-9-1 URL: {url.scheme}://")
        self._url = url
        self._options = options
        self._target = url.redacted()
        self._max_body = min(options.max_message_size, BROKER_MAX_MESSAGE_SIZE)
        self._destinations: dict[str, Destination] = {}
        # Caller side: the window and the hand-over queue.
        self._cond = threading.Condition()
        self._outstanding = 0
        self._waiters = 0
        self._low_water = options.max_in_flight // 2
        self._batching = False
        self._unreleased = 0
        self._closed = False
        self._incoming: collections.deque[_Item] = collections.deque()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        # I/O-thread side.
        self._pending: collections.deque[_Item] = collections.deque()
        self._in_flight: collections.OrderedDict[int, _Item] = collections.OrderedDict()
        self._returned: set[str] = set()
        self._declares: dict[str, _Declare] = {}
        self._channel: Channel | None = None
        self._next_tag = 1
        self._blocked = False
        self._recycling = False
        self._down_since: float | None = time.monotonic()
        self._fatal: MsgsafeError | None = None
        self._frame_max = options.frame_max
        self._stopped = threading.Event()
        self._io = IoThread(f"msgsafe-rabbitmq-publish {self._target}")
        self._link = Link(
            url,
            options,
            self._io.loop,
            on_ready=self._ready,
            on_lost=self._lost,
            on_fatal=self._fatal_error,
            on_channel_closed=self._channel_closed,
            on_blocked=self._set_blocked,
            on_closed=self._link_closed,
        )
        self._io.call(self._start)

    # --- caller side ----------------------------------------------------------------------

    @property
    def target(self) -> str:
        """The redacted URL (no credentials)."""
        return self._target

    @property
    def options(self) -> RabbitOptions:
        return self._options

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker confirmed it.

        Waits (at most ``confirm_timeout``) while ``max_in_flight`` envelopes are
        outstanding; then the future fails with ``Refused``.
        """
        future: Future[None] = Future()
        # NOTE: a message on the wire cannot be taken back; the future is not cancellable.
        future.set_running_or_notify_cancel()
        mid = envelope.message_id
        try:
            dest = self._destination(envelope.destination)
        except ConfigurationError as exc:
            future.set_exception(exc)
            return future
        error = self._check_size(envelope)
        if error is not None:
            future.set_exception(error)
            return future
        now = time.monotonic()
        timeout = self._options.confirm_timeout
        with self._cond:
            if self._closed:
                future.set_exception(ClosedError("transport is closed", endpoint=self._target))
                return future
            if self._outstanding >= self._options.max_in_flight and not self._wait_for_room(
                timeout
            ):
                future.set_exception(
                    Refused(
                        f"{self._options.max_in_flight} messages in flight for {timeout} s",
                        endpoint=self._target,
                        message_id=mid,
                    )
                )
                return future
            if self._closed:
                future.set_exception(ClosedError("transport is closed", endpoint=self._target))
                return future
            self._outstanding += 1
        item = _Item(
            envelope=envelope,
            dest=dest,
            properties=_properties(envelope),
            future=future,
            deadline=now + timeout,
            queued_at=now,
        )
        self._incoming.append(item)
        self._wake()
        return future

    def _wait_for_room(self, timeout: float) -> bool:
        # Called with self._cond held.
        self._waiters += 1
        try:
            return self._cond.wait_for(
                lambda: self._outstanding < self._options.max_in_flight or self._closed, timeout
            )
        finally:
            self._waiters -= 1

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding confirms, fail the rest with
        ``ConnectionLost``, disconnect and stop the I/O thread. Idempotent."""
        with self._cond:
            already = self._closed
            self._closed = True
            self._cond.notify_all()
            if not already:
                self._cond.wait_for(lambda: self._outstanding == 0, timeout)
        if self._io.in_thread():
            self._shutdown()
            return
        if self._io.call(self._shutdown):
            self._stopped.wait(max(5.0, self._options.connect_timeout))
        self._io.stop()

    def __enter__(self) -> RabbitTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(self._options.confirm_timeout)

    def __repr__(self) -> str:
        return f"RabbitTransport({self._target!r})"

    def _destination(self, name: str) -> Destination:
        dest = self._destinations.get(name)
        if dest is None:
            dest = parse_destination(name)
            if len(self._destinations) < 10_000:
                self._destinations[name] = dest
        return dest

    def _check_size(self, envelope: Envelope) -> MsgsafeError | None:
        if len(envelope.body) > self._max_body:
            return MessageTooLarge(
                f"body of {len(envelope.body)} bytes exceeds the limit of {self._max_body}",
                endpoint=self._target,
                message_id=envelope.message_id,
            )
        # NOTE: AMQP 0-9-1 carries all properties in one content-header frame; RabbitMQ
        # closes the whole connection (501 FRAME_ERROR) when it exceeds frame_max, which
        # would take every other message in flight down with it.
        header_bytes = len(envelope.key or b"") + 2 * len(envelope.message_id) + 64
        if envelope.headers:
            header_bytes += sum(len(k) + len(v) + 8 for k, v in envelope.headers.items())
        limit = self._frame_max - _HEADER_FRAME_RESERVE
        if header_bytes > limit:
            return MessageTooLarge(
                f"headers of about {header_bytes} bytes exceed the frame limit of {limit}",
                endpoint=self._target,
                message_id=envelope.message_id,
            )
        return None

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        if not self._io.call(self._on_wake):
            self._drain_after_stop()

    def _drain_after_stop(self) -> None:
        while self._incoming:
            item = self._incoming.popleft()
            self._resolve(item, ClosedError("transport is closed", endpoint=self._target))

    # --- I/O thread -----------------------------------------------------------------------

    def _start(self) -> None:
        self._link.start()
        self._io.loop.call_later(_TICK_S, self._tick)

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        self._flush()

    def _resolve(self, item: _Item, error: MsgsafeError | None) -> None:
        try:
            if error is None:
                item.future.set_result(None)
            else:
                if error.message_id is None:
                    error.message_id = item.envelope.message_id
                item.future.set_exception(error)
        except InvalidStateError:
            return  # already resolved (e.g. timed out, then confirmed late)
        if self._batching:
            self._unreleased += 1
        else:
            self._release(1)

    def _release(self, count: int) -> None:
        """Give ``count`` window slots back.

        Publishers blocked on a full window are woken only once it is half empty: they
        then refill it in one go instead of trading the GIL with this thread per message.
        """
        if count <= 0:
            return
        with self._cond:
            self._outstanding -= count
            if self._outstanding == 0 or (self._waiters and self._outstanding <= self._low_water):
                self._cond.notify_all()

    def _flush(self) -> None:
        while self._incoming:
            self._pending.append(self._incoming.popleft())
        channel = self._channel
        if channel is None:
            if self._fatal is not None:
                while self._pending:
                    self._resolve(self._pending.popleft(), _copy(self._fatal))
            return
        if self._blocked:
            return
        publish = channel.basic_publish
        while self._pending:
            item = self._pending[0]
            if item.future.done():
                self._pending.popleft()
                continue
            dest = item.dest
            if self._options.declare is not None and dest.queue is not None:
                state = self._declares.get(dest.queue)
                if state is None or not state.done:
                    self._declare(channel, dest.queue)
                    return  # NOTE: later items wait too, so per-key order holds
            self._pending.popleft()
            try:
                publish(
                    dest.exchange,
                    dest.routing_key or _key_text(item.envelope.key),
                    item.envelope.body,
                    item.properties,
                    mandatory=True,
                )
            except Exception as exc:
                # The channel or connection is closing; its close callback resends.
                log.debug("publish on a closing channel: %s", describe(exc))
                self._pending.appendleft(item)
                return
            item.attempts += 1
            self._in_flight[self._next_tag] = item
            self._next_tag += 1
        _coalesce(channel)

    def _declare(self, channel: Channel, queue: str) -> None:
        state = self._declares.setdefault(queue, _Declare(queue))
        if state.running:
            return
        state.running = True
        args = {"x-queue-type": self._options.declare}

        def done(_frame: Any) -> None:
            state.running = False
            state.done = True
            self._flush()

        channel.queue_declare(queue, durable=True, arguments=args, callback=done)

    def _ready(self, channel: Channel) -> None:
        self._channel = channel
        self._recycling = False
        self._next_tag = 1
        self._returned.clear()
        self._fatal = None
        self._down_since = None
        self._frame_max = min(self._options.frame_max, channel.connection.params.frame_max)
        for state in self._declares.values():
            state.running = False
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._confirming)

    def _confirming(self, _frame: Any) -> None:
        self._flush()

    def _on_return(
        self,
        _channel: Channel,
        method: Basic.Return,
        properties: pika.BasicProperties,
        _body: bytes,
    ) -> None:
        # NOTE: RabbitMQ sends basic.return before the basic.ack of an unroutable
        # mandatory message, and acks it anyway: the ack must not count as a confirm.
        if properties.message_id:
            self._returned.add(properties.message_id)

    def _on_confirm(self, frame: Any) -> None:
        self._batching = True
        try:
            self._confirm(frame)
        finally:
            self._batching = False
            count, self._unreleased = self._unreleased, 0
            self._release(count)

    def _confirm(self, frame: Any) -> None:
        method = frame.method
        tag: int = method.delivery_tag
        nack = isinstance(method, Basic.Nack)
        if method.multiple:
            while self._in_flight:
                first = next(iter(self._in_flight))
                if first > tag:
                    break
                self._confirmed(self._in_flight.popitem(last=False)[1], nack)
        else:
            item = self._in_flight.pop(tag, None)
            if item is not None:
                self._confirmed(item, nack)
        if self._pending or self._incoming:
            self._flush()

    def _confirmed(self, item: _Item, nack: bool) -> None:
        endpoint = self._link.endpoint
        if nack:
            self._resolve(item, Refused("the broker nacked the message", endpoint=endpoint))
            self._recycle_channel()
            return
        if self._returned:
            mid = item.envelope.message_id
            if mid in self._returned:
                self._returned.discard(mid)
                self._resolve(
                    item,
                    Unroutable(
                        f"no queue bound for {item.envelope.destination!r} (basic.return)",
                        endpoint=endpoint,
                    ),
                )
                return
        self._resolve(item, None)

    def _recycle_channel(self) -> None:
        """Close the channel after a nack; the link opens a fresh one and the messages in
        flight on the old one are resent.

        NOTE: RabbitMQ 3.10 keeps nacking every publish on a channel whose quorum queue
        leader died, even after a new leader was elected; a new channel finds the leader.
        """
        channel = self._channel
        if channel is None or self._recycling or not channel.is_open:
            return
        self._recycling = True
        self._channel = None
        try:
            channel.close()
        except Exception as exc:
            log.debug("closing a nacking channel: %s", describe(exc))

    def _requeue_in_flight(self) -> None:
        """Put everything in flight back at the front of ``pending``, in tag order."""
        if self._in_flight:
            self._pending.extendleft(reversed(list(self._in_flight.values())))
            self._in_flight.clear()
        self._returned.clear()

    def _lost(self, reason: BaseException | None) -> None:
        self._channel = None
        self._down_since = time.monotonic()
        self._blocked = False
        self._requeue_in_flight()
        err = channel_close_error(
            getattr(reason, "reply_code", 0), getattr(reason, "reply_text", ""), self._link.endpoint
        )
        self._fail_culprits(*err)

    def _channel_closed(self, code: int, text: str) -> None:
        self._channel = None
        self._requeue_in_flight()
        error, exchange, size = channel_close_error(code, text, self._link.endpoint)
        for state in self._declares.values():
            if state.running and code != _REPLY_SUCCESS:
                state.running = False
                state.error = error or Rejected(
                    f"declaring queue {state.queue!r} failed: {code} {text}",
                    condition=text.split(" ", 1)[0] or str(code),
                    endpoint=self._link.endpoint,
                )
                self._fail_where(lambda it, q=state.queue: it.dest.queue == q, state.error)
                self._declares.pop(state.queue, None)
                return
        self._fail_culprits(error, exchange, size)

    def _fail_culprits(
        self, error: MsgsafeError | None, exchange: str | None, size: int | None
    ) -> None:
        if error is None:
            return
        if exchange is not None:
            self._fail_where(lambda it: it.dest.exchange == exchange, error)
        elif size is not None:
            self._fail_where(lambda it: len(it.envelope.body) >= size, error)
        elif isinstance(error, MessageTooLarge) and self._pending:
            # NOTE: a frame error names no message; the first resent one is the likeliest.
            self._resolve(self._pending.popleft(), error)

    def _fail_where(self, predicate: Any, error: MsgsafeError) -> None:
        keep: collections.deque[_Item] = collections.deque()
        for item in self._pending:
            if predicate(item):
                self._resolve(item, _copy(error))
            else:
                keep.append(item)
        self._pending = keep

    def _fatal_error(self, error: MsgsafeError) -> None:
        self._fatal = error
        self._flush()

    def _set_blocked(self, blocked: bool) -> None:
        self._blocked = blocked
        if not blocked:
            self._flush()

    def _tick(self) -> None:
        if self._stopped.is_set():
            return
        now = time.monotonic()
        endpoint = self._link.endpoint
        if self._in_flight:
            expired = [tag for tag, it in self._in_flight.items() if now >= it.deadline]
            for tag in expired:
                item = self._in_flight.pop(tag)
                self._resolve(
                    item,
                    ConfirmTimeout(
                        f"no confirm within {self._options.confirm_timeout} s", endpoint=endpoint
                    ),
                )
        while self._incoming:
            self._pending.append(self._incoming.popleft())
        if self._pending:
            down = self._down_since
            connect_limit = self._options.connect_timeout
            keep: collections.deque[_Item] = collections.deque()
            for item in self._pending:
                if item.future.done():
                    continue
                # NOTE: once no host answered for connect_timeout, new envelopes fail at
                # the next tick instead of waiting again: the outbox is the faster home.
                unreachable = (
                    self._channel is None and down is not None and now - down >= connect_limit
                )
                if now >= item.deadline or unreachable:
                    self._resolve(item, self._waiting_error(item, unreachable, endpoint))
                else:
                    keep.append(item)
            self._pending = keep
        self._io.loop.call_later(_TICK_S, self._tick)
        if self._pending and self._channel is not None:
            self._flush()

    def _waiting_error(self, item: _Item, unreachable: bool, endpoint: str) -> MsgsafeError:
        if self._fatal is not None:
            return _copy(self._fatal)
        if item.attempts:
            return ConnectionLost(
                "connection lost before the confirm and no host took the resend in time",
                endpoint=endpoint,
            )
        if self._blocked:
            return Refused("the broker blocked the connection (resource alarm)", endpoint=endpoint)
        if unreachable or self._channel is None:
            return ConnectError(
                f"no broker reachable within {self._options.connect_timeout} s",
                endpoint=self._target,
            )
        return ConfirmTimeout(
            f"not sent within {self._options.confirm_timeout} s", endpoint=endpoint
        )

    def _shutdown(self) -> None:
        while self._incoming:
            self._pending.append(self._incoming.popleft())
        self._requeue_in_flight()
        for item in list(self._pending):
            # NOTE: transient on purpose, also for never-sent envelopes: the layer above
            # stores them in the outbox instead of handing them back to the caller.
            self._resolve(item, lost_error(None, self._link.endpoint))
        self._pending.clear()
        self._channel = None
        self._link.close()

    def _link_closed(self) -> None:
        self._stopped.set()


def _coalesce(channel: Channel) -> None:
    """Join the frames waiting in pika's send buffer into one chunk.

    NOTE: pika sends each buffered frame with its own ``send()`` call (three per
    message), and each call releases the GIL; with callers publishing from other threads
    that costs a thread switch per frame. One chunk per batch is one system call. This
    touches pika internals (1.3/1.4), so it does nothing when they are not as expected.
    """
    transport = getattr(channel.connection, "_transport", None)
    buffers = getattr(transport, "_tx_buffers", None)
    if isinstance(buffers, collections.deque) and len(buffers) > 1:
        joined = b"".join(buffers)
        buffers.clear()
        buffers.append(joined)


def _key_text(key: bytes | None) -> str:
    return key.decode("utf-8", "replace") if key else ""


def _copy(error: MsgsafeError) -> MsgsafeError:
    """A fresh instance per future: one exception object must not collect many tracebacks."""
    clone = type(error).__new__(type(error))
    clone.__dict__.update(error.__dict__)
    clone.args = error.args
    return clone
