"""Deterministic message ids for rows of a Spark batch.

A replayed micro-batch (a task retried by Spark, a query restarted from its checkpoint)
must publish the same ids again so that consumers with ``dedup=`` drop the repeats. The
id is therefore a pure function of the batch and the row, never of time or chance:

- with ``id_cols``: ``(destination, batch id, the values of id_cols)`` — exact under any
  partitioning; rows with equal id columns are *the same message* and share one id;
- without: ``(destination, batch id, partition index, key, value, headers, occurrence)``
  where *occurrence* counts identical rows before this one in the same partition, so
  equal rows do not collapse into one id. Exact as long as a replay puts the same rows
  in the same partition (true for a micro-batch replayed from the same offsets and plan);
  the order of different rows inside a partition does not matter.

Ids are formatted as UUIDv8 (RFC 9562 §5.8, "custom"): 122 bits of a BLAKE2b digest.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
from collections.abc import Mapping, Sequence

_blake2b = hashlib.blake2b

__all__ = ["ContentIds", "key_id", "to_uuid8", "to_uuid8_many"]

_NAMESPACE = b"msgsafe.spark/1\x00"

#: The UUID variant digit for the 17th hex digit of a digest (RFC 9562: 10xx).
_VARIANT = {d: "89ab"[int(d, 16) & 0x3] for d in "0123456789abcdef"}


def to_uuid8(digest: bytes) -> str:
    """The first 16 bytes of ``digest`` as a UUIDv8 string."""
    # Formatting the hex directly is several times cheaper than uuid.UUID per row.
    h = digest[:16].hex()
    return f"{h[:8]}-{h[8:12]}-8{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def to_uuid8_many(digests: Sequence[bytes]) -> list[str]:
    """``[to_uuid8(d) for d in digests]`` for 16-byte digests, formatted in bulk with
    numpy when it is installed (a third of the cost per id)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with PySpark's pandas
        return [to_uuid8(digest) for digest in digests]
    if not digests:
        return []
    raw = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x80  # version 8
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # variant 10xx
    hexed = np.frombuffer(raw.tobytes().hex().encode(), dtype=np.uint8).reshape(-1, 32)
    text = np.full((len(digests), 36), ord("-"), dtype=np.uint8)
    for start, stop, at in _UUID_GROUPS:
        text[:, at : at + stop - start] = hexed[:, start:stop]
    joined = text.tobytes().decode()
    return [joined[i : i + 36] for i in range(0, len(joined), 36)]


#: (hex digits start, stop, position in the text) of the five groups of a UUID.
_UUID_GROUPS = ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24))


def _field(data: bytes) -> bytes:
    # Length-prefixed so that ("ab", "c") and ("a", "bc") never hash alike.
    return len(data).to_bytes(4, "big") + data


def _encode_value(value: object) -> bytes:
    """A canonical byte form of a Spark column value (typed, so 1 and "1" differ)."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"?1" if value else b"?0"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"b" + bytes(value)
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    if isinstance(value, int):
        return b"i" + str(value).encode()
    if isinstance(value, float):
        return b"f" + value.hex().encode()
    if isinstance(value, (decimal.Decimal, datetime.date, datetime.time, datetime.timedelta)):
        # datetime is a date subclass: isoformat carries the timezone offset when set.
        return b"t" + type(value).__name__.encode() + b":" + value.isoformat().encode()  # type: ignore[union-attr]
    if isinstance(value, Mapping):
        items = sorted((_encode_value(k), _encode_value(v)) for k, v in value.items())
        return b"m" + b"".join(_field(k) + _field(v) for k, v in items)
    if isinstance(value, (tuple, list)):
        # Row (a tuple) and arrays: ordered, so order is part of the identity.
        return b"l" + b"".join(_field(_encode_value(v)) for v in value)
    return b"r" + type(value).__name__.encode() + b":" + repr(value).encode()


def _prefix(destination: str, batch_id: int, kind: bytes) -> bytes:
    return _NAMESPACE + _field(destination.encode()) + _field(str(batch_id).encode()) + kind


def key_id(destination: str, batch_id: int, values: Sequence[object]) -> str:
    """The id of a row identified by its ``id_cols`` values."""
    data = _prefix(destination, batch_id, b"K") + b"".join(_field(_encode_value(v)) for v in values)
    return to_uuid8(hashlib.blake2b(data, digest_size=16).digest())


class ContentIds:
    """Ids from row content for one partition of one batch, counting identical rows.

    Not thread-safe: one instance per partition task.
    """

    __slots__ = ("_hasher", "_seen")

    def __init__(self, destination: str, batch_id: int, partition: int) -> None:
        prefix = _prefix(destination, batch_id, b"C") + _field(str(partition).encode())
        # NOTE: a hasher that has already read the prefix, copied per row: the same bytes
        # are hashed (so the same ids), without building a hasher from keywords each time.
        self._hasher = _blake2b(prefix, digest_size=16)
        #: first 8 digest bytes of a content -> how many times it was seen so far
        self._seen: dict[bytes, int] = {}

    def next_id(self, value: bytes, key: bytes | None, headers: Mapping[str, str]) -> str:
        """The id of the next row with this content."""
        data = len(value).to_bytes(4, "big") + value
        data += b"N" if key is None else len(key).to_bytes(4, "big") + key
        if headers:
            for name in sorted(headers):
                data += _field(name.encode()) + _field(headers[name].encode())
        hasher = self._hasher.copy()
        hasher.update(data)
        digest = hasher.digest()
        slot = digest[:8]
        occurrence = self._seen.get(slot, 0)
        self._seen[slot] = occurrence + 1
        if occurrence:
            # NOTE: identical rows (a rate source never has them, user data may) get
            # distinct ids by their rank among equals; the rank is the same on replay.
            digest = _blake2b(digest + occurrence.to_bytes(8, "big"), digest_size=16).digest()
        return to_uuid8(digest)

    def column_ids(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None) -> list[str]:
        """The ids of consecutive rows without headers, equal to ``[next_id(v, k, {}) ...]``
        (the Arrow path's hot loop: one hasher copy per row, formatting in bulk)."""
        copy = self._hasher.copy
        digests: list[bytes] = []
        append = digests.append
        for index, value in enumerate(values):
            key = None if keys is None else keys[index]
            hasher = copy()
            hasher.update(
                len(value).to_bytes(4, "big")
                + value
                + (b"N" if key is None else len(key).to_bytes(4, "big") + key)
            )
            append(hasher.digest())
        seen = self._seen
        slots = [digest[:8] for digest in digests]
        fresh = dict.fromkeys(slots, 1)
        if len(fresh) == len(slots) and seen.keys().isdisjoint(fresh):
            # The common case: no row repeats one before it, every rank is 0.
            seen.update(fresh)
        else:
            for index, slot in enumerate(slots):
                occurrence = seen.get(slot, 0)
                seen[slot] = occurrence + 1
                if occurrence:
                    digests[index] = _blake2b(
                        digests[index] + occurrence.to_bytes(8, "big"), digest_size=16
                    ).digest()
        return to_uuid8_many(digests)
