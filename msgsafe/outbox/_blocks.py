"""Blocks: what one ``send_batch`` stores, kept as one row of the SQLite outbox.

A drain reads and removes every stored message; as a row each, SQLite's read and
removal cost more per message than the whole budget of a healthy batch send. So the
messages of one stored batch that share a key (or all of them, unkeyed) are written as
**one row**, a *block*: the row's ``key``, ``destination``, ``headers``, ``created_at``
and ``target`` are the members' (a batch shares them), ``count`` says how many members
it has, ``size`` is the sum of their sizes, ``id`` is the first member's id and
``block`` packs every member's id and body (:func:`pack`). A plain row has
``count = 1`` and ``block`` NULL, as every row of a file written before blocks.

Order: a block's members are consecutive in their key's queue. The block reserves the
``seq`` values of its members: its row's ``seq`` is the last member's, the members'
are the ``count`` values up to it, and no other row takes one of them (a put gives every
row a ``seq`` above the highest in the file). So a block can always be **split** — its
members written as plain rows at their own ``seq``, in one transaction — without
moving any message in the queue.

A block is only ever whole or split, never rewritten: it is claimed whole, removed whole
when every member was confirmed, and split the moment one of its members needs handling
on its own (confirmed while another was not, retried later, quarantined, purged or
adopted by id). Splitting keeps each member's id, body, key, headers, age, ``ready_at``,
attempts and last error.

The packing (version 1): ``b"MSB1"``, the member count (u32), every body's length (u32
each), the length of the ids' text (u32), the ids joined by ``"\\n"`` (UTF-8), then the
bodies back to back; little-endian. Ids containing ``"\\n"`` are never packed: such a
batch is stored as rows.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, repeat
from typing import Any

from msgsafe.message import Batch

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_MEMBERS",
    "BlockError",
    "block_members",
    "header_extra",
    "member_sizes",
    "members",
    "pack",
    "plan",
    "split",
    "unpack",
]

_MAGIC = b"MSB1"
_HEAD = struct.Struct("<4sI")
_U32 = struct.Struct("<I")

#: Members per block at most, and their bodies' bytes at most: a claim takes a block
#: whole, so a block is never much bigger than a forwarder's round.
BLOCK_MEMBERS = 1000
BLOCK_BYTES = 4 << 20


class BlockError(ValueError):
    """A ``block`` column that does not unpack (a damaged record)."""


def pack(ids: Sequence[str], bodies: Sequence[bytes]) -> bytes:
    """The ``block`` column of members ``ids[i]`` with ``bodies[i]``."""
    lengths = array("I", map(len, bodies))
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is
        lengths.byteswap()
    text = "\n".join(ids).encode()
    return b"".join(
        (
            _HEAD.pack(_MAGIC, len(ids)),
            lengths.tobytes(),
            _U32.pack(len(text)),
            text,
            *bodies,
        )
    )


def unpack(block: bytes) -> tuple[list[str], list[bytes]]:
    """The members' ids and bodies of a ``block`` column; :class:`BlockError` if it is
    not one."""
    try:
        magic, count = _HEAD.unpack_from(block)
    except struct.error as exc:
        raise BlockError("too short for a block") from exc
    if magic != _MAGIC or count < 1:
        raise BlockError("not a block")
    start = _HEAD.size
    end = start + 4 * count
    lengths = array("I")
    if lengths.itemsize != 4:  # pragma: no cover - a C unsigned int is 32 bits here
        raise BlockError("this platform's unsigned int is not 32 bits")
    lengths.frombytes(block[start:end])
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is
        lengths.byteswap()
    try:
        (text_len,) = _U32.unpack_from(block, end)
    except struct.error as exc:
        raise BlockError("truncated block") from exc
    text_start = end + 4
    body_start = text_start + text_len
    if len(lengths) != count or body_start + sum(lengths) != len(block):
        raise BlockError("a block's lengths do not match its size")
    try:
        ids = block[text_start:body_start].decode().split("\n")
    except UnicodeDecodeError as exc:
        raise BlockError("a block's ids are not text") from exc
    if len(ids) != count:
        raise BlockError("a block's ids do not match its count")
    # NOTE: C loops (accumulate, map over slices): a drain unpacks every stored message.
    offsets = list(accumulate(lengths, initial=body_start))
    bodies = list(map(block.__getitem__, map(slice, offsets, offsets[1:])))
    return ids, bodies


def header_extra(headers: str | None) -> int:
    """What the shared ``headers`` column adds to each member's size (see
    ``Envelope.size``): the length of every header's name and value."""
    if not headers:
        return 0
    value = json.loads(headers)
    if isinstance(value, list):  # a tombstone's mark; never packed, read defensively
        value = value[1]
    return sum(len(str(k)) + len(str(v)) for k, v in value.items())


