"""AMQP 0-9-1 frames of many ``basic.publish`` commands, written as one buffer.

pika builds every published message from objects (a ``Basic.Publish`` method, a
``BasicProperties``, three ``Frame`` objects) and marshals each field by field: about
20 µs of Python per message. The messages of a :class:`~msgsafe.message.Batch` differ
only in body, id and key, so :class:`FrameWriter` encodes the properties once per id
length and key (with pika's own encoder, from a template whose id is a sentinel), then
splices each message's id in. The bytes are the ones ``Channel.basic_publish`` would
write (``tests/unit/test_rabbitmq_frames.py`` compares them).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

import pika
from pika import frame as pika_frame
from pika import spec

__all__ = ["FrameWriter", "publish_properties"]

#: Frame type octet, channel, payload size; then the content header's class id, weight
#: and body size (AMQP 0-9-1 §4.2.3, §4.2.6.1).
_HEADER_START = struct.Struct(">BHIHHQ")
#: The previous frame's end octet, then a body frame's type, channel and payload size.
_BODY_START = struct.Struct(">BBHI")
_FRAME_END = b"\xce"
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


class FrameWriter:
    """Encodes the frames of messages to one exchange and routing key on one channel.

    ``routing_key`` None means each message's key is its routing key (an exchange
    destination with an empty routing key).
    """

    __slots__ = (
        "_body_max",
        "_channel",
        "_created_at",
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
    ) -> int:
        """Append the frames of messages ``indexes`` to ``out``; return how many."""
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
                    pieces, props_length = self._template(last_length, None)
                props = mid.join(pieces)
                length = props_length
            else:
                last_length = -1
                key_pieces, length = self._template(len(mid), key)
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
