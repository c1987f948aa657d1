"""The operator's side of one SQLite outbox: what ``msgsafe outbox`` asks of the file.

List what waits (and how much of it per destination), inspect the quarantine, replay
it, purge, find where given ids are, and absorb another outbox file. None of this is on
a message's way to the broker (that is :mod:`msgsafe.outbox.sqlite`: put, claim,
delivered, failed, release); all of it goes through the same store's writer (one
connection, group commit) and reports what it changed to the store's
:class:`~msgsafe.outbox._tally.Tally` once committed.

:class:`OperatorQueries` is a collaborator of :class:`~msgsafe.outbox.SqliteOutbox`,
which offers these queries as its own methods and hands them over.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Literal

from msgsafe.errors import OutboxError
from msgsafe.outbox._blocks import block_members, split, unpack
from msgsafe.outbox._rows import OutboxEntry, QuarantinedEntry, make_envelope
from msgsafe.outbox._tally import Tally
from msgsafe.outbox._writer import Handler, HandlerResult

__all__ = ["OperatorQueries", "Run"]

#: Runs a handler in a transaction of the store's writer and returns its result
#: (ClosedError once the store is closed).
Run = Callable[[Handler, object], Any]

#: Ids one replay or purge may name (SQLite's variable limit is 32766).
_MAX_SELECTED = 30000

#: Waiting rows in queue order; a block (msgsafe.outbox._blocks) stands for its members.
_WAITING = (
    "SELECT id, destination, key, headers, body, created_at, target, attempts,"
    " ready_at, last_error, count, block FROM outbox ORDER BY seq"
)
_QUARANTINED = (
    "SELECT id, destination, key, headers, body, created_at, target, attempts,"
    " error, quarantined_at FROM quarantine ORDER BY seq LIMIT ? OFFSET ?"
)
#: Rows moved by absorb() per transaction, and their payload bytes at most.
_ABSORB_ROWS = 1000
_ABSORB_BYTES = 16 << 20
_WAITING_COLUMNS = (
    "id, target, destination, key, headers, body, created_at, size, attempts, last_error"
)
_QUARANTINE_COLUMNS = (
    "id, target, destination, key, headers, body, created_at, size, attempts, error, quarantined_at"
)


class OperatorQueries:
    """``list``, ``quarantined``, ``destinations``, ``replay``, ``purge``, ``locate`` and
    ``absorb`` of one SQLite outbox (their contracts: the methods of the same names of
    :class:`~msgsafe.outbox.SqliteOutbox`).

    ``call`` runs a handler in a write transaction of the store's writer, ``read`` in a
    read transaction; ``tally`` is the store's, told what replay, purge and absorb
    changed.
    """

    __slots__ = ("_call", "_read", "_tally")

    def __init__(self, call: Run, read: Run, tally: Tally) -> None:
        self._call = call
        self._read = read
        self._tally = tally

    def list(self, limit: int = 100, offset: int = 0) -> builtins.list[OutboxEntry]:
        """Waiting messages in queue order."""
        result: builtins.list[OutboxEntry] = self._read(self._waiting_batch, (limit, offset))
        return result

    def quarantined(self, limit: int = 100, offset: int = 0) -> builtins.list[QuarantinedEntry]:
        """Quarantined messages, oldest first, with the error that put them there."""
        result: builtins.list[QuarantinedEntry] = self._read(
            self._quarantined_batch, (limit, offset)
        )
        return result

    def destinations(self, limit: int = 20) -> builtins.list[tuple[str, int]]:
        """Waiting messages per destination, the fullest first (at most ``limit``)."""
        result: builtins.list[tuple[str, int]] = self._read(self._destinations_batch, limit)
        return result

    def replay(self, ids: Sequence[str] | Literal["all"]) -> int:
        """Move quarantined messages back to the end of the queue; returns how many."""
        selected = None if ids == "all" else builtins.list(ids)
        moved: int = self._call(self._replay_batch, selected)
        return moved

    def purge(
        self,
        ids: Sequence[str] | Literal["all"],
        *,
        waiting: bool = False,
        quarantined: bool = True,
    ) -> int:
        """Delete messages (``ids`` or ``"all"``) for good: quarantined ones unless
        ``quarantined=False``, waiting ones too with ``waiting=True``. Returns how many
        were deleted."""
        selected = None if ids == "all" else builtins.list(ids)
        deleted: int = self._call(self._purge_batch, (selected, waiting, quarantined))
        return deleted

    def locate(self, ids: Sequence[str]) -> dict[str, Literal["waiting", "quarantined"]]:
        """Where each of ``ids`` is; ids in neither table are left out (unknown)."""
        found: dict[str, Literal["waiting", "quarantined"]] = self._read(
            self._locate_batch, builtins.list(ids)
        )
        return found

    def absorb(self, other: OperatorQueries) -> tuple[int, int]:
        """Move every message of ``other``'s file into this one; returns ``(waiting,
        quarantined)`` moved.

        Rows move a chunk at a time, each chunk committed here before it is deleted
        there: a crash in between leaves a message in both files (sent twice at worst,
        never lost; an id already here is not added).
        """
        waiting = quarantined = 0
        # Rows move one by one, with their own ids: the other file's blocks first become
        # their members' rows.
        other._call(_split_all, None)
        while rows := other._read(_take_rows, ("outbox", "seq DESC", _WAITING_COLUMNS)):
            rows.reverse()
            self._call(_prepend_waiting, rows)
            other._call(_delete_rows, ("outbox", [r[0] for r in rows]))
            waiting += len(rows)
        while rows := other._read(_take_rows, ("quarantine", "seq", _QUARANTINE_COLUMNS)):
            self._call(_append_quarantined, rows)
            other._call(_delete_rows, ("quarantine", [r[0] for r in rows]))
            quarantined += len(rows)
        for queries in (self, other):
            queries._call(queries._recount_batch, None)
        return waiting, quarantined

    # --- writer-thread handlers -----------------------------------------------------------

    def _locate_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        results: builtins.list[object] = []
        for ids in payloads:
            found: dict[str, str] = {}
            for start in range(0, len(ids), _MAX_SELECTED):
                chunk = ids[start : start + _MAX_SELECTED]
                marks = ",".join("?" * len(chunk))
                for table, place in (("outbox", "waiting"), ("quarantine", "quarantined")):
                    for (found_id,) in conn.execute(
                        f"SELECT id FROM {table} WHERE id IN ({marks})", chunk
                    ):
                        found[found_id] = place
            wanted = set(ids) - found.keys()
            if wanted:
                for _, member_ids in block_members(conn):
                    for member in wanted.intersection(member_ids):
                        found[member] = "waiting"
            results.append(found)
        return HandlerResult(results)

    def _recount_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        return HandlerResult([None] * len(payloads), self._tally.recounted(conn))

    def _waiting_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        return HandlerResult([_waiting(conn, limit, offset) for limit, offset in payloads])

    def _destinations_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        query = (
            "SELECT destination, sum(count) FROM outbox GROUP BY destination"
            " ORDER BY 2 DESC, 1 LIMIT ?"
        )
        return HandlerResult(
            [[(str(d), int(n)) for d, n in conn.execute(query, (limit,))] for limit in payloads]
        )

    def _quarantined_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        return _entries(conn, payloads, _QUARANTINED, QuarantinedEntry)

    def _replay_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        results: builtins.list[object] = []
        added: builtins.list[tuple[bytes | None, int]] = []
        replayed: builtins.list[str] = []
        for payload in payloads:
            where, params = _selection(payload)
            rows = conn.execute(
                "DELETE FROM quarantine" + where + " RETURNING id, target, destination, key,"
                " headers, body, created_at, size, seq",
                params,
            ).fetchall()
            rows.sort(key=lambda r: r[8])
            conn.executemany(
                "INSERT OR IGNORE INTO outbox (id, target, destination, key, headers, body,"
                " created_at, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [r[:8] for r in rows],
            )
            added.extend((r[3], r[7]) for r in rows)
            replayed.extend(r[0] for r in rows)
            results.append(len(rows))
        # A lease still held on a replayed id (its row was quarantined by a forwarder
        # whose lease had run out and been taken over) would hold back its key.
        return HandlerResult(results, self._tally.restored(added, settled=replayed))

    def _purge_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        results: builtins.list[object] = []
        dropped_q = 0
        removed: builtins.list[tuple[bytes | None, int]] = []
        purged: builtins.list[str] = []
        for payload in payloads:
            selected, waiting, quarantined = payload
            where, params = _selection(selected)
            n = (
                conn.execute("DELETE FROM quarantine" + where, params).rowcount
                if quarantined
                else 0
            )
            dropped_q += n
            if waiting:
                if selected:
                    # A purged member leaves its block: the block becomes rows first.
                    chosen = set(selected)
                    split(conn, [seq for seq, ids in block_members(conn) if chosen & set(ids)])
                gone = conn.execute(
                    "DELETE FROM outbox" + where + " RETURNING id, key, size, count, block",
                    params,
                ).fetchall()
                for message_id, key, size, count, block in gone:
                    removed.append((key, size))
                    if block is None:
                        purged.append(message_id)
                    else:
                        removed.extend(repeat((key, 0), count - 1))
                        purged.extend(unpack(block)[0])
                    n += count
            results.append(n)
        # The leases of purged rows end with them: a lease left behind would hold back
        # its key (nothing else of that key is claimed) until it ran out.
        return HandlerResult(
            results, self._tally.removed(removed, quarantined=-dropped_q, settled=purged)
        )


def _entries(
    conn: sqlite3.Connection,
    payloads: builtins.list[Any],
    query: str,
    entry: type[QuarantinedEntry],
) -> HandlerResult[object]:
    """One page of entries per ``(limit, offset)`` payload."""
    results: builtins.list[object] = []
    for limit, offset in payloads:
        results.append(
            [
                entry(make_envelope(*r[:6]), r[6], r[7], r[8], r[9])
                for r in conn.execute(query, (limit, offset))
            ]
        )
    return HandlerResult(results)


def _waiting(conn: sqlite3.Connection, limit: int, offset: int) -> builtins.list[OutboxEntry]:
    """One page of waiting messages, a block's members each an entry of its own."""
    page: builtins.list[OutboxEntry] = []
    position = 0
    for row in conn.execute(_WAITING):
        if len(page) >= limit:
            break
        count, block = row[10], row[11]
        if position + count <= offset:
            position += count
            continue
        shared = (row[6], row[7], row[8], row[9])
        if block is None:
            page.append(OutboxEntry(make_envelope(*row[:6]), *shared))
            position += 1
            continue
        destination, key, headers, created_at = row[1], row[2], row[3], row[5]
        for member_id, body in zip(*unpack(block), strict=True):
            if position >= offset and len(page) < limit:
                envelope = make_envelope(member_id, destination, key, headers, body, created_at)
                page.append(OutboxEntry(envelope, *shared))
            position += 1
    return page


