"""The publish path of :mod:`msgsafe.compat.aio_pika`: an aio-pika ``Message`` to a
msgsafe envelope, the deadline (confirmed, or stored, within ``timeout``), and a msgsafe
error to the exception aio-pika would raise.

Kept apart from the connection, channel and exchange classes: this file is the one
place that talks to msgsafe's :class:`~msgsafe.producer.Producer`; those classes only
decide what the caller sees.

The deadline, for one publish of ``timeout`` seconds:

1. the destination's check (a short blocking connection, once per destination) runs
   in a worker thread, never on the event loop;
2. the message goes to the producer (its own I/O thread, fail-over across the hosts,
   publisher confirms) and the publish waits for the broker's confirm until
   ``timeout`` less a reserve for the disk;
3. not confirmed by then (the broker hangs, a fail-over takes longer, the window is
   full): the envelope is written to the outbox (one fsync'd put in a worker thread)
   and the publish returns; the forwarder delivers it later. The producer may still
   get a confirm for its copy: the message then reaches the broker twice, with one
   ``message_id`` (the outbox keeps one row per id).

After such a miss, publishes go straight to the outbox for :data:`MISS_PAUSE_S`
(the broker just failed to answer in time: asking it again at once would only make
every publish wait the whole deadline).

The fast path. While the broker answers, a publish to a destination msgsafe's check
admitted goes out on the caller's own aio-pika channel (publisher confirms, on the event
loop, as aio-pika publishes), ``mandatory`` and persistent with the properties msgsafe's
RabbitMQ adapter would give it (the ``message_id`` that is msgsafe's id, the send time
as ``timestamp`` where none was set), and waits there for the broker's confirm until the
deadline less the reserve. An ack means the broker has the message: the promise holds
and nothing else is done. A return is the caller's, as in aio-pika (the channel's return
callbacks, or ``PublishError``). Anything else (a nack, the channel or connection lost,
a robust connection reconnecting) and the message takes msgsafe's path above with the
time left, and the fast path rests until msgsafe confirms a message again with its
outbox empty (:class:`~msgsafe.fastpath.FastPath`): an outage costs no wait per
publish on a dead channel, and no publish overtakes one the outbox holds. No confirm by
the deadline: the message is stored, as above. A message whose confirm was lost may
reach the broker twice, with one ``message_id``. :class:`Publisher` decides when a
publish takes the fast path and what the broker's answer means
(:meth:`Publisher.fast_deadline`, :meth:`Publisher.fast_answer`); the exchange
awaits the publish itself, so that a publish's every resume crosses one frame less.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import aiormq
    from aio_pika.abc import AbstractMessage
    from aiormq.abc import DeliveredMessage
    from pamqp import commands as spec
    from pamqp.header import ContentHeader
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "aio-pika") from exc

from msgsafe.adapters.rabbitmq.config import RabbitOptions
from msgsafe.compat._pika_config import destination_of
from msgsafe.errors import (
    AuthenticationError,
    MessageTooLarge,
    MsgsafeError,
    OutboxError,
    TransientError,
    Unroutable,
    UnsafeDestination,
)
from msgsafe.fastpath import FastPath
from msgsafe.message import (
    AMQP_PROPERTIES_HEADER,
    Envelope,
    Guarantee,
    Receipt,
    Status,
    new_message_id,
    new_receipt,
)
from msgsafe.producer import Producer

__all__ = [
    "DEFAULT_DEADLINE_S",
    "FAST_FAILURES",
    "MISS_PAUSE_S",
    "Deadlines",
    "Outgoing",
    "PublishAck",
    "Publisher",
    "envelope_of",
    "publish_error",
    "returned_message",
]

log = logging.getLogger("msgsafe.compat.aio_pika")

#: Seconds a publish with ``timeout=None`` may take (aio-pika's None waits for ever).
DEFAULT_DEADLINE_S = 10.0
#: Seconds after a missed deadline during which publishes go straight to the outbox.
MISS_PAUSE_S = 1.0
#: Share of the deadline kept for the outbox write, and its bounds in seconds.
_RESERVE_SHARE = 0.2
_RESERVE_MIN_S = 0.005
_RESERVE_MAX_S = 1.0
#: How long a destination check that could not reach the broker is trusted.
_CHECK_RETRY_S = 1.0
#: What a publish on the caller's channel may raise besides a return: a nack
#: (``DeliveryError``, an ``AMQPError``), a closed channel or connection, a robust one
#: reconnecting, a lost socket, no confirm by the deadline. msgsafe's path takes over.
FAST_FAILURES = (TimeoutError, aiormq.exceptions.AMQPError, ConnectionError, RuntimeError)
#: AMQP reply code RabbitMQ returns a mandatory message with when no queue is bound.
_NO_ROUTE = 312


class PublishAck(spec.Basic.Ack):
    """What ``Exchange.publish`` returns on a channel with publisher confirms: a
    ``Basic.Ack`` (as aio-pika's) carrying msgsafe's :class:`~msgsafe.Receipt`
    (``receipt.status``: confirmed by the broker, or stored in the outbox)."""

    def __init__(self, delivery_tag: int, receipt: Receipt) -> None:
        super().__init__(delivery_tag=delivery_tag)
        self.receipt = receipt


class _Watched:
    """One publish awaited on the caller's channel: its task and deadline (loop time)."""

    __slots__ = ("cancelling", "deadline", "fired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        #: The task's pending cancellations when the publish began (an outer one stays
        #: the caller's: see Deadlines.expired).
        self.cancelling = task.cancelling()
        self.fired = False


class Deadlines:
    """The deadlines of the publishes awaited on the caller's channel, kept by one timer.

    aiormq's own ``timeout`` arms a timer per publish (``asyncio.timeout``: a timer
    handle made, pushed on the loop's heap and cancelled; 2.6 µs a publish more than
    ``timeout=None``, measured here, about 2% of a windowed publish). Publishes that
    nearly all confirm long before their deadline need one timer, armed for the
    earliest deadline: when it fires, the tasks whose deadline passed are cancelled,
    and the timer is armed again for the earliest left. A task cancelled this way
    sees ``CancelledError`` inside the publish's await; :meth:`expired` says so, as
    ``asyncio.timeout`` turns its own cancellation into ``TimeoutError``.

    Used from one event loop. The timer fires at the earliest deadline or later,
    never earlier; each publish costs one small record.
    """

    def __init__(self) -> None:
        self._watched: set[_Watched] = set()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, deadline: float) -> _Watched:
        """Watch the current task until :meth:`done`; it is cancelled at ``deadline``
        (loop time) if it still awaits then."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - publish is a coroutine run by a task
            raise RuntimeError("a publish runs in a task")
        watched = _Watched(task, deadline)
        self._watched.add(watched)
        if self._timer is None or deadline < self._timer.when():
            self._arm(deadline)
        return watched

    def done(self, watched: _Watched) -> None:
        """The publish returned or raised: stop watching it."""
        self._watched.discard(watched)

    @staticmethod
    def expired(watched: _Watched) -> bool:
        """Whether the ``CancelledError`` the task sees is this deadline's (then the
        cancellation is taken back and the caller treats it as ``TimeoutError``) and
        not also a cancellation from outside, which must propagate."""
        return watched.fired and watched.task.uncancel() <= watched.cancelling

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        earliest: float | None = None
        for watched in list(self._watched):
            if watched.deadline <= now:
                self._watched.discard(watched)
                watched.fired = True
                watched.task.cancel()
            elif earliest is None or watched.deadline < earliest:
                earliest = watched.deadline
        if earliest is not None:
            self._arm(earliest)


def _no_floats(value: object, name: str) -> None:
    # NOTE: pika, which carries a message through msgsafe's RabbitMQ adapter and the
    # outbox, decodes AMQP floats as integers and cannot encode them: refused before
    # anything is sent, whether the broker is up or not.
    if isinstance(value, float):
        raise TypeError(
            f"header {name!r} is a float: msgsafe carries AMQP header values pika can "
            "encode; send it as str or Decimal"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            _no_floats(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _no_floats(item, name)


def envelope_of(exchange: str, routing_key: str, message: AbstractMessage) -> Envelope:
    """``message`` as msgsafe sends it: its AMQP properties encoded by aio-pika's own
    encoder (pamqp) and carried whole, its ``message_id`` (a new UUIDv7 when it has
    none) as msgsafe's id. Raises ``TypeError`` for a header value AMQP (or pika)
    cannot carry, as aio-pika raises for a value pamqp cannot encode."""
    return Outgoing(exchange, routing_key, message).envelope()


class Outgoing:
    """One publish as both paths take it: the message's properties with msgsafe's id
    (its ``message_id``, a new UUIDv7 when it has none), body, exchange, routing key and
    msgsafe destination. The envelope (the properties encoded by pamqp and carried
    whole) is made on first use: a publish the broker confirmed on the caller's channel
    never needs it. Raises ``TypeError`` for a header value AMQP (or pika) cannot
    carry, as aio-pika raises for a value pamqp cannot encode."""

    __slots__ = (
        "_envelope",
        "body",
        "destination",
        "exchange",
        "message_id",
        "properties",
        "routing_key",
    )

    def __init__(self, exchange: str, routing_key: str, message: AbstractMessage) -> None:
        props = message.properties
        for name, value in (props.headers or {}).items():
            _no_floats(value, name)
        if not props.message_id:
            props.message_id = new_message_id()
        body = message.body
        self.body = body if isinstance(body, bytes) else bytes(body)
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties: spec.Basic.Properties = props
        self.message_id: str = props.message_id
        self.destination = destination_of(exchange, routing_key)
        self._envelope: Envelope | None = None

    def envelope(self) -> Envelope:
        """The envelope msgsafe's producer and outbox take (made once)."""
        envelope = self._envelope
        if envelope is None:
            raw = self.properties.marshal()
            envelope = self._envelope = Envelope.build(
                self.destination,
                self.body,
                headers={AMQP_PROPERTIES_HEADER: base64.b64encode(raw).decode("ascii")},
                message_id=self.message_id,
            )
        return envelope


