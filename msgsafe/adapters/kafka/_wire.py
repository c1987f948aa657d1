"""Record headers: how the message id travels in a Kafka record, and is read back.

A record's key and value are the envelope's key and body; the id travels in the
``msgsafe-id`` header (:data:`~msgsafe.message.MESSAGE_ID_HEADER`), first, followed by
the envelope's own headers. A user header of that name is dropped on the way out: the
id header is msgsafe's, and a second one would let a consumer read a different id than
the one the receipt names.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

from confluent_kafka import Message

from msgsafe.message import MESSAGE_ID_HEADER, RECORD_HEADERS_HEADER

__all__ = ["ID_HEADER", "RecordHeaders", "read_headers", "user_headers"]

#: The header that carries the message id.
ID_HEADER = MESSAGE_ID_HEADER

#: Headers as ``Producer.produce`` takes them.
RecordHeaders = list[tuple[str, str | bytes | None]]


def user_headers(headers: Mapping[str, str]) -> RecordHeaders:
    """``headers`` as record headers, without one named like the id header; the list a
    :data:`~msgsafe.message.RECORD_HEADERS_HEADER` holds is written out in its place."""
    if RECORD_HEADERS_HEADER not in headers:
        return [kv for kv in headers.items() if kv[0] != ID_HEADER]
    out: RecordHeaders = []
    for name, value in headers.items():
        if name == RECORD_HEADERS_HEADER:
            out.extend(
                (n, None if v is None else base64.b64decode(v))
                for n, v in json.loads(value)
                if n != ID_HEADER
            )
        elif name != ID_HEADER:
            out.append((name, value))
    return out


def read_headers(msg: Message) -> tuple[str | None, dict[str, str]]:
    """The message id (the first id header) and the other headers of a consumed record,
    decoded as UTF-8 (undecodable bytes replaced)."""
    raw_headers = msg.headers()
    if not raw_headers:
        return None, {}
    if type(raw_headers) is list and len(raw_headers) == 1:
        # The common record: msgsafe's id header alone.
        name, raw = raw_headers[0]
        if name == ID_HEADER and type(raw) is bytes:
            return raw.decode("utf-8", "replace"), {}
    message_id: str | None = None
    headers: dict[str, str] = {}
    items = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
    for name, raw in items:
        value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")
        if name == ID_HEADER:
            if message_id is None:
                message_id = value
            continue
        headers[name] = value
    return message_id, headers
