"""Envelope <-> row conversion shared by the SQLite and PostgreSQL stores, the entries
the stores list for the CLI, and the SQLite store's multi-row insert.

A tombstone (an envelope with a null value, Kafka only) is marked in its row's
``headers`` column, which then holds the JSON array ``["tombstone", {headers}]`` instead
of the object ``{headers}``: no header name can be mistaken for the mark, the ``body``
column stays ``b""`` (NOT NULL, as in every outbox file written before), and rows written
before the mark existed read as they always did.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter, itemgetter
from types import MappingProxyType
from typing import Any, overload

from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, MessageIdReused
from msgsafe.message import Batch, Envelope, new_envelope
from msgsafe.outbox._blocks import pack, plan

__all__ = [
    "COLUMNS",
    "COLUMNS_AT",
    "ClaimedRows",
    "INSERT",
    "INSERT_AT",
    "OutboxEntry",
    "QuarantinedEntry",
    "Rows",
    "decode_headers",
    "batch_rows",
    "encode_headers",
    "envelope_rows",
    "row_headers",
    "run_signatures",
    "insert_rows",
    "column",
    "make_envelope",
    "reused_ids_error",
    "redact_target",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})
#: The first item of a tombstone row's headers array.
_TOMBSTONE = "tombstone"
_USERINFO = re.compile(r"^([a-z0-9+.-]+://)[^@/]*@", re.IGNORECASE)


def encode_headers(headers: Mapping[str, str]) -> str | None:
    """Headers as compact JSON, or None when there are none (the common case)."""
    if not headers:
        return None
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)


def row_headers(envelope: Envelope) -> str | None:
    """The ``headers`` column of ``envelope``'s row: :func:`encode_headers`, or the
    tombstone mark with the headers (see the module docstring)."""
    if envelope.tombstone:
        mark = [_TOMBSTONE, dict(envelope.headers)]
        return json.dumps(mark, separators=(",", ":"), ensure_ascii=False)
    return encode_headers(envelope.headers)


def decode_headers(text: str | None) -> Mapping[str, str]:
    """The inverse of :func:`encode_headers` (and the headers of :func:`row_headers`)."""
    return _decoded(text)[0]


def _decoded(text: str | None) -> tuple[Mapping[str, str], bool]:
    """A ``headers`` column as (headers, is a tombstone)."""
    if not text:
        return _EMPTY, False
    value = json.loads(text)
    tombstone = isinstance(value, list)
    if tombstone:
        value = value[1]
    if not value:
        return _EMPTY, tombstone
    return MappingProxyType({str(k): str(v) for k, v in value.items()}), tombstone


def make_envelope(
    message_id: str,
    destination: str,
    key: bytes | None,
    headers: str | None,
    body: bytes,
    created_at: float,
) -> Envelope:
    """Rebuild a stored envelope exactly as it was put (same id, same creation time,
    a tombstone still a tombstone)."""
    if headers is None and type(body) is bytes and (key is None or type(key) is bytes):
        # The common row (no headers, so no tombstone mark): built through the slots
        # (see msgsafe.message.new_receipt for why), which the drain pays for every
        # message it claims.
        return new_envelope(destination, body, message_id, key, created_at)
    decoded, tombstone = _decoded(headers)
    return Envelope(
        destination=destination,
        body=bytes(body),
        message_id=message_id,
        key=None if key is None else bytes(key),
        headers=decoded,
        created_at=created_at,
        tombstone=tombstone,
    )


#: Where a claimed row (seq, id, destination, key, headers, body, created_at) holds each
#: envelope field that has a column of its own.
_ROW_FIELD = {"message_id": 1, "destination": 2, "key": 3, "body": 5, "created_at": 6}


class ClaimedRows(Sequence[Envelope]):
    """The rows of a claim, read as envelopes: one is built only when asked for.

    NOTE: a drain claims every stored message, and an envelope per row was a fifth of
    the forwarder's CPU; the round and the forwarder read what they need for every
    message as columns (:func:`column`, :func:`run_signatures`) instead.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Envelope: ...
    @overload
    def __getitem__(self, index: slice) -> list[Envelope]: ...
    def __getitem__(self, index: int | slice) -> Envelope | list[Envelope]:
        if isinstance(index, slice):
            return [make_envelope(*row[1:7]) for row in self.rows[index]]
        return make_envelope(*self.rows[index][1:7])

    def __iter__(self) -> Iterator[Envelope]:
        return (make_envelope(*row[1:7]) for row in self.rows)

    def headers_text(self) -> list[str | None]:
        """Every row's ``headers`` column as stored (see :func:`row_headers`)."""
        return list(map(_HEADERS_TEXT, self.rows))


_HEADERS_TEXT = itemgetter(4)


