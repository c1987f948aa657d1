"""Consuming: manual acknowledgement, prefetch, re-subscribe after fail-over.

Deliveries are handed from the I/O thread to callers through a queue. Each carries the
generation of the channel it came on; a settle for an older generation is dropped on
purpose — the broker already requeued that delivery when the channel died and will
deliver it again (at-least-once, ``redelivered`` set).

Settles from any thread are queued and the I/O thread is woken once per burst (a wake-up
per ``ack`` cost more than the rest of the consumer's work per message). The I/O thread
acknowledges the settled prefix of the channel's outstanding delivery tags with one
``basic.ack`` (``multiple``), and an acknowledgement beyond an unsettled delivery alone:
nothing is acknowledged that was not settled.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import pika
from pika.channel import Channel
from pika.spec import Basic

from msgsafe.adapters.rabbitmq._connection import IoThread, Link, log
from msgsafe.adapters.rabbitmq._wire import KEY_HEADER
from msgsafe.adapters.rabbitmq.config import RabbitOptions, parse_destination
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import AuthenticationError, ClosedError, ConfigurationError, MsgsafeError
from msgsafe.message import MESSAGE_ID_HEADER, Delivery, Outcome

__all__ = ["RabbitReceiver"]

_RESUBSCRIBE_S = 1.0

_ACCEPT = Outcome.ACCEPT
_REQUEUE = Outcome.REQUEUE
#: AMQP 0-9-1 has one give-back, ``basic.nack`` with requeue: a release is that too.
_RELEASE = Outcome.RELEASE


#: Set by RabbitMQ quorum queues on every redelivery: how many times it was delivered.
DELIVERY_COUNT_HEADER = "x-delivery-count"


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (int, float, bool)):
        return str(value)
    return None


def _headers(raw: Mapping[str, object] | None) -> tuple[dict[str, str], bytes | None]:
    headers: dict[str, str] = {}
    key: bytes | None = None
    for name, value in (raw or {}).items():
        if name == KEY_HEADER:
            key = value if isinstance(value, bytes) else str(value).encode()
            continue
        text = _text(value)
        if text is not None:
            headers[name] = text
    return headers, key


def quorum_attempt(raw: Mapping[str, object] | None) -> int | None:
    """The attempt a quorum queue counts: its ``x-delivery-count`` header is the number
    of earlier deliveries (absent on the first, and on classic queues: None there, the
    consumer counts)."""
    count = (raw or {}).get(DELIVERY_COUNT_HEADER)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count + 1
    return None


class _Subscription:
    __slots__ = ("bind", "consumer_tag", "destination", "queue")

    def __init__(self, destination: str, queue_name: str, bind: tuple[str, str] | None) -> None:
        self.destination = destination
        self.queue = queue_name
        self.bind = bind
        self.consumer_tag: str | None = None


class RabbitReceiver:
    """A :class:`~msgsafe.ports.Receiver` over pika's ``SelectConnection``.

    ``subscribe`` takes a queue name, or ``exchange/routing-key`` together with the
    receiver's ``group``: the queue named ``group`` is then declared (durable, of type
    ``declare`` or classic) and bound. With ``declare=`` set, a named queue is declared
    with that type too. At most ``prefetch`` deliveries are unsettled at once.
    """

    def __init__(self, url: BrokerUrl, options: RabbitOptions, *, group: str | None = None) -> None:
        self._url = url
        self._options = options
        self._group = group
        self._target = url.redacted()
        self._subs: list[_Subscription] = []
        self._deliveries: queue.Queue[tuple[int, Delivery]] = queue.Queue()
        self._generation = 0
        self._channel: Channel | None = None
        self._closed = False
        self._error: MsgsafeError | None = None
        self._stopped = threading.Event()
        #: Settles waiting for the I/O thread, (generation, tag, outcome); the thread is
        #: woken when the list stops being empty.
        self._settles: list[tuple[int, int, Outcome]] = []
        self._settles_lock = threading.Lock()
        #: Shared by the deliveries for their exactly-once check (see Delivery).
        self._delivery_lock = threading.Lock()
        #: I/O thread only: the current channel's delivery tags not acknowledged yet, in
        #: order, and those of them acknowledged alone (beyond an unsettled one).
        self._outstanding: deque[int] = deque()
        self._acked_alone: set[int] = set()
        self._io = IoThread(f"msgsafe-rabbitmq-consume {self._target}")
        self._link = Link(
            url,
            options,
            self._io.loop,
            on_ready=self._ready,
            on_lost=self._lost,
            on_fatal=self._fatal,
            on_channel_closed=self._channel_closed,
            on_blocked=lambda _flag: None,
            on_closed=self._stopped.set,
        )
        self._io.call(self._link.start)

    @property
    def target(self) -> str:
        return self._target

    def subscribe(self, destination: str) -> None:
        """Start consuming ``destination`` (now, or as soon as a channel is open)."""
        if self._closed:
            raise ClosedError("receiver is closed", endpoint=self._target)
        dest = parse_destination(destination)
        if dest.queue is not None:
            sub = _Subscription(destination, dest.queue, None)
        else:
            if not self._group:
                raise ConfigurationError(
                    "consuming from exchange/routing-key needs a group (the queue to bind)"
                )
            sub = _Subscription(destination, self._group, (dest.exchange, dest.routing_key))
        self._io.call(functools.partial(self._add, sub))

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds for the first.

        Raises the permanent error (e.g. ``AuthenticationError``) when the broker refused
        the receiver for good.
        """
        if self._closed:
            raise ClosedError("receiver is closed", endpoint=self._target)
        out: list[Delivery] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(out) < max_messages:
            if self._error is not None and not out:
                raise self._error
            try:
                if out:
                    gen, delivery = self._deliveries.get_nowait()
                else:
                    wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                    if wait <= 0:
                        break
                    gen, delivery = self._deliveries.get(timeout=wait)
            except queue.Empty:
                if out:
                    break
                continue
            if gen == self._generation:
                out.append(delivery)
            # else: the channel it came on is gone; the broker redelivers it.
        return out

    def close(self, timeout: float | None = None) -> None:
        """Stop consuming and disconnect; unsettled deliveries go back to the broker."""
        if self._closed:
            return
        self._closed = True
        if self._io.call(self._link.close):
            self._stopped.wait(timeout if timeout is not None else 10.0)
        self._io.stop()

    def __enter__(self) -> RabbitReceiver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RabbitReceiver({self._target!r})"

    # --- I/O thread -----------------------------------------------------------------------

    def _add(self, sub: _Subscription) -> None:
        self._subs.append(sub)
        if self._channel is not None:
            self._consume(self._channel, sub)

    def _ready(self, channel: Channel) -> None:
        self._generation += 1
        self._channel = channel
        self._outstanding.clear()
        self._acked_alone.clear()
        self._error = None
        channel.add_on_cancel_callback(self._cancelled)
        channel.basic_qos(prefetch_count=self._options.prefetch)
        for sub in self._subs:
            self._consume(channel, sub)

    def _consume(self, channel: Channel, sub: _Subscription) -> None:
        generation = self._generation

        def start(_frame: Any = None) -> None:
            if generation != self._generation or not channel.is_open:
                return
            sub.consumer_tag = channel.basic_consume(
                sub.queue,
                functools.partial(self._message, generation),
                auto_ack=False,
            )

        def bind(_frame: Any = None) -> None:
            if sub.bind is None:
                start()
                return
            exchange, key = sub.bind
            channel.queue_bind(sub.queue, exchange, routing_key=key, callback=start)

        kind = self._options.declare
        if sub.bind is not None or kind is not None:
            channel.queue_declare(
                sub.queue,
                durable=True,
                arguments={"x-queue-type": kind or "classic"},
                callback=bind,
            )
        else:
            start()

    def _message(
        self,
        generation: int,
        channel: Channel,
        method: Basic.Deliver,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        headers, key = _headers(properties.headers)
        message_id = properties.message_id or headers.get(MESSAGE_ID_HEADER)
        tag: int = method.delivery_tag
        destination = (
            method.routing_key if not method.exchange else f"{method.exchange}/{method.routing_key}"
        )
        delivery = Delivery(
            body=body,
            destination=destination,
            message_id=message_id,
            key=key,
            headers=headers,
            redelivered=bool(method.redelivered),
            settle=functools.partial(self._settle, generation, tag),
            attempt=quorum_attempt(properties.headers),
            lock=self._delivery_lock,
        )
        if generation == self._generation:
            self._outstanding.append(tag)
        self._deliveries.put((generation, delivery))

    def _settle(self, generation: int, tag: int, outcome: Outcome) -> None:
        with self._settles_lock:
            self._settles.append((generation, tag, outcome))
            if len(self._settles) > 1:
                return  # the I/O thread was woken by the first and has not run yet
        self._io.call(self._settle_io)

    def _settle_io(self) -> None:
        with self._settles_lock:
            settles, self._settles = self._settles, []
        channel = self._channel
        if channel is None or not channel.is_open:
            return  # NOTE: the broker requeued them with their channel; they come back
        acked: set[int] = set()
        for generation, tag, outcome in settles:
            if generation != self._generation:
                continue  # NOTE: requeued with its channel; it comes back redelivered
            if outcome is _ACCEPT:
                acked.add(tag)
            elif outcome is _REQUEUE or outcome is _RELEASE:
                channel.basic_nack(tag, requeue=True)
                self._acked_alone.add(tag)
            else:
                # NOTE: RabbitMQ dead-letters a rejected message when its queue has a DLX.
                channel.basic_reject(tag, requeue=False)
                self._acked_alone.add(tag)
        if acked:
            self._acknowledge(channel, acked)

    def _acknowledge(self, channel: Channel, acked: set[int]) -> None:
        """Acknowledge ``acked``: the settled prefix of the outstanding tags with one
        ``basic.ack`` (``multiple``), each tag beyond an unsettled one alone."""
        outstanding, alone = self._outstanding, self._acked_alone
        last = None
        while outstanding:
            head = outstanding[0]
            if head in acked:
                acked.discard(head)
                last = head
            elif head in alone:
                alone.discard(head)
            else:
                break
            outstanding.popleft()
        if last is not None:
            # NOTE: RabbitMQ refuses (closing the channel) a multiple ack whose own tag is
            # already settled; ``last`` is one of this burst's, never acknowledged before.
            channel.basic_ack(last, multiple=True)
        for tag in acked:
            channel.basic_ack(tag)
            alone.add(tag)

    def _cancelled(self, frame: Any) -> None:
        # NOTE: RabbitMQ cancels consumers when their queue is deleted or moves (classic
        # mirrored queue fail-over); subscribe again shortly on the same channel.
        tag = getattr(frame.method, "consumer_tag", None)
        channel = self._channel
        for sub in self._subs:
            if sub.consumer_tag == tag and channel is not None:
                sub.consumer_tag = None
                log.warning("consumer of %s cancelled by the broker; resubscribing", sub.queue)
                self._io.loop.call_later(
                    _RESUBSCRIBE_S, functools.partial(self._resubscribe, channel, sub)
                )

    def _resubscribe(self, channel: Channel, sub: _Subscription) -> None:
        if channel.is_open and sub.consumer_tag is None and channel is self._channel:
            self._consume(channel, sub)

    def _lost(self, _reason: BaseException | None) -> None:
        self._channel = None
        self._generation += 1

    def _channel_closed(self, code: int, text: str) -> None:
        self._channel = None
        self._generation += 1
        if code == 404:
            self._error = ConfigurationError(f"cannot consume: {code} {text}")

    def _fatal(self, error: MsgsafeError) -> None:
        if isinstance(error, AuthenticationError):
            self._error = error
