"""Reading records out of a damaged SQLite file page by page, without SQLite.

SQLite refuses a query as soon as it meets a damaged page on its way, so one bad
interior page hides every row below it. This reader follows the file format
(https://www.sqlite.org/fileformat2.html) instead: it walks each table's b-tree as far
as its pages make sense, then looks at every page it did not reach that is neither free
nor an overflow page, and decodes what still reads as table leaf cells. A page or cell
that does not parse is counted and skipped; nothing is guessed.

Only what salvaging an outbox needs: table b-trees (interior 0x05, leaf 0x0D), overflow
chains, the freelist, and the record format. It reads; it never writes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["TABLE_LEAF", "Cell", "Damaged", "PageFile", "Value"]

#: A decoded column value.
Value = int | float | str | bytes | None

_MAGIC = b"SQLite format 3\x00"
_INDEX_INTERIOR, _TABLE_INTERIOR, _INDEX_LEAF, _TABLE_LEAF = 0x02, 0x05, 0x0A, 0x0D
_PAGE_KINDS = (_INDEX_INTERIOR, _TABLE_INTERIOR, _INDEX_LEAF, _TABLE_LEAF)
_MAX_PAYLOAD = 1 << 31  # SQLite's own limit on a row is 1 GB


#: The page type of a table b-tree leaf, where rows live.
TABLE_LEAF = _TABLE_LEAF


class Damaged(Exception):
    """A page or cell that does not parse."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One row of a table leaf page: its rowid and decoded columns."""

    rowid: int
    values: tuple[Value, ...]
    page: int


