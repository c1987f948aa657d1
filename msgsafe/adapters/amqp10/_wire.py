"""Bytes on the wire: the message msgsafe sends, how it reads one back, the header names.

Sending: proton's ``Message`` builds a C message and four ``Data`` trees per send; for
the fixed shape msgsafe sends (durable header, message-id, application properties, one
data section) writing the sections by hand (:func:`encode_message`) is several times
cheaper and is what lets the adapter keep up with a raw proton sender. The layout
follows the AMQP 1.0 specification, part 3.2 (message format) and part 1.6 (primitive
type encodings); ``tests/integration/amqp10`` decodes the result with proton to prove
it. :func:`send_bytes` is the one hot call below proton's public API: ``Sender.delivery()``
wraps every new delivery in a Python object the adapter never uses (it matches outcomes
by tag); calling the three C functions directly saves that wrapper on every message.
When the binding changes shape, the public API is used.

Header names: the id travels as ``message-id`` and as the application property
``msgsafe-id`` (:data:`~msgsafe.message.MESSAGE_ID_HEADER`), the key (binary) as
:data:`KEY_HEADER`. :func:`read_message` takes them out of a received message.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from proton import Data
from proton.reactor import LinkOption

from msgsafe.message import MESSAGE_ID_HEADER, Envelope

__all__ = [
    "KEY_HEADER",
    "Capability",
    "encode_envelope",
    "encode_message",
    "read_message",
    "send_bytes",
]

#: Application property that carries the envelope's key.
KEY_HEADER = "msgsafe-key"

# Section descriptors: 0x00 (described), 0x53 (smallulong), the section code.
_HEADER_DURABLE = b"\x00\x53\x70" + b"\xc0\x02\x01\x41"  # header: list8 [durable=true]
_PROPERTIES = b"\x00\x53\x73"
_APPLICATION_PROPERTIES = b"\x00\x53\x74"
_DATA = b"\x00\x53\x75"
_U32 = struct.Struct(">I")


def _str(value: str) -> bytes:
    raw = value.encode()
    if len(raw) < 256:
        return b"\xa1" + bytes((len(raw),)) + raw
    return b"\xb1" + _U32.pack(len(raw)) + raw


def _binary(value: bytes) -> bytes:
    if len(value) < 256:
        return b"\xa0" + bytes((len(value),)) + value
    return b"\xb0" + _U32.pack(len(value)) + value


def _compound(small: int, large: int, count: int, items: bytes) -> bytes:
    # list8/map8 when size and count fit one byte (size counts the count byte itself).
    if len(items) + 1 < 256 and count < 256:
        return bytes((small, len(items) + 1, count)) + items
    return bytes((large,)) + _U32.pack(len(items) + 4) + _U32.pack(count) + items


def encode_message(
    message_id: str,
    body: bytes,
    properties: Mapping[str, str | bytes],
) -> bytes:
    """A durable AMQP 1.0 message: header, properties (message-id), application
    properties (str or binary values), and ``body`` as one data section."""
    props = _compound(0xC0, 0xD0, 1, _str(message_id))  # properties list: [message-id]
    entries = b"".join(
        _str(k) + (_str(v) if isinstance(v, str) else _binary(v)) for k, v in properties.items()
    )
    app = _compound(0xC1, 0xD1, 2 * len(properties), entries)
    return (
        _HEADER_DURABLE
        + _PROPERTIES
        + props
        + _APPLICATION_PROPERTIES
        + app
        + _DATA
        + _binary(body)
    )


def encode_envelope(envelope: Envelope) -> bytes:
    """``envelope`` as msgsafe sends it: its headers, the id and the key as application
    properties next to them."""
    properties: dict[str, str | bytes] = dict(envelope.headers)
    properties[MESSAGE_ID_HEADER] = envelope.message_id
    if envelope.key is not None:
        properties[KEY_HEADER] = envelope.key
    return encode_message(envelope.message_id, envelope.body, properties)


def read_message(message: Any) -> tuple[str | None, bytes | None, dict[str, str], bytes]:
    """``(message_id, key, headers, body)`` of a received proton ``Message``: the native
    id first, the ``msgsafe-id`` property when there is none; string properties other
    than msgsafe's own become the headers."""
    raw_properties: dict[Any, Any] = message.properties or {}
    properties: dict[str, object] = {str(k): v for k, v in raw_properties.items()}
    key_raw = properties.pop(KEY_HEADER, None)
    header_id = properties.pop(MESSAGE_ID_HEADER, None)
    native_id = message.id
    message_id = str(native_id) if native_id is not None else None
    if message_id is None and isinstance(header_id, str):
        message_id = header_id
    # NOTE: proton decodes AMQP binary as memoryview; the key goes out as binary.
    key: bytes | None = None
    if isinstance(key_raw, (bytes, bytearray, memoryview)):
        key = bytes(key_raw)
    elif isinstance(key_raw, str):
        key = key_raw.encode()
    headers = {str(k): v for k, v in properties.items() if isinstance(v, str)}
    return message_id, key, headers, _body_bytes(message.body)


def _body_bytes(body: object) -> bytes:
    # NOTE: proton decodes a data section as memoryview; other AMQP clients may send an
    # amqp-value string (JMS TextMessage) or none at all.
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    if body is None:
        return b""
    return str(body).encode()


try:  # python-qpid-proton >= 0.39 ships its C binding as the top-level module cproton
    from cproton import pn_delivery, pn_link_advance, pn_link_send  # type: ignore[import-untyped]

    def send_bytes(link: Any, tag: str, data: bytes) -> None:
        """Create delivery ``tag`` on ``link``, write ``data`` and complete it."""
        impl = link._impl
        pn_delivery(impl, tag)
        if pn_link_send(impl, data) < 0:
            link.stream(b"")  # let proton raise its own error for the link's state
        pn_link_advance(impl)

except ImportError:  # pragma: no cover - older or repackaged bindings

    def send_bytes(link: Any, tag: str, data: bytes) -> None:
        """Create delivery ``tag`` on ``link``, write ``data`` and complete it."""
        link.delivery(tag)
        link.stream(data)
        link.advance()


class Capability(LinkOption):
    """Puts one capability symbol on the terminus naming the address (sender: target;
    receiver: source), encoded as Qpid JMS does: an array of symbols."""

    def __init__(self, capability: str) -> None:
        self._capability = capability

    def apply(self, link: Any) -> None:
        terminus = link.target if link.is_sender else link.source
        data = terminus.capabilities
        data.put_array(False, Data.SYMBOL)
        data.enter()
        data.put_symbol(self._capability)
        data.exit()
