"""Bytes on the wire: the header names, the frames of ``basic.publish`` and writing them.

Header names: the id travels in the native ``message_id`` property and in the
``msgsafe-id`` header (:data:`~msgsafe.message.MESSAGE_ID_HEADER`), the key in
:data:`KEY_HEADER`; :func:`publish_properties` sets both, the receiver reads both.

Frames: pika builds every published message from objects (a ``Basic.Publish`` method, a
``BasicProperties``, three ``Frame`` objects) and marshals each field by field: about
20 µs of Python per message. The messages of a :class:`~msgsafe.message.Batch` differ
only in body, id and key, so :class:`FrameWriter` encodes the properties once per id
length and key (with pika's own encoder, from a template whose id is a sentinel), then
splices each message's id in; a single envelope's own text headers (a ``traceparent``)
go in front of the table's msgsafe entries (:func:`header_entries`). The bytes are the
ones ``Channel.basic_publish`` writes (``tests/unit/adapters/rabbitmq/test_frames.py`` compares).

Writing: :func:`pika_emit` finds the connection's raw write, :func:`write_frames` writes
encoded frames with one call (keeping pika's counters; on a plain TCP connection whose
send buffer is empty, straight to the socket), :func:`coalesce_frames` joins what pika
buffered. Reading: :func:`fast_confirms` hands a channel's ``basic.ack`` and
``basic.nack`` frames to the transport without pika's callback registry, and
:func:`read_once` has pika read a plain TCP socket once per readable event. These are the
one place that knows pika's internals (1.3/1.4); when they are not what is expected,
``pika_emit`` says so and messages go through ``basic_publish`` (and ``fast_confirms``
leaves confirms to pika's callbacks). Which messages are written when, and with which
delivery tags, is the confirm ledger's side
(:class:`~msgsafe.adapters.rabbitmq._confirms.FrameSender`).
"""

from __future__ import annotations

import base64
import collections
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pika
from pika import frame as pika_frame
from pika import spec
from pika.channel import Channel

from msgsafe.adapters.rabbitmq._connection import log
from msgsafe.adapters.rabbitmq._errors import describe
from msgsafe.adapters.rabbitmq.declarations import DECLARE_HEADER
from msgsafe.message import AMQP_PROPERTIES_HEADER, MESSAGE_ID_HEADER, Envelope

#: pika's plain TCP transport (1.3/1.4), whose socket write_frames may write itself.
_PlainTransport: Any
try:
    from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

    _PlainTransport = _AsyncPlaintextTransport
except ImportError:  # pragma: no cover - another pika layout: every write through pika
    _PlainTransport = None

__all__ = [
    "KEY_HEADER",
    "RESERVED_HEADERS",
    "FrameWriter",
    "carried_properties",
    "coalesce_frames",
    "envelope_properties",
    "fast_confirms",
    "header_entries",
    "pika_emit",
    "publish_properties",
    "read_once",
    "write_frames",
]

#: Header carrying the message key (bytes) next to ``msgsafe-id``.
KEY_HEADER = "msgsafe-key"

#: Frame type octet, channel, payload size; then the content header's class id, weight
#: and body size (AMQP 0-9-1 §4.2.3, §4.2.6.1).
_HEADER_START = struct.Struct(">BHIHHQ")
#: A long string's length (a header table entry's value).
_LONG_LENGTH = struct.Struct(">I")
#: Per header name, its table entry up to the value (short-string name, type ``S``):
#: every traced message carries ``traceparent``. At most _MAX_TEMPLATES names.
_NAME_ENTRIES: dict[str, bytes] = {}
#: The properties' flags (2 octets) before the headers table's length (4).
_TABLE_LENGTH = struct.Struct(">I")
_TABLE_AT = 2
#: The previous frame's end octet, then a body frame's type, channel and payload size.
_BODY_START = struct.Struct(">BBHI")
_FRAME_END = b"\xce"
_FRAME_METHOD = 1
_FRAME_HEADER = 2
_FRAME_BODY = 3
_FRAME_END_OCTET = 0xCE
_BASIC_CLASS = 60
#: Templates kept per writer (one per id length and key): keys beyond this are encoded
#: message by message.
_MAX_TEMPLATES = 4096