@dataclass(slots=True)
class PageFile:
    """An SQLite file opened for reading pages.

    ``damaged_pages`` counts pages that should have parsed and did not;
    ``damaged_cells`` cells of readable pages that did not decode.
    """

    file: BinaryIO
    page_size: int = 4096
    usable: int = 4096
    pages: int = 0
    overflow: set[int] = field(default_factory=set)
    walked: set[int] = field(default_factory=set)  #: every page a walk visited
    damaged_pages: int = 0
    damaged_cells: int = 0

    @classmethod
    def open(cls, file: BinaryIO) -> PageFile:
        """Read the header (a damaged one falls back to 4096-byte pages)."""
        file.seek(0, 2)
        length = file.tell()
        file.seek(0)
        head = file.read(100)
        reader = cls(file)
        if len(head) == 100 and head.startswith(_MAGIC):
            size = struct.unpack(">H", head[16:18])[0]
            size = 65536 if size == 1 else size
            if 512 <= size <= 65536 and size & (size - 1) == 0:
                reader.page_size = size
                reader.usable = size - head[20]
        reader.pages = length // reader.page_size
        return reader

    def page(self, number: int) -> bytes:
        """Page ``number`` (1-based) as bytes; raises :class:`Damaged` out of range."""
        if not 1 <= number <= self.pages:
            raise Damaged(f"page {number} is outside the file")
        self.file.seek((number - 1) * self.page_size)
        return self.file.read(self.page_size)

    def free_pages(self) -> set[int]:
        """Pages on the freelist (as far as its trunk pages read)."""
        free: set[int] = set()
        head = self.page(1)[:100] if self.pages else b""
        if len(head) < 40:
            return free
        trunk = struct.unpack(">I", head[32:36])[0]
        while trunk and trunk not in free:
            free.add(trunk)
            try:
                data = self.page(trunk)
            except Damaged:
                break
            following, count = struct.unpack(">II", data[:8])
            if count > (self.usable - 8) // 4:
                break
            for i in range(count):
                leaf = struct.unpack(">I", data[8 + 4 * i : 12 + 4 * i])[0]
                if 1 < leaf <= self.pages:
                    free.add(leaf)
            trunk = following
        return free

    def walk(self, root: int) -> list[int]:
        """The leaf pages of the table b-tree at ``root``, in key order, as far as the
        interior pages read; each damaged one counts in ``damaged_pages``."""
        leaves: list[int] = []
        seen: set[int] = set()
        stack = [root]
        while stack:
            number = stack.pop()
            if number in seen:
                self.damaged_pages += 1
                continue
            seen.add(number)
            self.walked.add(number)
            try:
                data = self.page(number)
                kind = data[100 if number == 1 else 0]
                if kind == _TABLE_LEAF:
                    leaves.append(number)
                    continue
                if kind != _TABLE_INTERIOR:
                    raise Damaged(f"page {number} is not a table page")
                children = self._children(number, data)
            except (Damaged, struct.error, IndexError):
                self.damaged_pages += 1
                continue
            stack.extend(reversed(children))
        return leaves

    def cells(self, number: int) -> Iterator[Cell]:
        """The cells of table leaf page ``number`` that decode (others are counted)."""
        try:
            data = self.page(number)
            base = 100 if number == 1 else 0
            if data[base] != _TABLE_LEAF:
                raise Damaged(f"page {number} is not a table leaf")
            pointers = self._pointers(data, base, 8)
        except (Damaged, struct.error, IndexError):
            self.damaged_pages += 1
            return
        for offset in pointers:
            try:
                yield self._cell(number, data, offset)
            except (Damaged, struct.error, IndexError, UnicodeDecodeError):
                self.damaged_cells += 1

    def kind(self, number: int) -> int | None:
        """The b-tree page type of page ``number`` (0x02, 0x05, 0x0A or 0x0D) when its
        header reads as one, else None (an overflow, free or damaged page)."""
        try:
            data = self.page(number)
            base = 100 if number == 1 else 0
            kind = data[base]
            if kind not in _PAGE_KINDS:
                return None
            self._pointers(data, base, 8 if kind in (_TABLE_LEAF, _INDEX_LEAF) else 12)
        except (Damaged, struct.error, IndexError):
            return None
        return kind

    # --- the format -----------------------------------------------------------------------

    def _pointers(self, data: bytes, base: int, header: int) -> list[int]:
        count = struct.unpack(">H", data[base + 3 : base + 5])[0]
        start = base + header
        if start + 2 * count > self.usable:
            raise Damaged("more cells than the page holds")
        pointers = [
            struct.unpack(">H", data[start + 2 * i : start + 2 * i + 2])[0] for i in range(count)
        ]
        if any(not start + 2 * count <= p < self.usable for p in pointers):
            raise Damaged("a cell pointer outside the cell area")
        return pointers

    def _children(self, number: int, data: bytes) -> list[int]:
        base = 100 if number == 1 else 0
        children = [
            struct.unpack(">I", data[offset : offset + 4])[0]
            for offset in self._pointers(data, base, 12)
        ]
        children.append(struct.unpack(">I", data[base + 8 : base + 12])[0])
        if any(not 1 < child <= self.pages for child in children):
            raise Damaged(f"page {number} points outside the file")
        return children

    def _cell(self, number: int, data: bytes, offset: int) -> Cell:
        size, offset = _varint(data, offset)
        rowid, offset = _varint(data, offset)
        if rowid >= 1 << 63:
            rowid -= 1 << 64
        if size > _MAX_PAYLOAD:
            raise Damaged("payload larger than SQLite allows")
        local = self._local_size(size)
        payload = data[offset : offset + local]
        if len(payload) != local or offset + local > self.usable:
            raise Damaged("payload runs past the page")
        if local < size:
            payload += self._overflow(data, offset + local, size - local)
        return Cell(rowid, _record(payload), number)

    def _local_size(self, size: int) -> int:
        usable = self.usable
        most = usable - 35
        if size <= most:
            return size
        least = (usable - 12) * 32 // 255 - 23
        local = least + (size - least) % (usable - 4)
        return local if local <= most else least

    def _overflow(self, data: bytes, at: int, missing: int) -> bytes:
        chunks: list[bytes] = []
        number = struct.unpack(">I", data[at : at + 4])[0]
        seen: set[int] = set()
        while missing > 0:
            if number in seen or not 1 < number <= self.pages:
                raise Damaged("a broken overflow chain")
            seen.add(number)
            page = self.page(number)
            take = min(missing, self.usable - 4)
            chunks.append(page[4 : 4 + take])
            missing -= take
            number = struct.unpack(">I", page[:4])[0]
        self.overflow.update(seen)
        return b"".join(chunks)


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[offset + i]
        if i == 8:
            return (value << 8) | byte, offset + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, offset + i + 1
    raise Damaged("unreachable")  # pragma: no cover


_INT_SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}


def _record(payload: bytes) -> tuple[Value, ...]:
    """The columns of one record (the record format), or :class:`Damaged`."""
    header_size, offset = _varint(payload, 0)
    if not 0 < header_size <= len(payload):
        raise Damaged("a record header larger than the record")
    types: list[int] = []
    while offset < header_size:
        serial, offset = _varint(payload, offset)
        types.append(serial)
    if offset != header_size:
        raise Damaged("a record header that overruns itself")
    values: list[Value] = []
    at = header_size
    for serial in types:
        if serial == 0:
            values.append(None)
        elif serial in _INT_SIZES:
            width = _INT_SIZES[serial]
            raw = payload[at : at + width]
            if len(raw) != width:
                raise Damaged("a record shorter than its header says")
            values.append(int.from_bytes(raw, "big", signed=True))
            at += width
        elif serial == 7:
            raw = payload[at : at + 8]
            if len(raw) != 8:
                raise Damaged("a record shorter than its header says")
            values.append(struct.unpack(">d", raw)[0])
            at += 8
        elif serial in (8, 9):
            values.append(serial - 8)
        elif serial >= 12:
            width = (serial - 12) // 2
            raw = payload[at : at + width]
            if len(raw) != width:
                raise Damaged("a record shorter than its header says")
            values.append(raw if serial % 2 == 0 else raw.decode("utf-8"))
            at += width
        else:
            raise Damaged(f"reserved serial type {serial}")
    if at != len(payload):
        raise Damaged("a record longer than its header says")
    return tuple(values)
