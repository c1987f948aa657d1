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

import binascii
import datetime
import decimal
import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

_blake2b = hashlib.blake2b

__all__ = ["ContentIds", "key_id", "to_uuid8", "to_uuid8_bytes", "to_uuid8_many"]

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
        import numpy  # noqa: F401
    except ImportError:  # pragma: no cover - numpy comes with PySpark's pandas
        return [to_uuid8(digest) for digest in digests]
    if not digests:
        return []
    joined = _uuid8_text(b"".join(digests)).decode()
    return [joined[i : i + 36] for i in range(0, len(joined), 36)]


def to_uuid8_bytes(joined: bytes) -> list[bytes]:
    """The UUIDv8 texts (ASCII bytes, as they travel in a header) of the 16-byte digests
    concatenated in ``joined``; needs numpy. One C loop makes the list (no per-id
    Python code), half the cost of :func:`to_uuid8_many`."""
    import numpy as np

    text = np.frombuffer(_uuid8_text(joined), dtype="S36")
    ids: list[bytes] = text.tolist()
    return ids


def _uuid8_text(joined: bytes) -> bytes:
    """The UUIDv8 texts of concatenated 16-byte digests, concatenated (36 bytes each)."""
    import numpy as np

    raw = np.frombuffer(joined, dtype=np.uint8).reshape(-1, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x80  # version 8
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # variant 10xx
    hexed = np.frombuffer(binascii.hexlify(raw.data), dtype=np.uint8).reshape(-1, 32)
    text = np.full((len(raw), 36), ord("-"), dtype=np.uint8)
    for start, stop, at in _UUID_GROUPS:
        text[:, at : at + stop - start] = hexed[:, start:stop]
    return text.tobytes()


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

    __slots__ = ("_hasher", "_more", "_prefix", "_seen")

    def __init__(self, destination: str, batch_id: int, partition: int) -> None:
        prefix = _prefix(destination, batch_id, b"C") + _field(str(partition).encode())
        # NOTE: a hasher that has already read the prefix, copied per row: the same bytes
        # are hashed (so the same ids), without building a hasher from keywords each time.
        self._hasher = _blake2b(prefix, digest_size=16)
        self._prefix = prefix
        #: The first 8 digest bytes (a little-endian int) of every content seen so far,
        #: and how many times each content seen more than once was seen. NOTE: a set
        #: for the common case (every row differs) is half the cost of a dict of counts.
        self._seen: set[int] = set()
        self._more: dict[int, int] = {}

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
        occurrence = self._occurrence(int.from_bytes(digest[:8], "little"))
        if occurrence:
            # NOTE: identical rows (a rate source never has them, user data may) get
            # distinct ids by their rank among equals; the rank is the same on replay.
            digest = _ranked_digest(digest, occurrence)
        return to_uuid8(digest)

    def column_ids(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None) -> list[str]:
        """The ids of consecutive rows without headers, equal to ``[next_id(v, k, {}) ...]``."""
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
        text = _uuid8_text(self._rank(digests)).decode()
        return [text[i : i + 36] for i in range(0, len(text), 36)]

    def arrow_ids(self, values: Any, keys: Any | None) -> list[bytes]:
        """The ids (ASCII bytes) of consecutive rows without headers from Arrow binary
        columns (``keys`` may hold nulls: no key), equal to ``next_id(v, k, {})`` per row.

        The Arrow path's hot loop, with no Python code per row: Arrow builds every row's
        hash input in one call, ``map`` hashes them, numpy formats the ids.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        binary = pa.binary()
        # One type for the join: strings and large (64-bit offset) columns as binary.
        values = values if values.type == binary else values.cast(binary)
        blank = pa.scalar(b"", binary)
        tail: Any = pa.scalar(b"N", binary)
        if keys is not None:
            keys = keys if keys.type == binary else keys.cast(binary)
            # A null key joins to null, which becomes the "no key" marker.
            tail = pc.fill_null(pc.binary_join_element_wise(_lengths(keys), keys, blank), b"N")
        prefix = pa.scalar(self._prefix, binary)
        data = pc.binary_join_element_wise(prefix, _lengths(values), values, tail, blank)
        digests = list(map(_DIGEST, map(_HASH16, data.to_pylist())))
        return to_uuid8_bytes(self._rank(digests))

    def _rank(self, digests: list[bytes]) -> bytes:
        """``digests`` concatenated, each repeat of a content rehashed by its rank (see
        :meth:`next_id`), counting the contents this instance has seen before."""
        import numpy as np

        joined = b"".join(digests)
        # The first 8 bytes of each digest as a little-endian int, as next_id keys them.
        slots: list[int] = np.frombuffer(joined, dtype="<u8")[::2].tolist()
        seen = self._seen
        fresh = set(slots)
        if len(fresh) == len(slots) and seen.isdisjoint(fresh):
            # The common case: no row repeats one before it, every rank is 0.
            seen |= fresh
            return joined
        for index, slot in enumerate(slots):
            occurrence = self._occurrence(slot)
            if occurrence:
                digests[index] = _ranked_digest(digests[index], occurrence)
        return b"".join(digests)

    def _occurrence(self, slot: int) -> int:
        """How many rows with this content came before (and count this one)."""
        if slot not in self._seen:
            self._seen.add(slot)
            return 0
        occurrence = self._more.get(slot, 1)
        self._more[slot] = occurrence + 1
        return occurrence


def _ranked_digest(digest: bytes, occurrence: int) -> bytes:
    return _blake2b(digest + occurrence.to_bytes(8, "big"), digest_size=16).digest()


#: ``blake2b(data, digest_size=16)`` and ``hasher.digest()`` as C-level callables, so
#: that ``map`` hashes a column with no Python code per row.
_HASH16 = functools.partial(_blake2b, digest_size=16)
_DIGEST = _blake2b.digest


def _lengths(column: Any) -> Any:
    """The 4-byte big-endian length of each value of a binary Arrow column, as binary."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(">u4")
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(4), len(column), [None, pa.py_buffer(sizes.tobytes())]
    )
    return fixed.cast(pa.binary())