def publish_properties(
    message_id: str,
    headers: Mapping[str, str],
    id_header: str,
    key_header: str,
    key: bytes | None,
    created_at: float,
) -> pika.BasicProperties:
    """The properties every message is published with: persistent, the id in the native
    ``message_id`` and in the ``id_header``, the key (when there is one) in ``key_header``."""
    table: dict[str, object] = dict(headers)
    table[id_header] = message_id
    if key is not None:
        table[key_header] = key
    return pika.BasicProperties(
        delivery_mode=2,  # persistent
        message_id=message_id,
        headers=table,
        timestamp=int(created_at),
    )


def envelope_properties(envelope: Envelope) -> pika.BasicProperties:
    """:func:`publish_properties` of one envelope, with msgsafe's header names; an
    envelope carrying :data:`~msgsafe.message.AMQP_PROPERTIES_HEADER` is published with
    those properties instead (see :func:`carried_properties`). The declarations a message
    carries (:data:`~msgsafe.adapters.rabbitmq.declarations.DECLARE_HEADER`) are not published."""
    headers = envelope.headers
    if AMQP_PROPERTIES_HEADER in headers:
        return carried_properties(envelope)
    if DECLARE_HEADER in headers:
        headers = {k: v for k, v in headers.items() if k != DECLARE_HEADER}
    return publish_properties(
        envelope.message_id,
        headers,
        MESSAGE_ID_HEADER,
        KEY_HEADER,
        envelope.key,
        envelope.created_at,
    )


def carried_properties(envelope: Envelope) -> pika.BasicProperties:
    """The properties a pika publisher set (decoded from the envelope's
    ``AMQP_PROPERTIES_HEADER``) with msgsafe's own on top: persistent, the id in
    ``message_id``, the key, the other text headers; the send time as ``timestamp`` only
    where the publisher set none.

    No ``msgsafe-id`` header: receivers read the id from ``message_id`` first, and a
    consumer of the pika publisher sees the headers it was sent (``None`` when none)."""
    props = pika.BasicProperties()
    props.decode(base64.b64decode(envelope.headers[AMQP_PROPERTIES_HEADER]))
    table: dict[str, object] = dict(props.headers or {})
    for name, value in envelope.headers.items():
        if name != AMQP_PROPERTIES_HEADER and name != DECLARE_HEADER:
            table[name] = value
    if envelope.key is not None:
        table[KEY_HEADER] = envelope.key
    if table or props.headers is not None:
        props.headers = table
    props.delivery_mode = 2  # persistent
    props.message_id = envelope.message_id
    if props.timestamp is None:
        props.timestamp = int(envelope.created_at)
    return props


def header_entries(headers: Mapping[str, str], reserved: Sequence[str]) -> bytes | None:
    """The AMQP table entries of text ``headers`` as pika's ``encode_table`` writes them
    (short-string name, ``S`` and a long-string value, in order), or None when a name is
    longer than a short string or is one of ``reserved`` (msgsafe's own headers, whose
    place in the table the template fixes): such a message goes through pika."""
    out: list[bytes] = []
    pack = _LONG_LENGTH.pack
    for name, value in headers.items():
        if name in reserved:
            return None
        start = _NAME_ENTRIES.get(name)
        if start is None:
            raw_name = name.encode()
            if len(raw_name) > 255:
                return None
            start = bytes((len(raw_name),)) + raw_name + b"S"
            if len(_NAME_ENTRIES) < _MAX_TEMPLATES:
                _NAME_ENTRIES[name] = start
        raw = value.encode()
        out += (start, pack(len(raw)), raw)
    return b"".join(out)