def member_sizes(bodies: Sequence[bytes], key: bytes | None, extra: int) -> list[int]:
    """Each member's size, as its own row would record it."""
    fixed = extra + (0 if key is None else len(key))
    return [n + fixed for n in map(len, bodies)]


def plan(batch: Batch) -> list[tuple[bytes | None, list[int]]] | None:
    """How to store ``batch``: ``(key, member indexes)`` per unit in put order, each unit
    of one key with its indexes in batch order; a unit of several indexes becomes a
    block. None when no unit would have two members (store plain rows)."""
    count = len(batch)
    if count < 2 or any("\n" in i for i in batch.message_ids):
        return None
    keys = batch.keys
    groups: dict[bytes | None, list[int]]
    if keys is None:
        groups = {None: list(range(count))}
    else:
        groups = {}
        for index, key in enumerate(keys):
            group = groups.get(key)
            if group is None:
                groups[key] = [index]
            else:
                group.append(index)
    if len(groups) == count:
        return None
    bodies = batch.bodies
    units: list[tuple[bytes | None, list[int]]] = []
    for key, indexes in groups.items():
        run: list[int] = []
        size = 0
        for index in indexes:
            length = len(bodies[index])
            if run and (len(run) >= BLOCK_MEMBERS or size + length > BLOCK_BYTES):
                units.append((key, run))
                run, size = [], 0
            run.append(index)
            size += length
        units.append((key, run))
    return units


def members(row: Sequence[Any], block: bytes) -> list[tuple[Any, ...]]:
    """A claimed block row ``(seq, id, destination, key, headers, body, created_at, ...)``
    as its members' claimed rows, each with its own ``seq``, id and body."""
    seq = row[0]
    ids, bodies = unpack(block)
    first = seq - len(ids) + 1
    return list(
        zip(
            range(first, seq + 1),
            ids,
            repeat(row[2]),
            repeat(row[3]),
            repeat(row[4]),
            bodies,
            repeat(row[6]),
            strict=False,
        )
    )


#: A block row, taken out of the queue to be split.
_TAKE = (
    "DELETE FROM outbox WHERE seq = ? AND block IS NOT NULL RETURNING seq, target,"
    " destination, key, headers, created_at, ready_at, attempts, last_error, block"
)
_PUT_MEMBER = (
    "INSERT OR IGNORE INTO outbox (seq, id, target, destination, key, headers, body,"
    " created_at, size, ready_at, attempts, last_error) VALUES"
    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def split(conn: sqlite3.Connection, seqs: Iterable[int]) -> tuple[list[str], bool]:
    """Split the blocks at ``seqs`` into plain rows, each member at its own ``seq`` with
    the block's ``ready_at``, attempts and last error (inside the caller's
    transaction). Returns the members' ids and whether every member was written (False:
    an id was stored twice, and the copy already there stays: recount).

    A ``seq`` that holds no block (split or removed meanwhile) is passed over.
    """
    ids: list[str] = []
    whole = True
    for seq in seqs:
        taken = conn.execute(_TAKE, (seq,)).fetchone()
        if taken is None:
            continue
        _, target, destination, key, headers, created_at, ready_at, attempts, error, block = taken
        member_ids, bodies = unpack(block)
        sizes = member_sizes(bodies, key, header_extra(headers))
        first = seq - len(member_ids) + 1
        shared = (target, destination, key, headers)
        state = (ready_at, attempts, error)
        rows = [
            (first + i, mid, *shared, body, created_at, size, *state)
            for i, (mid, body, size) in enumerate(zip(member_ids, bodies, sizes, strict=True))
        ]
        before = conn.total_changes
        conn.executemany(_PUT_MEMBER, rows)
        whole = whole and conn.total_changes - before == len(rows)
        ids += member_ids
    return ids, whole


def block_members(conn: sqlite3.Connection) -> Iterator[tuple[int, list[str]]]:
    """Every block of the queue as ``(seq, member ids)``, in queue order (for what an
    operator asks by id: ids inside blocks have no index)."""
    for seq, block in conn.execute(
        "SELECT seq, block FROM outbox WHERE block IS NOT NULL ORDER BY seq"
    ):
        yield seq, unpack(block)[0]