def _split_all(conn: sqlite3.Connection, payloads: builtins.list[Any]) -> HandlerResult[object]:
    """Every block of the file as its members' rows."""
    split(conn, [seq for seq, _ in block_members(conn)])
    return HandlerResult([None] * len(payloads))


def _selection(ids: builtins.list[str] | None) -> tuple[str, tuple[str, ...]]:
    if ids is None:
        return "", ()
    if not ids:
        return " WHERE 0", ()
    if len(ids) > _MAX_SELECTED:
        raise OutboxError(f"select at most {_MAX_SELECTED} ids at once")
    return f" WHERE id IN ({','.join('?' * len(ids))})", tuple(ids)


def _take_rows(conn: sqlite3.Connection, payloads: builtins.list[Any]) -> HandlerResult[object]:
    """Rows ``(seq, columns...)`` of one table in one order, a bounded chunk."""
    results: builtins.list[object] = []
    for table, order, columns in payloads:
        rows: builtins.list[tuple[Any, ...]] = []
        size = 0
        for row in conn.execute(
            f"SELECT seq, {columns} FROM {table} ORDER BY {order} LIMIT {_ABSORB_ROWS}"
        ):
            rows.append(row)
            size += row[8]
            if size >= _ABSORB_BYTES:
                break
        results.append(rows)
    return HandlerResult(results)