def returned_message(envelope: Envelope, exchange: str, routing_key: str) -> DeliveredMessage:
    """The ``DeliveredMessage`` aio-pika hands a return callback for a message the
    broker returned as unroutable (reply 312 ``NO_ROUTE``)."""
    raw = base64.b64decode(envelope.headers[AMQP_PROPERTIES_HEADER])
    props = spec.Basic.Properties()
    # marshal() wrote the 16-bit property flags, then the values they announce.
    props.unmarshal(int.from_bytes(raw[:2], "big"), raw[2:])
    header = ContentHeader(0, len(envelope.body), props)
    frame = spec.Basic.Return(
        reply_code=_NO_ROUTE, reply_text="NO_ROUTE", exchange=exchange, routing_key=routing_key
    )
    # No aiormq channel: the message came back through msgsafe's connection.
    return DeliveredMessage(
        delivery=frame,
        header=header,
        body=envelope.body,
        channel=None,  # type: ignore[arg-type]
    )


def publish_error(exc: BaseException, vhost: str = "/") -> Exception:
    """The aio-pika (aiormq) exception a publisher with confirms would see for a
    msgsafe error other than ``Unroutable`` with a route missing (see the channel):

    ``Unroutable`` for a missing exchange -> ``ChannelNotFoundEntity`` (404);
    ``MessageTooLarge`` -> ``ChannelPreconditionFailed`` (406);
    ``AuthenticationError`` -> ``ProbableAuthenticationError``; ``UnsafeDestination``
    stays msgsafe's (nothing in aio-pika says it); every other failure of the message
    (rejected, not stored because the outbox is off or full) -> ``DeliveryError``
    with a ``Basic.Nack`` frame.
    """
    if isinstance(exc, Unroutable) and "no such exchange" in str(exc):
        name = str(exc).rpartition("no such exchange: ")[2]
        return aiormq.exceptions.ChannelNotFoundEntity(
            f"NOT_FOUND - no exchange {name} in vhost '{vhost}'"
        )
    if isinstance(exc, MessageTooLarge):
        return aiormq.exceptions.ChannelPreconditionFailed(f"PRECONDITION_FAILED - {exc}")
    if isinstance(exc, AuthenticationError):
        return aiormq.exceptions.ProbableAuthenticationError(str(exc))
    if isinstance(exc, UnsafeDestination):
        return exc
    return aiormq.exceptions.DeliveryError(None, spec.Basic.Nack())


