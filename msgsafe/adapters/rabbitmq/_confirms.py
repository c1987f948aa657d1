"""Publisher confirms: every message from hand-over to outcome, by delivery tag.

Split from :class:`~msgsafe.adapters.rabbitmq.transport.RabbitTransport` because it is
the one part with rules of its own, all about delivery tags: RabbitMQ numbers the
messages of a channel 1, 2, 3... and answers with ``basic.ack`` / ``basic.nack`` for a
tag or (``multiple``) for every tag up to it, possibly out of order, and sends
``basic.return`` before the ack of a mandatory message it could not route.

Two parts: the :class:`ConfirmLedger` (what is pending and in flight, and settling) and
the :class:`FrameSender` (what moves messages from pending onto the channel, in order,
and tells the ledger which tags they went out with; the bytes themselves are
:mod:`~msgsafe.adapters.rabbitmq._wire`'s). The transport (the caller side and the
channel's life) and the sender only add to the ledger; the ledger alone settles: each
message exactly once, with the window given back as it goes.

Entries: an :class:`SendItem` is one envelope (``publish``, ``publish_callback``), a
:class:`BatchPart` is a run of messages of one batch handed over together. Both wait in
``pending`` (in hand-over order) until written, then are in flight: items keyed by
their tag, parts as a range of tags in ``spans``. When the channel goes, what is in
flight returns to the front of ``pending`` in tag order and is resent, same
``message_id``, on the next channel. Only the I/O thread touches a ledger.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pika.channel import Channel

from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged, report_confirmed, report_failed
from msgsafe.adapters.rabbitmq._connection import log
from msgsafe.adapters.rabbitmq._errors import describe
from msgsafe.adapters.rabbitmq._wire import (
    KEY_HEADER,
    RESERVED_HEADERS,
    FrameWriter,
    coalesce_frames,
    envelope_properties,
    header_entries,
    pika_emit,
    publish_properties,
    write_frames,
)
from msgsafe.adapters.rabbitmq.config import Destination
from msgsafe.errors import MessageTooLarge, MsgsafeError, Refused, Unroutable
from msgsafe.message import MESSAGE_ID_HEADER, Batch, Envelope
from msgsafe.ports import BatchReport, PublishCallback

__all__ = [
    "BatchJob",
    "BatchPart",
    "ConfirmLedger",
    "FrameSender",
    "ReturnClassifier",
    "SendItem",
    "fail_all",
    "unroutable",
]

#: Decides what a message the broker returned fails with: called with its destination,
#: headers, the endpoint and its id, it calls the last argument once with the error
#: (at once or later, on the I/O thread).
ReturnClassifier = Callable[
    [str, Mapping[str, str], str, str, Callable[[MsgsafeError], None]], None
]


@dataclass(slots=True, eq=False)
class SendItem:
    envelope: Envelope
    dest: Destination
    callback: PublishCallback
    deadline: float
    queued_at: float
    attempts: int = 0
    settled: bool = False


@dataclass(slots=True, eq=False)
class BatchJob:
    """A batch on its way: what its parts share."""

    batch: Batch
    dest: Destination
    report: BatchReport
    #: The frame encoder of the channel (number, frame_max) it was last written on.
    writer: FrameWriter | None = None
    writer_key: tuple[int, int] = (-1, -1)


@dataclass(slots=True, eq=False)
class BatchPart:
    """Messages ``indexes`` of a batch, handed over, sent and confirmed together.

    In flight, message ``indexes[k]`` has delivery tag ``first_tag + k``; ``indexes[:pos]``
    are settled, and so are the offsets in ``done`` (acks that came out of order).
    """

    job: BatchJob
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

    def rest(self, indexes: Sequence[int]) -> BatchPart:
        """A part of the same job and deadline for ``indexes`` (to send again)."""
        return BatchPart(self.job, indexes, self.deadline, self.attempts)


class ConfirmLedger:
    """What is pending and in flight on one transport, and how each message settles.

    ``settled(count)`` is called whenever ``count`` messages got their outcome (the
    transport gives their window slots back). ``classify`` decides what a returned
    message fails with (default: :func:`unroutable`, at once); until it answers, the
    message holds its window slot.
    """

    def __init__(
        self, settled: Callable[[int], None], classify: ReturnClassifier | None = None
    ) -> None:
        self._settled = settled
        self._classify = classify or _unroutable_at_once
        #: Handed over, not written yet (or to resend), in order.
        self.pending: collections.deque[SendItem | BatchPart] = collections.deque()
        #: Single envelopes written and not confirmed, by delivery tag.
        self.in_flight: collections.OrderedDict[int, SendItem] = collections.OrderedDict()
        #: Parts of batches in flight, in delivery-tag order.
        self.spans: collections.deque[BatchPart] = collections.deque()
        #: Ids of messages the broker returned (unroutable) and has yet to ack.
        self.returned: set[str] = set()
        #: The delivery tag the next message written on the channel gets.
        self.next_tag = 1

    def new_channel(self) -> None:
        """A fresh channel numbers its messages from 1 again."""
        self.next_tag = 1
        self.returned.clear()

    # --- written -------------------------------------------------------------------------

    def in_flight_item(self, item: SendItem) -> None:
        """``item`` was written with the next delivery tag."""
        item.attempts += 1
        self.in_flight[self.next_tag] = item
        self.next_tag += 1

    def in_flight_part(self, part: BatchPart, count: int) -> None:
        """The first ``count`` messages of ``part`` were written, with the next tags."""
        part.attempts += 1
        part.first_tag = self.next_tag
        part.pos = 0
        part.done = set()
        self.next_tag += count
        self.spans.append(part)

    # --- outcomes ------------------------------------------------------------------------

    def resolve(self, item: SendItem, error: MsgsafeError | None) -> None:
        """Give ``item`` its outcome, unless it has one already."""
        if item.settled:
            return  # already reported (e.g. timed out, then confirmed late)
        item.settled = True
        if error is not None and error.message_id is None:
            error.message_id = item.envelope.message_id
        call_logged(log, PUBLISH_CALLBACK, item.callback, error)
        self._settled(1)

    def fail(self, entry: SendItem | BatchPart, error: MsgsafeError) -> None:
        """Fail an item, or every unsettled message of a part, with copies of ``error``."""
        if isinstance(entry, BatchPart):
            self.fail_part(entry, entry.unsettled(), error)
        else:
            self.resolve(entry, error.with_id(entry.envelope.message_id))

    def fail_part(self, part: BatchPart, indexes: Sequence[int], error: MsgsafeError) -> None:
        fail_all(part.job.report, indexes, error, part.job.batch.message_ids)
        self._settled(len(indexes))

    def returned_message(self, message_id: str) -> None:
        # NOTE: RabbitMQ sends basic.return before the basic.ack of an unroutable
        # mandatory message, and acks it anyway: the ack must not count as a confirm.
        self.returned.add(message_id)

    def confirm(self, tag: int, multiple: bool, nack: bool, endpoint: str) -> bool:
        """Settle what a ``basic.ack`` / ``basic.nack`` for ``tag`` covers; True when
        something was nacked (the transport then recycles the channel)."""
        nacked = False
        if multiple:
            while self.in_flight:
                first = next(iter(self.in_flight))
                if first > tag:
                    break
                nacked |= self._confirmed(self.in_flight.popitem(last=False)[1], nack, endpoint)
            if self.spans:
                nacked |= self._confirm_parts_upto(tag, nack, endpoint)
        else:
            item = self.in_flight.pop(tag, None)
            if item is not None:
                nacked |= self._confirmed(item, nack, endpoint)
            elif self.spans:
                nacked |= self._confirm_part_tag(tag, nack, endpoint)
        return nacked

    def _confirm_parts_upto(self, tag: int, nack: bool, endpoint: str) -> bool:
        spans = self.spans
        nacked = False
        while spans:
            part = spans[0]
            start = part.pos
            if part.first_tag + start > tag:
                break
            stop = min(tag - part.first_tag + 1, len(part.indexes))
            nacked |= self._settle_range(part, start, stop, nack, endpoint)
            part.pos = stop
            _skip_done(part)
            if part.pos < len(part.indexes):
                break
            spans.popleft()
        return nacked

    def _confirm_part_tag(self, tag: int, nack: bool, endpoint: str) -> bool:
        for part in self.spans:
            offset = tag - part.first_tag
            if offset < 0:
                return False  # not in flight any more (e.g. timed out)
            if offset >= len(part.indexes):
                continue
            if offset < part.pos or offset in part.done:
                return False
            nacked = self._settle_range(part, offset, offset + 1, nack, endpoint)
            if offset == part.pos:
                part.pos += 1
                _skip_done(part)
            else:
                part.done.add(offset)
            if part.pos >= len(part.indexes):
                self.spans.remove(part)
            return nacked
        return False

    def _settle_range(
        self, part: BatchPart, start: int, stop: int, nack: bool, endpoint: str
    ) -> bool:
        """Report messages at offsets ``start`` to ``stop`` of ``part`` (those not settled
        already): confirmed, or failed when nacked or returned. True when nacked."""
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
            return False
        ids = job.batch.message_ids
        if nack:
            fail_all(job.report, settle, _nacked(endpoint), ids)
            self._settled(count)
            return True
        returned = self.returned
        gone = [i for i in settle if ids[i] in returned] if returned else []
        for index in gone:
            returned.discard(ids[index])
        if count > len(gone):
            report_confirmed(job.report, count - len(gone))
            self._settled(count - len(gone))
        batch = job.batch
        for index in gone:
            # Settled (its slot given back) once the classifier answered.
            self._classify(
                batch.destination,
                batch.headers,
                endpoint,
                ids[index],
                partial(self._returned_part, job.report, index),
            )
        return False

    def _returned_part(self, report: BatchReport, index: int, error: MsgsafeError) -> None:
        report_failed(report, index, error)
        self._settled(1)

    def _confirmed(self, item: SendItem, nack: bool, endpoint: str) -> bool:
        if nack:
            self.resolve(item, _nacked(endpoint))
            return True
        if self.returned:
            mid = item.envelope.message_id
            if mid in self.returned:
                self.returned.discard(mid)
                envelope = item.envelope
                self._classify(
                    envelope.destination,
                    envelope.headers,
                    endpoint,
                    mid,
                    partial(self.resolve, item),
                )
                return False
        self.resolve(item, None)
        return False

    # --- the channel went ----------------------------------------------------------------

    def requeue_in_flight(self) -> None:
        """Put everything in flight back at the front of ``pending``, in tag order."""
        entries: list[tuple[int, SendItem | BatchPart]] = []
        if self.in_flight:
            entries.extend(self.in_flight.items())
            self.in_flight.clear()
        for part in self.spans:
            rest = part.unsettled()
            if rest:
                entries.append((part.first_tag + part.pos, part.rest(rest)))
        self.spans.clear()
        if entries:
            entries.sort(key=lambda entry: entry[0])
            self.pending.extendleft(reversed([entry for _tag, entry in entries]))
        self.returned.clear()

    def fail_culprits(
        self, error: MsgsafeError | None, exchange: str | None, size: int | None
    ) -> None:
        """Fail the pending messages that made the broker close the channel (see
        :func:`~msgsafe.adapters.rabbitmq._errors.channel_close_error`)."""
        if error is None:
            return
        if exchange is not None:
            self.fail_where(error, exchange=exchange)
        elif size is not None:
            self.fail_where(error, min_size=size)
        elif isinstance(error, MessageTooLarge) and self.pending:
            # NOTE: a frame error names no message; the first resent one is the likeliest.
            first = self.pending.popleft()
            if isinstance(first, BatchPart):
                self.fail_part(first, first.indexes[:1], error)
                if len(first.indexes) > 1:
                    self.pending.appendleft(first.rest(first.indexes[1:]))
            else:
                self.fail(first, error)

    def fail_where(
        self,
        error: MsgsafeError,
        *,
        queue: str | None = None,
        exchange: str | None = None,
        min_size: int | None = None,
    ) -> None:
        """Fail the pending messages to ``queue`` / ``exchange`` / of at least ``min_size``
        body bytes (each criterion given must hold)."""
        keep: collections.deque[SendItem | BatchPart] = collections.deque()
        for entry in self.pending:
            dest = entry.job.dest if isinstance(entry, BatchPart) else entry.dest
            if (queue is not None and dest.queue != queue) or (
                exchange is not None and dest.exchange != exchange
            ):
                keep.append(entry)
            elif min_size is None:
                self.fail(entry, error)
            elif isinstance(entry, BatchPart):
                bodies = entry.job.batch.bodies
                big = [i for i in entry.indexes if len(bodies[i]) >= min_size]
                if big:
                    self.fail_part(entry, big, error)
                    small = [i for i in entry.indexes if len(bodies[i]) < min_size]
                    if small:
                        keep.append(entry.rest(small))
                else:
                    keep.append(entry)
            elif len(entry.envelope.body) >= min_size:
                self.fail(entry, error)
            else:
                keep.append(entry)
        self.pending = keep

    # --- deadlines -----------------------------------------------------------------------

    def expire_in_flight(self, now: float, error: MsgsafeError) -> None:
        """Fail what is in flight past its deadline with copies of ``error``."""
        if self.in_flight:
            expired = [tag for tag, it in self.in_flight.items() if now >= it.deadline]
            for tag in expired:
                self.fail(self.in_flight.pop(tag), error)
        if self.spans and any(now >= part.deadline for part in self.spans):
            late = [part for part in self.spans if now >= part.deadline]
            self.spans = collections.deque(part for part in self.spans if now < part.deadline)
            for part in late:
                self.fail_part(part, part.unsettled(), error)

    def expire_pending(
        self, now: float, everything: bool, error: Callable[[int], MsgsafeError]
    ) -> None:
        """Fail what waits past its deadline (``everything``: all of it) with
        ``error(attempts)``: what to say depends on whether a copy was ever sent."""
        keep: collections.deque[SendItem | BatchPart] = collections.deque()
        for entry in self.pending:
            if isinstance(entry, SendItem) and entry.settled:
                continue
            if now >= entry.deadline or everything:
                self.fail(entry, error(entry.attempts))
            else:
                keep.append(entry)
        self.pending = keep


def fail_all(
    report: BatchReport, indexes: Sequence[int], error: MsgsafeError, ids: Sequence[str]
) -> None:
    """Report each of ``indexes`` failed with its own copy of ``error``, naming its id."""
    for index in indexes:
        report_failed(report, index, error.with_id(ids[index]))


def _skip_done(part: BatchPart) -> None:
    """Move ``part.pos`` past offsets settled out of order."""
    done = part.done
    while done and part.pos in done:
        done.discard(part.pos)
        part.pos += 1


def _nacked(endpoint: str) -> Refused:
    return Refused("the broker nacked the message", endpoint=endpoint)


def unroutable(
    destination: str, endpoint: str, message_id: str | None = None, *, why: str = ""
) -> Unroutable:
    """The permanent error of a message no queue took: ``why`` says what the broker
    answered about the queue (default: nothing was asked)."""
    return Unroutable(
        f"{why or f'no queue bound for {destination!r}'} (basic.return): declare it, e.g. "
        f"Producer(url, declare='quorum'), or bind a queue to the exchange",
        endpoint=endpoint,
        message_id=message_id,
    )


def _unroutable_at_once(
    destination: str,
    _headers: Mapping[str, str],
    endpoint: str,
    message_id: str,
    settle: Callable[[MsgsafeError], None],
) -> None:
    settle(unroutable(destination, endpoint, message_id))


# --- the sender ------------------------------------------------------------------------

#: Destinations whose frame encoder for single envelopes is kept.
_MAX_ITEM_WRITERS = 256
#: The one message index of a single envelope, for FrameWriter.encode_into.
_FIRST = (0,)


class FrameSender:
    """Writes what ``ledger.pending`` holds onto a channel, in order, and puts it in flight.

    ``may_send(channel, dest, entry)`` is asked before each message: False (its queue is
    being declared) stops the flush there, so later messages wait too and per-key order
    holds; an error fails that message (its declarations failed) and the flush goes on.
    Only the I/O thread calls it.
    """

    def __init__(
        self,
        ledger: ConfirmLedger,
        may_send: Callable[[Channel, Destination, SendItem | BatchPart], bool | MsgsafeError],
    ) -> None:
        self._ledger = ledger
        self._may_send = may_send
        #: Frame encoders of single envelopes per destination (see _item_writer).
        self._item_writers: dict[str, tuple[tuple[int, int, int], FrameWriter]] = {}
        #: Frames appended to the buffer of the flush under way.
        self._out_frames = 0

    def flush(self, channel: Channel) -> None:
        """Send everything pending on ``channel`` (open, not blocked)."""
        conn = channel.connection
        emit = pika_emit(conn)
        if emit is not None and (not channel.is_open or not conn.is_open):
            return  # the close callback resends
        out: list[bytes] = []
        try:
            self._flush_pending(channel, emit, out)
        finally:
            if out and emit is not None:
                self._emit(conn, emit, out)
        coalesce_frames(channel)

    def _flush_pending(
        self, channel: Channel, emit: Callable[[bytes], None] | None, out: list[bytes]
    ) -> None:
        """Send what ``pending`` holds, in order: the frames of single envelopes are
        appended to ``out`` (the caller writes them), a part is written on its own."""
        publish = channel.basic_publish
        ledger = self._ledger
        pending = ledger.pending
        frame_max = int(channel.connection.params.frame_max)
        while pending:
            entry = pending[0]
            if isinstance(entry, BatchPart):
                dest = entry.job.dest
            else:
                if entry.settled:
                    pending.popleft()
                    continue
                dest = entry.dest
            verdict = self._may_send(channel, dest, entry)
            if isinstance(verdict, MsgsafeError):
                pending.popleft()
                ledger.fail(entry, verdict)
                continue
            if not verdict:
                return
            pending.popleft()
            if isinstance(entry, BatchPart):
                if out and emit is not None:
                    self._emit(channel.connection, emit, out)
                if not self._send_part(channel, entry, emit):
                    return
                continue
            item = entry
            envelope = item.envelope
            # The encoded headers (b"" for none), or None: through basic_publish (see
            # header_entries; no raw write when pika's internals are not as expected).
            headers = envelope.headers
            entries = (
                (header_entries(headers, RESERVED_HEADERS) if headers else b"") if emit else None
            )
            if entries is not None:
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
                    entries,
                )
            else:
                if out and emit is not None:
                    self._emit(channel.connection, emit, out)
                try:
                    publish(
                        dest.exchange,
                        dest.routing_key or _key_text(envelope.key),
                        envelope.body,
                        envelope_properties(envelope),
                        mandatory=True,
                    )
                except Exception as exc:
                    # The channel or connection is closing; its close callback resends.
                    log.debug("publish on a closing channel: %s", describe(exc))
                    pending.appendleft(item)
                    return
            ledger.in_flight_item(item)

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
        write_frames(conn, emit, data, frames)

    def _send_part(
        self, channel: Channel, part: BatchPart, emit: Callable[[bytes], None] | None
    ) -> bool:
        """Write the frames of every message of ``part`` with one call and put it in
        flight; False (``part`` back at the front of ``pending``) when the channel is
        closing: its close callback resends. ``emit`` None: pika's internals are not as
        expected (see :func:`~msgsafe.adapters.rabbitmq._wire.pika_emit`), so it goes
        through ``basic_publish``."""
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
            self._ledger.pending.appendleft(part)
            return False
        buffers, frames = writer.encode(batch.bodies, batch.message_ids, batch.keys, part.indexes)
        if not write_frames(conn, emit, b"".join(buffers), frames):
            self._ledger.pending.appendleft(part)
            return False
        self._ledger.in_flight_part(part, len(part.indexes))
        return True

    def _send_part_slowly(self, channel: Channel, part: BatchPart) -> bool:
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
            self._ledger.pending.appendleft(part.rest(part.indexes[sent:]))
            if sent:
                part.indexes = part.indexes[:sent]
                self._ledger.in_flight_part(part, sent)
            return False
        self._ledger.in_flight_part(part, sent)
        return True


def _key_text(key: bytes | None) -> str:
    """A key as a routing key (an exchange destination without one routes by key)."""
    return key.decode("utf-8", "replace") if key else ""