class FrameWriter:
    """Encodes the frames of messages to one exchange and routing key on one channel.

    ``routing_key`` None means each message's key is its routing key (an exchange
    destination with an empty routing key).
    """

    __slots__ = (
        "_body_max",
        "_channel",
        "_created_at",
        "_cuts",
        "_exchange",
        "_headers",
        "_id_header",
        "_key_header",
        "_methods",
        "_routing_key",
        "_templates",
    )

    def __init__(
        self,
        *,
        channel_number: int,
        frame_max: int,
        exchange: str,
        routing_key: str | None,
        headers: Mapping[str, str],
        id_header: str,
        key_header: str,
        created_at: float,
    ) -> None:
        self._channel = channel_number
        # Frame header (7 octets) and frame end (1) around each body fragment.
        self._body_max = frame_max - 8
        self._exchange = exchange
        self._routing_key = routing_key
        self._headers = headers
        self._id_header = id_header
        self._key_header = key_header
        self._created_at = created_at
        self._methods: dict[str, bytes] = {}
        #: (id length, key) -> (properties split at the id, properties length)
        self._templates: dict[tuple[int, bytes | None], tuple[list[bytes], int]] = {}
        #: the same keys -> the template cut where a message's own header entries go
        self._cuts: dict[tuple[int, bytes | None], tuple[bytes, int, bytes, list[bytes], int]] = {}

    def _method(self, routing_key: str) -> bytes:
        data = self._methods.get(routing_key)
        if data is None:
            method = spec.Basic.Publish(
                exchange=self._exchange, routing_key=routing_key, mandatory=True
            )
            data = pika_frame.Method(self._channel, method).marshal()
            if len(self._methods) < _MAX_TEMPLATES:
                self._methods[routing_key] = data
        return data

    def _template(self, id_length: int, key: bytes | None) -> tuple[list[bytes], int]:
        found = self._templates.get((id_length, key))
        if found is not None:
            return found
        # A sentinel id of the same length: the encoding is the same up to the id.
        for filler in "\x01\x02\x03\x04":
            sentinel = filler * id_length
            props = publish_properties(
                sentinel, self._headers, self._id_header, self._key_header, key, self._created_at
            )
            encoded = b"".join(props.encode())
            pieces = encoded.split(sentinel.encode())
            if len(pieces) == 3:  # the native property and the header, nowhere else
                break
        else:  # pragma: no cover - every filler occurs in the headers
            raise ValueError("cannot build a properties template")
        template = (pieces, len(encoded))
        if len(self._templates) < _MAX_TEMPLATES:
            self._templates[(id_length, key)] = template
        return template

    def _spliced(
        self, id_length: int, key: bytes | None, entries: bytes
    ) -> tuple[list[bytes], int]:
        """:meth:`_template` with ``entries`` first in its headers table (cut once)."""
        cut = self._cuts.get((id_length, key))
        if cut is None:
            pieces, length = self._template(id_length, key)
            first = pieces[0]
            (table,) = _TABLE_LENGTH.unpack_from(first, _TABLE_AT)
            rest = first[_TABLE_AT + _TABLE_LENGTH.size :]
            cut = (first[:_TABLE_AT], table, rest, pieces[1:], length)
            if len(self._cuts) < _MAX_TEMPLATES:
                self._cuts[(id_length, key)] = cut
        flags, table, rest, tail, length = cut
        head = flags + _TABLE_LENGTH.pack(table + len(entries)) + entries + rest
        return [head, *tail], length + len(entries)

    def encode(
        self,
        bodies: Sequence[bytes],
        ids: Sequence[str],
        keys: Sequence[bytes | None] | None,
        indexes: Iterable[int],
    ) -> tuple[list[bytes], int]:
        """The frames of messages ``indexes`` (in that order) as buffers to join, and
        how many frames they are."""
        out: list[bytes] = []
        return out, self.encode_into(out, bodies, ids, keys, indexes)

    def encode_into(
        self,
        out: list[bytes],
        bodies: Sequence[bytes],
        ids: Sequence[str],
        keys: Sequence[bytes | None] | None,
        indexes: Iterable[int],
        entries: bytes = b"",
    ) -> int:
        """Append the frames of messages ``indexes`` to ``out``; return how many.

        ``entries`` (:func:`header_entries`) are headers of these messages beyond the
        writer's own, put first in each one's table."""
        extend = out.extend
        channel = self._channel
        body_max = self._body_max
        header_start = _HEADER_START.pack
        body_start = _BODY_START.pack
        end = _FRAME_END
        frames = 0
        fixed_route = self._routing_key
        method = self._method(fixed_route) if fixed_route is not None else b""
        last_length = -1
        pieces: list[bytes] = []
        props_length = 0
        for index in indexes:
            body = bodies[index]
            mid = ids[index].encode()
            key = None if keys is None else keys[index]
            if key is None:
                if len(mid) != last_length:
                    last_length = len(mid)
                    if entries:
                        template = self._spliced(last_length, None, entries)
                    else:
                        template = self._template(last_length, None)
                    pieces, props_length = template
                props = mid.join(pieces)
                length = props_length
            else:
                last_length = -1
                if entries:
                    template = self._spliced(len(mid), key, entries)
                else:
                    template = self._template(len(mid), key)
                key_pieces, length = template
                props = mid.join(key_pieces)
            if fixed_route is None:
                method = self._method(key.decode("utf-8", "replace") if key else "")
            size = len(body)
            head = header_start(_FRAME_HEADER, channel, 12 + length, _BASIC_CLASS, 0, size)
            if not size:
                extend((method, head, props, end))
                frames += 2
            elif size <= body_max:
                start = body_start(_FRAME_END_OCTET, _FRAME_BODY, channel, size)
                extend((method, head, props, start, body, end))
                frames += 3
            else:
                extend((method, head, props))
                frames += 2
                for offset in range(0, size, body_max):
                    fragment = body[offset : offset + body_max]
                    start = body_start(_FRAME_END_OCTET, _FRAME_BODY, channel, len(fragment))
                    extend((start, fragment))
                    frames += 1
                extend((end,))
        return frames