def _prepend_waiting(
    conn: sqlite3.Connection, payloads: builtins.list[Any]
) -> HandlerResult[object]:
    """Insert waiting rows (ascending) ahead of every row of the queue: ``seq`` values
    below the smallest one present (negative ones are fine for SQLite)."""
    for rows in payloads:
        # A block's members take the seq values up to its own (msgsafe.outbox._blocks).
        first = conn.execute("SELECT min(seq - count + 1) FROM outbox").fetchone()[0]
        base = (1 if first is None else int(first)) - len(rows)
        conn.executemany(
            f"INSERT OR IGNORE INTO outbox (seq, {_WAITING_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(base + i, *row[1:]) for i, row in enumerate(rows)],
        )
    return HandlerResult([None] * len(payloads))


def _append_quarantined(
    conn: sqlite3.Connection, payloads: builtins.list[Any]
) -> HandlerResult[object]:
    for rows in payloads:
        conn.executemany(
            f"INSERT OR IGNORE INTO quarantine ({_QUARANTINE_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [row[1:] for row in rows],
        )
    return HandlerResult([None] * len(payloads))


def _delete_rows(conn: sqlite3.Connection, payloads: builtins.list[Any]) -> HandlerResult[object]:
    for table, seqs in payloads:
        for start in range(0, len(seqs), _MAX_SELECTED):
            chunk = seqs[start : start + _MAX_SELECTED]
            conn.execute(f"DELETE FROM {table} WHERE seq IN ({','.join('?' * len(chunk))})", chunk)
    return HandlerResult([None] * len(payloads))