def column(envelopes: Sequence[Envelope], name: str) -> list[Any]:
    """Field ``name`` of every envelope, read from the rows of a :class:`ClaimedRows`
    where it has a column (``message_id``, ``destination``, ``key``, ``body``,
    ``created_at``) without building an envelope."""
    if isinstance(envelopes, ClaimedRows) and name in _ROW_FIELD:
        return list(map(itemgetter(_ROW_FIELD[name]), envelopes.rows))
    return list(map(attrgetter(name), envelopes))


def run_signatures(envelopes: Sequence[Envelope]) -> Iterable[tuple[Any, ...]]:
    """For every message, what must be equal along a run that one batch carries:
    destination, headers, the second of ``created_at``, and whether it is a tombstone
    (a tombstone is never batched). Rows compare their stored headers text."""
    if isinstance(envelopes, ClaimedRows):
        texts = envelopes.headers_text()
        if any(texts):
            tombstones = [text is not None and text.startswith("[") for text in texts]
        else:  # no headers at all (the usual rows): no test per row
            tombstones = [False] * len(texts)
        return zip(
            column(envelopes, "destination"),
            texts,
            map(int, column(envelopes, "created_at")),
            tombstones,
            strict=True,
        )
    return zip(
        column(envelopes, "destination"),
        column(envelopes, "headers"),
        map(int, column(envelopes, "created_at")),
        column(envelopes, "tombstone"),
        strict=True,
    )


def redact_target(target: str | None) -> str:
    """The target URL without credentials, as rows store it."""
    if not target:
        return ""
    try:
        return parse_url(target).redacted()
    except ConfigurationError:
        return _USERINFO.sub(r"\1", target)


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A waiting message as :meth:`list` shows it."""

    envelope: Envelope
    target: str
    attempts: int
    ready_at: float  #: epoch seconds; 0 means ready now
    last_error: str | None


@dataclass(frozen=True, slots=True)
class QuarantinedEntry:
    """A message moved aside after a permanent error."""

    envelope: Envelope
    target: str
    attempts: int
    error: str
    quarantined_at: float


#: The SQLite store's insert of new rows; put() sends many rows per statement.
INSERT = (
    "INSERT OR IGNORE INTO outbox (id, target, destination, key, headers, body, created_at, size)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_MULTI_ROWS = 1000  # rows per INSERT statement: 8000 parameters, well under SQLite's limit
COLUMNS = 8  # parameters per row of INSERT

#: The insert of a put that holds blocks (see msgsafe.outbox._blocks): every row with
#: its ``seq`` given, so that a block reserves its members' places in the queue.
INSERT_AT = (
    "INSERT OR IGNORE INTO outbox (seq, id, target, destination, key, headers, body,"
    " created_at, size, count, block) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
COLUMNS_AT = 11  # parameters per row of INSERT_AT


@dataclass(slots=True)
class Rows:
    """One put's rows as the flat parameter list of a multi-row INSERT.

    ``spans`` is None for plain rows (:data:`INSERT`, one row a message); for a put that
    holds blocks it is each row's member count, in row order (:data:`INSERT_AT`, whose
    ``seq`` parameters the writer fills in: :meth:`place`).
    """

    params: list[object]
    count: int
    size: int
    keys: list[bytes]  #: the messages' keys (None left out), repeats included
    spans: list[int] | None = None

    @property
    def inserts(self) -> int:
        """How many rows the put inserts (fewer than ``count`` where blocks are)."""
        return self.count if self.spans is None else len(self.spans)

    def place(self, top: int) -> int:
        """Give the rows of a put with blocks their ``seq`` after ``top`` (the highest in
        the file), each block the last of the values it reserves; returns the new top."""
        assert self.spans is not None
        ends = list(accumulate(self.spans, initial=top))
        self.params[0::COLUMNS_AT] = ends[1:]
        return ends[-1]


@functools.lru_cache(maxsize=8)
def _multi_insert(rows: int) -> str:
    return INSERT + ", (?, ?, ?, ?, ?, ?, ?, ?)" * (rows - 1)


@functools.lru_cache(maxsize=8)
def _multi_insert_at(rows: int) -> str:
    return INSERT_AT + ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" * (rows - 1)


def insert_rows(conn: sqlite3.Connection, params: list[object], *, at: bool = False) -> None:
    """Insert rows given as one flat parameter list with few statements (``at``: the
    parameters of :data:`INSERT_AT`).

    NOTE: ``executemany`` gives up the GIL around every row's step and must win it back
    each time; with busy sender threads that hand-off dominates (a 1000-row put took
    ~150 ms instead of ~7 ms). Multi-row ``VALUES`` steps once per chunk.
    """
    columns, statement = (COLUMNS_AT, _multi_insert_at) if at else (COLUMNS, _multi_insert)
    step = _MULTI_ROWS * columns
    if len(params) <= step:
        conn.execute(statement(len(params) // columns), params)
        return
    for start in range(0, len(params), step):
        chunk = params[start : start + step]
        conn.execute(statement(len(chunk) // columns), chunk)


def envelope_rows(envelopes: Sequence[Envelope], target: str) -> Rows:
    """``envelopes`` as the rows of a put for ``target``, straight into the flat parameter
    list of the multi-row INSERT: no tuple per row."""
    if len(envelopes) == 1:
        # One message per put (the per-message fsync mode): no comprehension frames.
        env = envelopes[0]
        key = env.key
        if env.headers or env.tombstone:
            headers = row_headers(env)
            size = env.size
        else:
            # Envelope.size without its call: no headers to count.
            headers = None
            size = len(env.body) if key is None else len(env.body) + len(key)
        one: list[object] = [env.message_id, target, env.destination, key, headers, env.body]
        one += (env.created_at, size)
        return Rows(one, 1, size, [] if key is None else [key])
    params: list[object] = [
        value
        for env in envelopes
        for value in (
            env.message_id,
            target,
            env.destination,
            env.key,
            row_headers(env) if env.headers or env.tombstone else None,
            env.body,
            env.created_at,
            env.size,
        )
    ]
    keys = [env.key for env in envelopes if env.key is not None]
    sizes: list[int] = params[7::COLUMNS]  # type: ignore[assignment]  # the size column
    return Rows(params, len(envelopes), sum(sizes), keys)


def batch_rows(batch: Batch, target: str) -> Rows:
    """Every message of ``batch`` as the rows of a put for ``target``: the messages of one
    key as blocks (:mod:`msgsafe.outbox._blocks`), or where no key has two, the same rows
    :func:`envelope_rows` makes of ``batch.envelope(i)`` for each ``i``; built from the
    batch's columns without an envelope per message."""
    units = plan(batch)
    if units is not None:
        return _block_rows(batch, target, units)
    count = len(batch)
    headers = encode_headers(batch.headers)
    extra = sum(len(k) + len(v) for k, v in batch.headers.items())
    params: list[object] = [None] * (count * COLUMNS)
    params[0::COLUMNS] = batch.message_ids
    params[1::COLUMNS] = [target] * count
    params[2::COLUMNS] = [batch.destination] * count
    params[4::COLUMNS] = [headers] * count
    params[5::COLUMNS] = batch.bodies
    params[6::COLUMNS] = [batch.created_at] * count
    if batch.keys is None:
        sizes = [len(body) + extra for body in batch.bodies]
        keys: list[bytes] = []
    else:
        params[3::COLUMNS] = batch.keys
        sizes = [
            len(body) + extra + (0 if key is None else len(key))
            for body, key in zip(batch.bodies, batch.keys, strict=True)
        ]
        keys = [key for key in batch.keys if key is not None]
    params[7::COLUMNS] = sizes
    return Rows(params, count, sum(sizes), keys)