class Publisher:
    """One connection's way to msgsafe: the producer, the deadline, the window, and
    the fast path on the caller's own channel (see the module docstring).

    Used from one event loop; the producer's futures resolve on its I/O thread and
    wake the loop. ``window`` bounds the publishes waiting in the producer at once
    (the producer's own window is set larger, so that a publish never blocks the loop
    waiting for room there).
    """

    def __init__(self, producer: Producer, *, deadline: float, window: int) -> None:
        self.producer = producer
        #: The fast path's state: resting after a failure, messages confirmed on it.
        self.fast = FastPath(producer)
        #: The deadlines of publishes awaited on the caller's channel.
        self.deadlines = Deadlines()
        # A larger message takes msgsafe's path, which refuses it (MessageTooLarge)
        # whichever path it would have taken.
        self._fast_limit = RabbitOptions().size_limit
        self.deadline = deadline
        self._window = window
        self._room: asyncio.Semaphore | None = None
        self._admitted: set[str] = set()
        #: Destination -> (its check in a worker thread, when it started).
        self._checks: dict[str, tuple[asyncio.Future[Guarantee], float]] = {}
        self._missed_until = 0.0
        self._tags = itertools.count(1)
        self._stamp: tuple[int, datetime.datetime] = (0, datetime.datetime.now(datetime.UTC))

    def next_tag(self) -> int:
        """A delivery tag for the ack (per connection, counting from 1)."""
        return next(self._tags)

    def _deadlines(self, timeout: float | None, start: float) -> tuple[float, float, float]:
        """(limit, end, confirm_by) of a publish of ``timeout`` seconds (None: the
        connection's deadline) that started at ``start`` (loop time): it returns by
        ``end``, and waits for a confirm until ``confirm_by`` (the outbox's reserve
        kept)."""
        limit = self.deadline if timeout is None else float(timeout)
        end = start + limit
        if self.producer.outbox is None:
            return limit, end, end
        reserve = min(_RESERVE_MAX_S, max(_RESERVE_MIN_S, limit * _RESERVE_SHARE))
        return limit, end, end - reserve

    def fast_deadline(
        self, outgoing: Outgoing, timeout: float | None, channel: Any
    ) -> tuple[float, float] | None:
        """When ``outgoing`` may go out on the caller's ``channel`` (the fast path):
        (start, confirm_by) in loop time, with its properties made as msgsafe's adapter
        would publish them; None when it takes msgsafe's path (:meth:`publish`)."""
        if (
            self.fast.resting
            or outgoing.destination not in self._admitted
            or len(outgoing.body) > self._fast_limit
            or not channel.can_publish()
            or (self._missed_until and time.monotonic() < self._missed_until)
        ):
            return None
        start = asyncio.get_running_loop().time()
        props = outgoing.properties
        props.delivery_mode = 2  # persistent, as msgsafe's adapter publishes
        if props.timestamp is None:
            now = int(time.time())
            stamp = self._stamp
            if stamp[0] != now:  # one datetime a second, not one a message
                stamp = self._stamp = (now, datetime.datetime.fromtimestamp(now, tz=datetime.UTC))
            props.timestamp = stamp[1]
        return start, self._deadlines(timeout, start)[2]

    def fast_answer(self, outgoing: Outgoing, answer: Any) -> Receipt | DeliveredMessage | None:
        """What the broker's ``answer`` on the caller's channel means: a CONFIRMED
        receipt for an ack, the returned message for a return; None otherwise (the path
        rests; msgsafe's path takes the message)."""
        if isinstance(answer, spec.Basic.Ack):
            self.fast.confirmed()
            return new_receipt(outgoing.message_id, Status.CONFIRMED, outgoing.destination)
        if isinstance(answer, DeliveredMessage):
            return answer
        self.fast.failed()  # pragma: no cover - aiormq answers ack, nack or return
        return None

    def fast_failed(self, outgoing: Outgoing, exc: BaseException) -> None:
        """The publish on the caller's channel failed (a nack, the channel or connection
        lost, no confirm by the deadline): the fast path rests, msgsafe's path takes
        the message (:meth:`publish` with the publish's ``start``)."""
        self.fast.failed()
        log.debug("fast publish of %s not confirmed (%r)", outgoing.message_id, exc)

    async def publish(
        self, outgoing: Outgoing, timeout: float | None, start: float | None = None
    ) -> Receipt:
        """msgsafe's path: confirmed or stored within ``timeout`` (None: :attr:`deadline`)
        seconds from ``start`` (loop time; None: now; given after a failed fast
        publish, whose time counts).

        Raises the msgsafe error of a message that failed for good; ``TimeoutError``
        only when not even the outbox write finished in time (it may still finish).
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        limit, end, confirm_by = self._deadlines(timeout, now if start is None else start)
        outbox = self.producer.outbox
        if outbox is not None and start is not None and now >= confirm_by:
            # No confirm on the caller's channel by now: as a miss on msgsafe's path.
            self._missed_until = time.monotonic() + MISS_PAUSE_S
            return await self._store(outgoing.envelope(), end)
        if outbox is not None and time.monotonic() < self._missed_until:
            return await self._store(outgoing.envelope(), end)
        destination = outgoing.destination
        envelope = outgoing.envelope()
        if destination not in self._admitted and not await self._check(destination, confirm_by):
            if outbox is None:
                raise TimeoutError(f"destination {destination!r} not checked within {limit} s")
            return await self._store(envelope, end)
        if self._room is None:
            self._room = asyncio.Semaphore(self._window)
        room = self._room
        try:
            await asyncio.wait_for(room.acquire(), max(0.0, confirm_by - loop.time()))
        except TimeoutError:
            if outbox is None:
                raise
            return await self._store(envelope, end)
        try:
            future = self.producer.send_envelope(envelope)
        except BaseException:
            room.release()
            raise
        future.add_done_callback(lambda _f: _release(loop, room))
        waiting = asyncio.wrap_future(future)
        # Read here or never (after a missed deadline): not logged as never retrieved.
        waiting.add_done_callback(_observe)
        try:
            receipt = await asyncio.wait_for(
                asyncio.shield(waiting), max(0.0, confirm_by - loop.time())
            )
        except TimeoutError:
            if outbox is None:
                raise
        else:
            if self.fast.resting and receipt.status is Status.CONFIRMED:
                self.fast.confirmed_safe()
            return receipt
        self._missed_until = time.monotonic() + MISS_PAUSE_S
        log.debug("no confirm for %s in time: storing it", envelope.message_id)
        return await self._store(envelope, end)

    async def _check(self, destination: str, by: float) -> bool:
        """Whether ``destination`` passed msgsafe's check (run in a worker thread, one at
        a time per destination) before ``by``; raises ``UnsafeDestination``."""
        loop = asyncio.get_running_loop()
        entry = self._checks.get(destination)
        if (
            entry is not None
            and entry[0].done()
            and entry[0].exception() is not None
            and time.monotonic() - entry[1] >= _CHECK_RETRY_S
        ):
            entry = None  # a failed check is asked again after a while
        if entry is None:
            check = asyncio.ensure_future(asyncio.to_thread(self.producer.guarantee, destination))
            # The result is read here or never: a failure must not be logged as lost.
            check.add_done_callback(_observe)
            entry = (check, time.monotonic())
            self._checks[destination] = entry
        try:
            await asyncio.wait_for(asyncio.shield(entry[0]), max(0.0, by - loop.time()))
        except TimeoutError:
            return False
        except TransientError:
            return False
        self._admitted.add(destination)
        self._checks.pop(destination, None)
        return True

    async def park(self, envelope: Envelope) -> Receipt:
        """Keep a message the broker returned in the outbox (no deadline: the broker
        answered); without an outbox it is dropped, as the broker drops it."""
        outbox = self.producer.outbox
        if outbox is None:
            return new_receipt(envelope.message_id, Status.CONFIRMED, envelope.destination)
        await asyncio.to_thread(outbox.put, [envelope])
        log.warning(
            "unroutable message %s to %r (published without mandatory) kept in the outbox",
            envelope.message_id,
            envelope.destination,
        )
        return new_receipt(envelope.message_id, Status.STORED, envelope.destination)

    async def _store(self, envelope: Envelope, end: float) -> Receipt:
        outbox = self.producer.outbox
        if outbox is None:  # pragma: no cover - callers store only with an outbox
            raise OutboxError("no outbox")
        loop = asyncio.get_running_loop()
        put = asyncio.ensure_future(asyncio.to_thread(outbox.put, [envelope]))
        put.add_done_callback(_observe)
        await asyncio.wait_for(asyncio.shield(put), max(0.0, end - loop.time()))
        return new_receipt(envelope.message_id, Status.STORED, envelope.destination)

    def close(self, timeout: float) -> None:
        """Wait for the confirms in flight, let the outbox forward what it holds (up to
        ``timeout`` seconds each), then close the producer (blocking: run it in a
        worker thread)."""
        try:
            self.producer.flush(timeout)
            if self.producer.pending() > 0:
                self.producer.drain(timeout)
        except MsgsafeError as exc:
            log.debug("closing: %r", exc)
        finally:
            self.producer.close(timeout)


def _release(loop: asyncio.AbstractEventLoop, room: asyncio.Semaphore) -> None:
    # On msgsafe's I/O thread: the loop may have ended since (asyncio.run returned).
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(room.release)


def _observe(future: asyncio.Future[Any] | Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
