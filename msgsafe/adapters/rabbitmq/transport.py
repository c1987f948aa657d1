"""Publishing: persistent, ``mandatory`` messages with pipelined publisher confirms.

Every envelope becomes an item with a callback (for ``publish``, its future) and a
deadline (call time + ``confirm_timeout``). Items wait in ``pending`` (in ``publish``
order) until the channel is ready, then go ``in_flight`` keyed by delivery tag until the
broker's ``basic.ack``
(success, or :class:`~msgsafe.errors.Unroutable` when a ``basic.return`` came first),
``basic.nack`` (:class:`~msgsafe.errors.Refused`) or the deadline
(:class:`~msgsafe.errors.ConfirmTimeout`). When the connection is lost, everything in
flight goes back to the front of ``pending`` and is resent, same ``message_id``, on the
next host. All of that state belongs to the I/O thread; callers only append to
``incoming`` and wait on futures or callbacks.

``publish_batch`` takes the window in parts (as much of the batch as the window has
room for) and hands each part over as one ``_Part``: its frames are encoded in one
buffer (``_frames.FrameWriter``) and written with one call; in flight it is one
``_Part`` with a range of delivery tags, and an ack (``multiple`` or not) settles a run
of its messages with one ``report.confirmed(k)``. Parts and items share ``pending``,
so the order of sends, requeues and fail-over resends is the same for both.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pika
from pika.channel import Channel
from pika.spec import Basic

from msgsafe.adapters._reports import call_logged, report_confirmed, report_failed
from msgsafe.adapters.rabbitmq._errors import channel_close_error, describe, lost_error
from msgsafe.adapters.rabbitmq._frames import FrameWriter, publish_properties
from msgsafe.adapters.rabbitmq._link import IoThread, Link, log
from msgsafe.adapters.rabbitmq.config import Destination, RabbitOptions, parse_destination
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
from msgsafe.message import MESSAGE_ID_HEADER, Batch, Envelope
from msgsafe.ports import BatchReport, PublishCallback, PublishFuture

__all__ = ["KEY_HEADER", "RabbitTransport"]

#: Header carrying the message key (bytes) next to ``msgsafe-id``.
KEY_HEADER = "msgsafe-key"

#: Bytes kept free in a frame for the content header's fixed fields.
_HEADER_FRAME_RESERVE = 512

_TICK_S = 0.1

#: Destinations whose frame encoder for single envelopes is kept.
_MAX_ITEM_WRITERS = 256
#: The one message index of a single envelope, for FrameWriter.encode_into.
_FIRST = (0,)

#: reply code of a channel this side closed on purpose
_REPLY_SUCCESS = 200


@dataclass(slots=True, eq=False)
class _Item:
    envelope: Envelope
    dest: Destination
    callback: PublishCallback
    deadline: float
    queued_at: float
    attempts: int = 0
    settled: bool = False


@dataclass(slots=True)
class _Declare:
    queue: str
    done: bool = False
    running: bool = False
    error: MsgsafeError | None = None


@dataclass(slots=True, eq=False)
class _Job:
    """A batch on its way: what its parts share."""

    batch: Batch
    dest: Destination
    report: BatchReport
    #: The frame encoder of the channel (number, frame_max) it was last written on.
    writer: FrameWriter | None = None
    writer_key: tuple[int, int] = (-1, -1)


@dataclass(slots=True, eq=False)
class _Part:
    """Messages ``indexes`` of a batch, handed over, sent and confirmed together.

    In flight, message ``indexes[k]`` has delivery tag ``first_tag + k``; ``indexes[:pos]``
    are settled, and so are the offsets in ``done`` (acks that came out of order).
    """

    job: _Job
    indexes: Sequence[int]
    deadline: float
    attempts: int = 0
    first_tag: int = 0
    pos: int = 0
    done: set[int] = field(default_factory=set)

    def unsettled(self) -> Sequence[int]:
        if not self.done:
            return self.indexes[self.pos :]
        return [self.indexes[k] for k in range(self.pos, len(self.indexes)) if k not in self.done]


def _properties(envelope: Envelope) -> pika.BasicProperties:
    return publish_properties(
        envelope.message_id,
        envelope.headers,
        MESSAGE_ID_HEADER,
        KEY_HEADER,
        envelope.key,
        envelope.created_at,
    )


class RabbitTransport:
    """A :class:`~msgsafe.ports.Transport` over pika's ``SelectConnection``; also a
    :class:`~msgsafe.ports.CallbackTransport` and a :class:`~msgsafe.ports.BatchTransport`.

    Contract, beyond the Protocol's: messages are persistent and ``mandatory``; the
    future resolves only on the broker's ``basic.ack`` with no ``basic.return`` before
    it. ``Unroutable`` and ``MessageTooLarge``, ``AuthenticationError`` and ``Rejected``
    are permanent; ``Refused`` (nack, blocked connection, full window), ``ConfirmTimeout``,
    ``ConnectionLost`` and ``ConnectError`` are transient. An envelope whose connection
    drops is resent on the next host with the same ``message_id`` while its deadline
    allows. With no host reachable for ``connect_timeout`` the waiting futures fail with
    ``ConnectError`` (or ``ConnectionLost`` when a copy was already sent). All of this
    holds per message for ``publish_callback`` and ``publish_batch``.
    """

    def __init__(self, url: BrokerUrl, options: RabbitOptions) -> None:
        if url.protocol != "rabbitmq":
            raise ConfigurationError(f"not an AMQP 0-9-1 URL: {url.scheme}://")
        self._url = url
        self._options = options
        self._target = url.redacted()
        self._destinations: dict[str, Destination] = {}
        # Caller side: the window and the hand-over queue.
        self._cond = threading.Condition()
        self._outstanding = 0
        self._waiters = 0
        self._low_water = options.max_in_flight // 2
        self._batching = False
        self._unreleased = 0
        self._closed = False
        self._incoming: collections.deque[_Item | _Part] = collections.deque()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        # I/O-thread side.
        self._pending: collections.deque[_Item | _Part] = collections.deque()
        self._in_flight: collections.OrderedDict[int, _Item] = collections.OrderedDict()
        #: Frame encoders of single envelopes per destination (see _item_writer).
        self._item_writers: dict[str, tuple[tuple[int, int, int], FrameWriter]] = {}
        #: Frames appended to the buffer of the flush under way.
        self._out_frames = 0
        #: Parts of batches in flight, in delivery-tag order.
        self._spans: collections.deque[_Part] = collections.deque()
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
        future = PublishFuture()
        # NOTE: a message on the wire cannot be taken back; the future is not cancellable.
        future.set_running_or_notify_cancel()
        self.publish_callback(envelope, future)
        return future

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        """Send ``envelope``; ``callback`` learns the outcome once (``None``: confirmed),
        on this thread for an error found before sending, else on the I/O thread.
        Everything else as :meth:`publish`."""
        mid = envelope.message_id
        try:
            dest = self._destination(envelope.destination)
        except ConfigurationError as exc:
            call_logged(callback, exc)
            return
        error = self._check_size(envelope)
        if error is not None:
            call_logged(callback, error)
            return
        now = time.monotonic()
        timeout = self._options.confirm_timeout
        with self._cond:
            if self._closed:
                error = ClosedError("transport is closed", endpoint=self._target)
            elif self._outstanding >= self._options.max_in_flight and not self._wait_for_room(
                timeout
            ):
                error = Refused(
                    f"{self._options.max_in_flight} messages in flight for {timeout} s",
                    endpoint=self._target,
                    message_id=mid,
                )
            elif self._closed:
                error = ClosedError("transport is closed", endpoint=self._target)
            else:
                self._outstanding += 1
        if error is not None:
            call_logged(callback, error)
            return
        self._incoming.append(_Item(envelope, dest, callback, now + timeout, now))
        self._wake()

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        """Send every message of ``batch``; ``report`` learns each outcome once.

        The batch goes through the window in parts: each takes the room there is (or,
        with the window full, waits at most ``confirm_timeout`` for half of it) and
        crosses to the I/O thread as one item. A message too large fails alone; when
        no room comes within ``confirm_timeout`` the rest fail with ``Refused``.
        """
        if not len(batch):
            return
        try:
            dest = self._destination(batch.destination)
        except ConfigurationError as exc:
            _fail_all(report, range(len(batch)), exc, batch.message_ids)
            return
        good = self._batch_sendable(batch, report)
        job = _Job(batch, dest, report)
        timeout = self._options.confirm_timeout
        window = self._options.max_in_flight
        total = len(good)
        sent = 0
        while sent < total:
            now = time.monotonic()
            with self._cond:
                want = min(total - sent, self._low_water or 1)
                if not self._closed and window - self._outstanding < want:
                    self._waiters += 1
                    try:
                        room = self._cond.wait_for(partial(self._has_room, want), timeout)
                    finally:
                        self._waiters -= 1
                    if not room:
                        rest = good[sent:]
                        _fail_all(
                            report,
                            rest,
                            Refused(
                                f"{window} messages in flight for {timeout} s",
                                endpoint=self._target,
                            ),
                            batch.message_ids,
                        )
                        return
                if self._closed:
                    _fail_all(
                        report,
                        good[sent:],
                        ClosedError("transport is closed", endpoint=self._target),
                        batch.message_ids,
                    )
                    return
                take = min(total - sent, window - self._outstanding)
                self._outstanding += take
            self._incoming.append(_Part(job, good[sent : sent + take], now + timeout))
            sent += take
            self._wake()

    def _has_room(self, want: int) -> bool:
        # Called with self._cond held.
        return self._options.max_in_flight - self._outstanding >= want or self._closed

    def _batch_sendable(self, batch: Batch, report: BatchReport) -> Sequence[int]:
        """Indexes of the messages of ``batch`` that may be sent; the others are reported
        failed with ``MessageTooLarge`` here."""
        count = len(batch)
        failed: dict[int, MsgsafeError] = dict(
            self._options.oversized(batch, endpoint=self._target)
        )
        ids, keys = batch.message_ids, batch.keys
        longest_key = 0 if keys is None else max(len(k or b"") for k in keys)
        most = _header_bytes(max(map(len, ids)), longest_key, batch.headers)
        if most > self._frame_max - _HEADER_FRAME_RESERVE:
            for index in range(count):
                key = None if keys is None else keys[index]
                error = self._frame_error(ids[index], key, batch.headers)
                if error is not None and index not in failed:
                    failed[index] = error
        if not failed:
            return range(count)
        for index in sorted(failed):
            report_failed(report, index, failed[index])
        return [index for index in range(count) if index not in failed]

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
        error = self._options.size_error(envelope, endpoint=self._target)
        if error is None:
            error = self._frame_error(envelope.message_id, envelope.key, envelope.headers)
        return error

    def _frame_error(
        self, message_id: str, key: bytes | None, headers: Mapping[str, str]
    ) -> MessageTooLarge | None:
        # NOTE: AMQP 0-9-1 carries all properties in one content-header frame; RabbitMQ
        # closes the whole connection (501 FRAME_ERROR) when it exceeds frame_max, which
        # would take every other message in flight down with it.
        header_bytes = _header_bytes(len(message_id), len(key or b""), headers)
        limit = self._frame_max - _HEADER_FRAME_RESERVE
        if header_bytes > limit:
            return MessageTooLarge(
                f"headers of about {header_bytes} bytes exceed the frame limit of {limit}",
                endpoint=self._target,
                message_id=message_id,
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
            entry = self._incoming.popleft()
            self._fail(entry, ClosedError("transport is closed", endpoint=self._target))

    # --- I/O thread -----------------------------------------------------------------------

    def _start(self) -> None:
        self._link.start()
        self._io.loop.call_later(_TICK_S, self._tick)

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        self._flush()

    def _resolve(self, item: _Item, error: MsgsafeError | None) -> None:
        if item.settled:
            return  # already reported (e.g. timed out, then confirmed late)
        item.settled = True
        if error is not None and error.message_id is None:
            error.message_id = item.envelope.message_id
        call_logged(item.callback, error)
        self._settled(1)

    def _fail(self, entry: _Item | _Part, error: MsgsafeError) -> None:
        """Fail an item, or every unsettled message of a part, with copies of ``error``."""
        if isinstance(entry, _Part):
            self._fail_part(entry, entry.unsettled(), error)
        else:
            self._resolve(entry, error.with_id(entry.envelope.message_id))

    def _fail_part(self, part: _Part, indexes: Sequence[int], error: MsgsafeError) -> None:
        _fail_all(part.job.report, indexes, error, part.job.batch.message_ids)
        self._settled(len(indexes))

    def _settled(self, count: int) -> None:
        if self._batching:
            self._unreleased += count
        else:
            self._release(count)

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
                    self._fail(self._pending.popleft(), self._fatal)
            return
        if self._blocked:
            return
        conn = channel.connection
        emit = _pika_emit(conn)
        if emit is not None and (not channel.is_open or not conn.is_open):
            return  # the close callback resends
        out: list[bytes] = []
        try:
            self._flush_pending(channel, emit, out)
        finally:
            if out and emit is not None:
                self._emit(conn, emit, out)
        _coalesce(channel)

    def _flush_pending(
        self, channel: Channel, emit: Callable[[bytes], None] | None, out: list[bytes]
    ) -> None:
        """Send what ``pending`` holds, in order: the frames of single envelopes are
        appended to ``out`` (the caller writes them), a part is written on its own."""
        publish = channel.basic_publish
        pending = self._pending
        frame_max = int(channel.connection.params.frame_max)
        while pending:
            entry = pending[0]
            if isinstance(entry, _Part):
                dest = entry.job.dest
            else:
                if entry.settled:
                    pending.popleft()
                    continue
                dest = entry.dest
            if self._options.declare is not None and dest.queue is not None:
                state = self._declares.get(dest.queue)
                if state is None or not state.done:
                    self._declare(channel, dest.queue)
                    return  # NOTE: later items wait too, so per-key order holds
            pending.popleft()
            if isinstance(entry, _Part):
                if out and emit is not None:
                    self._emit(channel.connection, emit, out)
                if not self._send_part(channel, entry, emit):
                    return
                continue
            item = entry
            envelope = item.envelope
            if emit is not None and not envelope.headers:
                writer = self._item_writer(
                    dest, envelope.destination, channel.channel_number, frame_max, envelope
                )
                key = envelope.key
                self._out_frames += writer.encode_into(
                    out,
                    (envelope.body,),
                    (envelope.message_id,),
                    None if key is None else (key,),
                    _FIRST,
                )
            else:
                if out and emit is not None:
                    self._emit(channel.connection, emit, out)
                try:
                    publish(
                        dest.exchange,
                        dest.routing_key or _key_text(envelope.key),
                        envelope.body,
                        _properties(envelope),
                        mandatory=True,
                    )
                except Exception as exc:
                    # The channel or connection is closing; its close callback resends.
                    log.debug("publish on a closing channel: %s", describe(exc))
                    pending.appendleft(item)
                    return
            item.attempts += 1
            self._in_flight[self._next_tag] = item
            self._next_tag += 1

    def _item_writer(
        self, dest: Destination, name: str, number: int, frame_max: int, envelope: Envelope
    ) -> FrameWriter:
        """The frame encoder for single envelopes to ``name`` created in the same second
        (the ``timestamp`` property) on this channel."""
        second = int(envelope.created_at)
        cache_key = (number, frame_max, second)
        cached = self._item_writers.get(name)
        if cached is not None and cached[0] == cache_key:
            return cached[1]
        writer = FrameWriter(
            channel_number=number,
            frame_max=frame_max,
            exchange=dest.exchange,
            routing_key=dest.routing_key or None,
            headers={},
            id_header=MESSAGE_ID_HEADER,
            key_header=KEY_HEADER,
            created_at=second,
        )
        if len(self._item_writers) >= _MAX_ITEM_WRITERS:
            self._item_writers.clear()
        self._item_writers[name] = (cache_key, writer)
        return writer

    def _emit(self, conn: Any, emit: Callable[[bytes], None], out: list[bytes]) -> None:
        """Write the frames in ``out`` with one call. On failure the connection is going
        down; its close callback resends what is in flight."""
        data = b"".join(out)
        out.clear()
        frames, self._out_frames = self._out_frames, 0
        _write(conn, emit, data, frames)

    def _send_part(
        self, channel: Channel, part: _Part, emit: Callable[[bytes], None] | None
    ) -> bool:
        """Write the frames of every message of ``part`` with one call and put it in
        flight; False (``part`` back at the front of ``pending``) when the channel is
        closing: its close callback resends. ``emit`` None: pika's internals are not as
        expected (see ``_flush``), so it goes through ``basic_publish``."""
        conn = channel.connection
        if emit is None:
            return self._send_part_slowly(channel, part)
        job = part.job
        batch = job.batch
        frame_max = int(conn.params.frame_max)
        writer_key = (channel.channel_number, frame_max)
        writer = job.writer if job.writer_key == writer_key else None
        if writer is None:
            dest = job.dest
            writer = job.writer = FrameWriter(
                channel_number=channel.channel_number,
                frame_max=frame_max,
                exchange=dest.exchange,
                routing_key=dest.routing_key or None,
                headers=batch.headers,
                id_header=MESSAGE_ID_HEADER,
                key_header=KEY_HEADER,
                created_at=batch.created_at,
            )
            job.writer_key = writer_key
        if not channel.is_open or not conn.is_open:
            self._pending.appendleft(part)
            return False
        buffers, frames = writer.encode(batch.bodies, batch.message_ids, batch.keys, part.indexes)
        if not _write(conn, emit, b"".join(buffers), frames):
            self._pending.appendleft(part)
            return False
        self._in_flight_part(part, len(part.indexes))
        return True

    def _send_part_slowly(self, channel: Channel, part: _Part) -> bool:
        """``_send_part`` through ``basic_publish`` (pika internals not as expected)."""
        job = part.job
        batch, dest = job.batch, job.dest
        sent = 0
        try:
            for index in part.indexes:
                key = batch.key(index)
                mid = batch.message_ids[index]
                channel.basic_publish(
                    dest.exchange,
                    dest.routing_key or _key_text(key),
                    batch.bodies[index],
                    publish_properties(
                        mid, batch.headers, MESSAGE_ID_HEADER, KEY_HEADER, key, batch.created_at
                    ),
                    mandatory=True,
                )
                sent += 1
        except Exception as exc:
            log.debug("publish on a closing channel: %s", describe(exc))
            rest = _Part(job, part.indexes[sent:], part.deadline, part.attempts)
            self._pending.appendleft(rest)
            if sent:
                part.indexes = part.indexes[:sent]
                self._in_flight_part(part, sent)
            return False
        self._in_flight_part(part, sent)
        return True

    def _in_flight_part(self, part: _Part, count: int) -> None:
        part.attempts += 1
        part.first_tag = self._next_tag
        part.pos = 0
        part.done = set()
        self._next_tag += count
        self._spans.append(part)

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
            if self._spans:
                self._confirm_parts_upto(tag, nack)
        else:
            item = self._in_flight.pop(tag, None)
            if item is not None:
                self._confirmed(item, nack)
            elif self._spans:
                self._confirm_part_tag(tag, nack)
        if self._pending or self._incoming:
            self._flush()

    def _confirm_parts_upto(self, tag: int, nack: bool) -> None:
        spans = self._spans
        while spans:
            part = spans[0]
            start = part.pos
            if part.first_tag + start > tag:
                return
            stop = min(tag - part.first_tag + 1, len(part.indexes))
            self._settle_range(part, start, stop, nack)
            part.pos = stop
            _skip_done(part)
            if part.pos < len(part.indexes):
                return
            spans.popleft()

    def _confirm_part_tag(self, tag: int, nack: bool) -> None:
        for part in self._spans:
            offset = tag - part.first_tag
            if offset < 0:
                return  # not in flight any more (e.g. timed out)
            if offset >= len(part.indexes):
                continue
            if offset < part.pos or offset in part.done:
                return
            self._settle_range(part, offset, offset + 1, nack)
            if offset == part.pos:
                part.pos += 1
                _skip_done(part)
            else:
                part.done.add(offset)
            if part.pos >= len(part.indexes):
                self._spans.remove(part)
            return

    def _settle_range(self, part: _Part, start: int, stop: int, nack: bool) -> None:
        """Report messages at offsets ``start`` to ``stop`` of ``part`` (those not settled
        already): confirmed, or failed when nacked or returned."""
        job = part.job
        indexes = part.indexes
        done = part.done
        settle: Sequence[int]
        if done:
            settle = [indexes[k] for k in range(start, stop) if k not in done]
            done.difference_update(range(start, stop))
        else:
            settle = indexes[start:stop]
        count = len(settle)
        if not count:
            return
        endpoint = self._link.endpoint
        ids = job.batch.message_ids
        if nack:
            _fail_all(
                job.report, settle, Refused("the broker nacked the message", endpoint=endpoint), ids
            )
            self._settled(count)
            self._recycle_channel()
            return
        returned = self._returned
        unroutable = [i for i in settle if ids[i] in returned] if returned else []
        for index in unroutable:
            returned.discard(ids[index])
            report_failed(
                job.report,
                index,
                Unroutable(
                    f"no queue bound for {job.batch.destination!r} (basic.return)",
                    endpoint=endpoint,
                    message_id=ids[index],
                ),
            )
        if count > len(unroutable):
            report_confirmed(job.report, count - len(unroutable))
        self._settled(count)

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
        entries: list[tuple[int, _Item | _Part]] = []
        if self._in_flight:
            entries.extend(self._in_flight.items())
            self._in_flight.clear()
        for part in self._spans:
            rest = part.unsettled()
            if rest:
                resend = _Part(part.job, rest, part.deadline, part.attempts)
                entries.append((part.first_tag + part.pos, resend))
        self._spans.clear()
        if entries:
            entries.sort(key=lambda entry: entry[0])
            self._pending.extendleft(reversed([entry for _tag, entry in entries]))
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
                self._fail_where(state.error, queue=state.queue)
                self._declares.pop(state.queue, None)
                return
        self._fail_culprits(error, exchange, size)

    def _fail_culprits(
        self, error: MsgsafeError | None, exchange: str | None, size: int | None
    ) -> None:
        if error is None:
            return
        if exchange is not None:
            self._fail_where(error, exchange=exchange)
        elif size is not None:
            self._fail_where(error, min_size=size)
        elif isinstance(error, MessageTooLarge) and self._pending:
            # NOTE: a frame error names no message; the first resent one is the likeliest.
            first = self._pending.popleft()
            if isinstance(first, _Part):
                self._fail_part(first, first.indexes[:1], error)
                if len(first.indexes) > 1:
                    rest = _Part(first.job, first.indexes[1:], first.deadline, first.attempts)
                    self._pending.appendleft(rest)
            else:
                self._fail(first, error)

    def _fail_where(
        self,
        error: MsgsafeError,
        *,
        queue: str | None = None,
        exchange: str | None = None,
        min_size: int | None = None,
    ) -> None:
        """Fail the pending messages to ``queue`` / ``exchange`` / of at least ``min_size``
        body bytes (each criterion given must hold)."""
        keep: collections.deque[_Item | _Part] = collections.deque()
        for entry in self._pending:
            dest = entry.job.dest if isinstance(entry, _Part) else entry.dest
            if (queue is not None and dest.queue != queue) or (
                exchange is not None and dest.exchange != exchange
            ):
                keep.append(entry)
            elif min_size is None:
                self._fail(entry, error)
            elif isinstance(entry, _Part):
                bodies = entry.job.batch.bodies
                big = [i for i in entry.indexes if len(bodies[i]) >= min_size]
                if big:
                    self._fail_part(entry, big, error)
                    small = [i for i in entry.indexes if len(bodies[i]) < min_size]
                    if small:
                        keep.append(_Part(entry.job, small, entry.deadline, entry.attempts))
                else:
                    keep.append(entry)
            elif len(entry.envelope.body) >= min_size:
                self._fail(entry, error)
            else:
                keep.append(entry)
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
        timeout = self._options.confirm_timeout
        if self._in_flight:
            expired = [tag for tag, it in self._in_flight.items() if now >= it.deadline]
            for tag in expired:
                item = self._in_flight.pop(tag)
                self._resolve(
                    item, ConfirmTimeout(f"no confirm within {timeout} s", endpoint=endpoint)
                )
        if self._spans and any(now >= part.deadline for part in self._spans):
            late = [part for part in self._spans if now >= part.deadline]
            self._spans = collections.deque(part for part in self._spans if now < part.deadline)
            for part in late:
                error = ConfirmTimeout(f"no confirm within {timeout} s", endpoint=endpoint)
                self._fail_part(part, part.unsettled(), error)
        while self._incoming:
            self._pending.append(self._incoming.popleft())
        if self._pending:
            down = self._down_since
            connect_limit = self._options.connect_timeout
            # NOTE: once no host answered for connect_timeout, new envelopes fail at
            # the next tick instead of waiting again: the outbox is the faster home.
            unreachable = self._channel is None and down is not None and now - down >= connect_limit
            keep: collections.deque[_Item | _Part] = collections.deque()
            for entry in self._pending:
                if isinstance(entry, _Item) and entry.settled:
                    continue
                if now >= entry.deadline or unreachable:
                    self._fail(entry, self._waiting_error(entry.attempts, unreachable, endpoint))
                else:
                    keep.append(entry)
            self._pending = keep
        self._io.loop.call_later(_TICK_S, self._tick)
        if self._pending and self._channel is not None:
            self._flush()

    def _waiting_error(self, attempts: int, unreachable: bool, endpoint: str) -> MsgsafeError:
        if self._fatal is not None:
            return self._fatal
        if attempts:
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
        for entry in list(self._pending):
            # NOTE: transient on purpose, also for never-sent envelopes: the layer above
            # stores them in the outbox instead of handing them back to the caller.
            self._fail(entry, lost_error(None, self._link.endpoint))
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


def _pika_emit(conn: Any) -> Callable[[bytes], None] | None:
    """The connection's raw write (pika 1.3/1.4 internals), or None when they are not
    as expected: then every message goes through ``basic_publish``."""
    emit: Callable[[bytes], None] | None = getattr(conn, "_adapter_emit_data", None)
    if emit is None or not isinstance(getattr(conn, "frames_sent", None), int):
        return None
    return emit


def _write(conn: Any, emit: Callable[[bytes], None], data: bytes, frames: int) -> bool:
    """Write ``data`` (``frames`` frames) to the connection in one call; False when the
    connection is going down (its close callback resends what is in flight)."""
    try:
        # NOTE: what pika's Connection._output_marshaled_frames does per frame; the
        # heartbeat checker reads these counters.
        conn.bytes_sent += len(data)
        conn.frames_sent += frames
        emit(data)
    except Exception as exc:
        log.debug("write on a closing connection: %s", describe(exc))
        return False
    return True


def _skip_done(part: _Part) -> None:
    """Move ``part.pos`` past offsets settled out of order."""
    done = part.done
    while done and part.pos in done:
        done.discard(part.pos)
        part.pos += 1


def _fail_all(
    report: BatchReport, indexes: Sequence[int], error: MsgsafeError, ids: Sequence[str]
) -> None:
    """Report each of ``indexes`` failed with its own copy of ``error``, naming its id."""
    for index in indexes:
        report_failed(report, index, error.with_id(ids[index]))


def _header_bytes(id_length: int, key_length: int, headers: Mapping[str, str]) -> int:
    """About the size of a message's content-header frame: the id twice (property and
    header), the key, the user headers and the fixed fields."""
    size = 2 * id_length + key_length + 64
    if headers:
        size += sum(len(k) + len(v) + 8 for k, v in headers.items())
    return size


def _key_text(key: bytes | None) -> str:
    return key.decode("utf-8", "replace") if key else ""