def _block_rows(batch: Batch, target: str, units: list[tuple[bytes | None, list[int]]]) -> Rows:
    """``batch`` as the rows of a put with blocks, one row per unit of :func:`plan`."""
    headers = encode_headers(batch.headers)
    extra = sum(len(k) + len(v) for k, v in batch.headers.items())
    ids, bodies, created = batch.message_ids, batch.bodies, batch.created_at
    destination = batch.destination
    params: list[object] = []
    spans: list[int] = []
    total = 0
    for key, indexes in units:
        fixed = extra + (0 if key is None else len(key))
        if len(indexes) == 1:
            (index,) = indexes
            body = bodies[index]
            size = len(body) + fixed
            params += (0, ids[index], target, destination, key, headers, body, created, size)
            params += (1, None)
        else:
            member_ids = [ids[i] for i in indexes]
            member_bodies = [bodies[i] for i in indexes]
            size = sum(map(len, member_bodies)) + fixed * len(indexes)
            block = pack(member_ids, member_bodies)
            params += (0, member_ids[0], target, destination, key, headers, b"", created, size)
            params += (len(indexes), block)
        spans.append(len(indexes))
        total += size
    keys = [] if batch.keys is None else [key for key in batch.keys if key is not None]
    return Rows(params, len(batch), total, keys, spans)


def reused_ids_error(ids: Iterable[str], endpoint: str | None = None) -> MessageIdReused:
    """The error of a put refused because ``ids`` are stored as other messages (every
    store says it the same way: the smallest id named, the count of the others)."""
    found = sorted(set(ids))
    return MessageIdReused(
        f"message id {found[0]} is stored in the outbox with another destination, key"
        " or body: an id may be reused only to send the same message again"
        + (f" ({len(found)} ids)" if len(found) > 1 else ""),
        endpoint=endpoint,
        message_id=found[0],
    )