#: Headers a single envelope's own cannot be encoded around (see header_entries).
RESERVED_HEADERS = (MESSAGE_ID_HEADER, KEY_HEADER, AMQP_PROPERTIES_HEADER, DECLARE_HEADER)


def coalesce_frames(channel: Channel) -> None:
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


def pika_emit(conn: Any) -> Callable[[bytes], None] | None:
    """The connection's raw write (pika 1.3/1.4 internals), or None when they are not
    as expected: then every message goes through ``basic_publish``."""
    emit: Callable[[bytes], None] | None = getattr(conn, "_adapter_emit_data", None)
    if emit is None or not isinstance(getattr(conn, "frames_sent", None), int):
        return None
    return emit


def write_frames(conn: Any, emit: Callable[[bytes], None], data: bytes, frames: int) -> bool:
    """Write ``data`` (``frames`` frames) to the connection in one call; False when the
    connection is going down (its close callback resends what is in flight)."""
    try:
        # NOTE: what pika's Connection._output_marshaled_frames does per frame; the
        # heartbeat checker reads these counters.
        conn.bytes_sent += len(data)
        conn.frames_sent += frames
        rest = _send_now(conn, data)
        if rest:
            emit(rest)
    except Exception as exc:
        log.debug("write on a closing connection: %s", describe(exc))
        return False
    return True


def _send_now(conn: Any, data: bytes) -> bytes:
    """Write what the socket takes of ``data`` at once; return the rest, for pika's
    buffer (all of it when this cannot write: TLS, data already buffered, a closing
    transport, or any socket error, which pika's own write then meets and handles).

    NOTE: pika's plain transport only buffers a write and asks the I/O loop to watch
    the socket for writability: two ``epoll_ctl`` calls and one more turn of the loop
    for every flush, on the path of each blocking send. Sending first, as pika's own
    writable handler would one turn later, keeps the byte order (nothing is buffered
    ahead of it) and leaves pika the remainder of a partial write.
    """
    transport: Any = getattr(conn, "_transport", None)
    if (
        _PlainTransport is None
        or type(transport) is not _PlainTransport
        or transport._tx_buffers
        or transport._state != transport._STATE_ACTIVE
    ):
        return data
    try:
        sent = transport._sock.send(data)
    except OSError:  # EAGAIN included: pika's buffer and writability watcher take it all
        return data
    return data[sent:] if sent < len(data) else b""


#: What read_once has pika's plain transport read per readable event at most (pika's
#: own recv size is 4 KiB).
_READ_BYTES = 65536


