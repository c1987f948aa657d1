"""``msgsafe outbox salvage``: copy every intact message of a damaged outbox file into a
new one, leaving the damaged file exactly as it was.

SQLite stops at the first damaged page a query meets; the messages behind it are still
on disk. :func:`salvage` reads the file page by page (:mod:`msgsafe.outbox._pages`):
each table's b-tree as far as it reads, then every other page that still reads as a
table leaf (the leaves below a damaged interior page). A record becomes a message again
only if it has the outbox's columns, consistent with each other (text where text
belongs, the stored size equal to the size of body, key and headers, the headers
valid JSON); everything else is counted and left out. Waiting messages keep their
order, ids and attempts; quarantined ones stay quarantined. An id found twice (a stale
copy of a page) is copied once. A block (the members of one stored batch in one row:
:mod:`msgsafe.outbox._blocks`) is copied as its members' rows, each at its own place
in the queue, when it unpacks whole and its members are consistent; otherwise it is one
damaged record.

A write-ahead log next to the file (``PATH-wal``, left by a process that died) is
applied to a scratch copy first, so messages committed only there are found too.

Limits, said plainly: a page that was overwritten is gone, and with it the messages it
held; bytes damaged inside a body that still decodes cannot be told from the original
(SQLite keeps no checksum of a row).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from msgsafe.errors import ConfigurationError, OutboxLocked
from msgsafe.outbox._blocks import BlockError, header_extra, member_sizes, unpack
from msgsafe.outbox._pages import TABLE_LEAF, Cell, PageFile, Value
from msgsafe.outbox._schema import take_lock
from msgsafe.outbox._writer import HandlerResult
from msgsafe.outbox.sqlite import SqliteOutbox, held_here

__all__ = ["SalvageReport", "salvage"]

_CHUNK_ROWS = 500
_CHUNK_BYTES = 16 << 20
_WAITING = (
    "INSERT OR IGNORE INTO outbox (seq, id, target, destination, key, headers, body,"
    " created_at, size, attempts, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_QUARANTINED = (
    "INSERT OR IGNORE INTO quarantine (seq, id, target, destination, key, headers, body,"
    " created_at, size, attempts, error, quarantined_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True, slots=True)
class SalvageReport:
    """What :func:`salvage` copied and what it could not read."""

    source: Path
    target: Path
    waiting: int  #: waiting messages now in ``target``
    quarantined: int  #: quarantined messages now in ``target``
    pages: int  #: pages in the source file
    damaged_pages: int  #: pages that should have parsed and did not, or read as nothing
    damaged_records: int  #: records that did not decode, or not as a consistent message
    wal: str  #: "none", "applied", or why the write-ahead log could not be applied


def salvage(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> SalvageReport:
    """Copy every intact message of the outbox file ``source`` into the new outbox file
    ``target``; ``source`` is only read.

    Raises :class:`~msgsafe.errors.ConfigurationError` when ``source`` is missing or
    ``target`` exists, :class:`~msgsafe.errors.OutboxLocked` when a process holds
    ``source`` (it is in use, so not damaged: that process owns it).
    """
    src, dst = Path(source), Path(target)
    if not src.is_file():
        raise ConfigurationError(f"no outbox file at {src}")
    if any(Path(f"{dst}{end}").exists() for end in ("", "-wal", "-shm")):
        raise ConfigurationError(f"{dst} exists; salvage writes a new file only")
    if held_here(src):
        raise OutboxLocked(f"the outbox file {src} is open in this process")
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        take_lock(fd, src)
        with _readable(src, dst.parent) as (readable, wal), readable.open("rb") as fh:
            return _copy(fh, src, dst, wal)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _readable(source: Path, scratch: Path) -> Iterator[tuple[Path, str]]:
    """The file to read: ``source`` itself, or a scratch copy with its WAL applied."""
    wal = Path(f"{source}-wal")
    if not wal.is_file() or wal.stat().st_size == 0:
        yield source, "none"
        return
    folder = Path(tempfile.mkdtemp(prefix=".msgsafe-salvage-", dir=scratch))
    try:
        copy = folder / "copy.sqlite3"
        shutil.copyfile(source, copy)
        shutil.copyfile(wal, f"{copy}-wal")
        try:
            conn = sqlite3.connect(copy, isolation_level=None)
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                conn.close()
            state = "applied" if busy == 0 else "not applied (busy)"
        except sqlite3.Error as exc:
            state = f"not applied ({exc})"
        if state != "applied":
            shutil.copyfile(source, copy)
            for end in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{copy}{end}").unlink()
        yield copy, state
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy(fh: BinaryIO, source: Path, target: Path, wal: str) -> SalvageReport:
    pages = PageFile.open(fh)
    rejected = 0
    store = SqliteOutbox(target, check="off")
    try:
        batch = _Batch(store)
        schema = pages.walk(1) if pages.pages else []
        roots = _roots(pages, schema)
        reached: set[int] = set(schema)
        for table in ("outbox", "quarantine"):
            root = roots.get(table)
            if root is None:
                continue
            for leaf in pages.walk(root):
                reached.add(leaf)
                for cell in pages.cells(leaf):
                    rejected += not batch.add(cell, table)
        skip = reached | pages.walked | pages.free_pages()
        unknown: list[int] = []
        for number in range(2, pages.pages + 1):
            if number in skip or number in pages.overflow:
                continue
            kind = pages.kind(number)
            if kind is None:
                unknown.append(number)
            elif kind == TABLE_LEAF:
                for cell in pages.cells(number):
                    rejected += not batch.add(cell, None)
        # Known only now: the overflow pages of the leaves found by the scan. (Those of a
        # record that did not decode stay unknown: damaged, in a way, they are.)
        pages.damaged_pages += sum(number not in pages.overflow for number in unknown)
        batch.flush()
        store._call(store._recount_batch, None)
        stats = store.stats()
    finally:
        store.close()
    return SalvageReport(
        source=source,
        target=target,
        waiting=stats.depth,
        quarantined=stats.quarantined,
        pages=pages.pages,
        damaged_pages=pages.damaged_pages,
        damaged_records=pages.damaged_cells + rejected,
        wal=wal,
    )


def _roots(pages: PageFile, schema: list[int]) -> dict[str, int]:
    roots: dict[str, int] = {}
    for leaf in schema:
        for cell in pages.cells(leaf):
            kind, name, _, root = (cell.values + (None,) * 4)[:4]
            if kind == "table" and name in ("outbox", "quarantine") and isinstance(root, int):
                roots[name] = root
    return roots


class _Batch:
    """Rows on their way into the new file, written a bounded chunk at a time."""

    def __init__(self, store: SqliteOutbox) -> None:
        self._store = store
        self._rows: dict[str, list[tuple[Any, ...]]] = {"outbox": [], "quarantine": []}
        self._bytes = 0

    def add(self, cell: Cell, table: str | None) -> bool:
        """Queue ``cell`` as a row of ``table`` (None: whichever its columns fit);
        False when it is not a consistent message."""
        rows = _messages(cell.rowid, cell.values, table)
        if rows is None:
            return False
        for kind, values in rows:
            self._rows[kind].append(values)
            self._bytes += len(values[6])
        if sum(map(len, self._rows.values())) >= _CHUNK_ROWS or self._bytes >= _CHUNK_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        if any(self._rows.values()):
            self._store._call(_insert, self._rows)
        self._rows = {"outbox": [], "quarantine": []}
        self._bytes = 0


def _insert(conn: sqlite3.Connection, payloads: list[Any]) -> HandlerResult[object]:
    for rows in payloads:
        conn.executemany(_WAITING, rows["outbox"])
        conn.executemany(_QUARANTINED, rows["quarantine"])
    return HandlerResult([None] * len(payloads))


def _messages(
    rowid: int, values: tuple[Value, ...], table: str | None
) -> list[tuple[str, tuple[Any, ...]]] | None:
    """``(table, row)`` for each message of a record, ready to insert, or None when the
    record is not one message or one whole block of messages. A waiting row written
    since blocks exist has two more columns: its member count and its block."""
    if len(values) == 14:
        if table == "quarantine":
            return None
        count, block = values[12], values[13]
        if block is None:
            row = _message(rowid, values[:12], "outbox") if count == 1 else None
            return None if row is None else [row]
        if not isinstance(block, bytes) or not isinstance(count, int):
            return None
        return _block(rowid, values[:12], count, block)
    row = _message(rowid, values, table)
    return None if row is None else [row]


def _block(
    rowid: int, values: tuple[Value, ...], count: int, block: bytes
) -> list[tuple[str, tuple[Any, ...]]] | None:
    """A block's members as waiting rows (see :func:`_messages`), each checked as its
    own row would be; None unless all of them are."""
    key, headers, body, size = values[4], values[5], values[6], values[8]
    if body != b"" or not isinstance(size, int):
        return None
    if headers is not None and not isinstance(headers, str):
        return None
    if key is not None and not isinstance(key, bytes):
        return None
    try:
        ids, bodies = unpack(block)
        sizes = member_sizes(bodies, key, header_extra(headers))
    except (BlockError, ValueError, AttributeError, TypeError, IndexError):
        return None
    if len(ids) != count or sum(sizes) != size or ids[0] != values[1]:
        return None
    first = rowid - count + 1
    rows: list[tuple[str, tuple[Any, ...]]] = []
    for i, (mid, member, member_size) in enumerate(zip(ids, bodies, sizes, strict=True)):
        member_values = (None, mid, *values[2:6], member, values[7], member_size, *values[9:])
        row = _message(first + i, member_values, "outbox")
        if row is None:
            return None
        rows.append(row)
    return rows


def _message(
    rowid: int, values: tuple[Value, ...], table: str | None
) -> tuple[str, tuple[Any, ...]] | None:
    """``(table, row)`` ready to insert, or None when the record is not a message."""
    if len(values) != 12 or values[0] is not None:
        return None
    common = values[1:9]
    message_id, target, destination, key, headers, body, created_at, size = common
    if not (
        isinstance(message_id, str)
        and 0 < len(message_id) <= 1024
        and message_id.isprintable()
        and isinstance(target, str)
        and isinstance(destination, str)
        and destination
        and (key is None or isinstance(key, bytes))
        and (headers is None or isinstance(headers, str))
        and isinstance(body, bytes)
        and isinstance(created_at, (int, float))
        and isinstance(size, int)
        and size == _size(body, key, headers)
    ):
        return None
    if table in (None, "outbox") and _is_waiting(values):
        return "outbox", (rowid, *common, values[10], values[11])
    if table in (None, "quarantine") and _is_quarantined(values):
        return "quarantine", (rowid, *common, *values[9:12])
    return None


def _is_waiting(values: tuple[Value, ...]) -> bool:
    ready_at, attempts, last_error = values[9:12]
    return (
        isinstance(ready_at, (int, float))
        and isinstance(attempts, int)
        and (last_error is None or isinstance(last_error, str))
    )


def _is_quarantined(values: tuple[Value, ...]) -> bool:
    attempts, error, quarantined_at = values[9:12]
    return (
        isinstance(attempts, int)
        and isinstance(error, str)
        and isinstance(quarantined_at, (int, float))
    )


def _size(body: bytes, key: bytes | None, headers: str | None) -> int | None:
    """The size the store recorded for these columns (see ``Envelope.size``)."""
    size = len(body) + (len(key) if key is not None else 0)
    if headers:
        try:
            decoded = json.loads(headers)
        except ValueError:
            return None
        if isinstance(decoded, list) and len(decoded) == 2 and decoded[0] == "tombstone":
            decoded = decoded[1]  # a tombstone's row (see msgsafe.outbox._rows)
        if not isinstance(decoded, dict):
            return None
        size += sum(len(str(k)) + len(str(v)) for k, v in decoded.items())
    return size