def read_once(conn: Any) -> bool:
    """Have ``conn``'s plain TCP transport read its socket once per readable event (up
    to 64 KiB); False (nothing changed) for another transport or pika layout.

    NOTE: pika reads until ``recv`` raises ``EAGAIN`` (up to 100 KiB a turn, 4 KiB a
    call): for the one confirm a blocking send waits for, a second system call and an
    exception raised, caught and logged at DEBUG on the I/O thread. The loop's poll is
    level-triggered: what one read leaves in the socket makes it readable again at once,
    and the next turn reads it.
    """
    transport: Any = getattr(conn, "_transport", None)
    if (
        _PlainTransport is None
        or type(transport) is not _PlainTransport
        or not isinstance(getattr(transport, "_MAX_CONSUME_BYTES", None), int)
        or not isinstance(getattr(transport, "_MAX_RECV_BYTES", None), int)
    ):
        return False
    # Instance attributes over pika's class constants: _consume stops after the first
    # read (it returns once bytes_consumed reaches _MAX_CONSUME_BYTES).
    transport._MAX_RECV_BYTES = _READ_BYTES
    transport._MAX_CONSUME_BYTES = 1
    return True


#: A whole ``basic.ack`` / ``basic.nack`` frame: type, channel, size (13), method id,
#: delivery tag, flags (bit 0: multiple), frame end (AMQP 0-9-1 §4.2.3, §1.8.3.13).
_CONFIRM_FRAME = struct.Struct(">BHIIQBB")
_CONFIRM_SIZE = _CONFIRM_FRAME.size
_ACK_ID = (_BASIC_CLASS << 16) | 80
_NACK_ID = (_BASIC_CLASS << 16) | 120


def fast_confirms(channel: Channel, on_confirm: Callable[[int, bool, bool], None]) -> bool:
    """Hand ``channel``'s ``basic.ack`` and ``basic.nack`` to ``on_confirm(delivery_tag,
    multiple, nack)`` as soon as they are read, and everything else to pika; False
    (nothing changed) when pika's internals are not as expected (the confirms then reach
    the ``ack_nack_callback`` given to ``confirm_delivery``, through pika).

    NOTE: pika decodes every frame into objects and looks up its callbacks in its
    registry (several decorated calls): about half of the I/O thread's time per
    blocking send. A confirm is 21 bytes of fixed layout with exactly one callback, the
    transport's: whole confirm frames at the start of what was read are decoded here
    (pika's counters kept), the rest goes to pika, where a confirm frame among other
    frames still skips the registry. Frames of the channel reach ``on_confirm`` while
    pika would deliver them, i.e. until the channel is closed (its callbacks then go);
    a later call for a new channel of the same connection replaces this one.
    """
    conn = channel.connection
    process = getattr(type(conn), "_process_frame", None)
    receive = getattr(type(conn), "_on_data_available", None)
    if (
        not callable(process)
        or not callable(receive)
        or not isinstance(getattr(conn, "frames_received", None), int)
        or not isinstance(getattr(conn, "bytes_received", None), int)
        or not isinstance(getattr(conn, "_frame_buffer", None), bytes)
    ):
        return False
    number = channel.channel_number
    method_frame, ack, nack = pika_frame.Method, spec.Basic.Ack, spec.Basic.Nack
    unpack, size = _CONFIRM_FRAME.unpack_from, _CONFIRM_SIZE

    def process_frame(frame_value: Any) -> None:
        if (
            type(frame_value) is method_frame
            and frame_value.channel_number == number
            and not channel.is_closed
        ):
            method = frame_value.method
            kind = type(method)
            if kind is ack or kind is nack:
                conn.frames_received += 1  # as pika's _process_frame counts it
                on_confirm(method.delivery_tag, bool(method.multiple), kind is nack)
                return
        process(conn, frame_value)

    def data_available(data: bytes) -> None:
        at = 0
        if not conn._frame_buffer:  # no partial frame of pika's before this data
            end = len(data)
            while end - at >= size:
                kind, chan, length, method_id, tag, flags, frame_end = unpack(data, at)
                if (
                    kind != _FRAME_METHOD
                    or chan != number
                    or length != 13
                    or frame_end != _FRAME_END_OCTET
                    or (method_id != _ACK_ID and method_id != _NACK_ID)
                    or channel.is_closed
                ):
                    break
                at += size
                # As pika's _trim_frame_buffer and _process_frame count them.
                conn.bytes_received += size
                conn.frames_received += 1
                on_confirm(tag, bool(flags & 1), method_id == _NACK_ID)
            if at == end:
                return
        receive(conn, data[at:] if at else data)

    conn._process_frame = process_frame
    conn._on_data_available = data_available
    return True
