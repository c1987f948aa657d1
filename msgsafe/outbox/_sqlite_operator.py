"""The operator's side of the SQLite outbox: list what waits, inspect the quarantine,
replay it, purge.

Split from :mod:`msgsafe.outbox.sqlite` along the line between the store contract that
the producer and the forwarder rely on (:class:`~msgsafe.ports.OutboxStore`: put,
claim, delivered, failed, release, stats) and the queries a person runs through
``msgsafe outbox``. Both go through the same writer (one connection, group commit) and
keep the same in-memory counters: :class:`OperatorQueries` is a base of
:class:`~msgsafe.outbox.SqliteOutbox`, which provides the writer calls and the counter
updates declared at the end of the class.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from msgsafe.errors import OutboxError
from msgsafe.outbox._rows import OutboxEntry, QuarantinedEntry, make_envelope
from msgsafe.outbox._writer import Handler, HandlerResult

__all__ = ["OperatorQueries"]

#: Ids one replay or purge may name (SQLite's variable limit is 32766).
_MAX_SELECTED = 30000

_WAITING = (
    "SELECT id, destination, key, headers, body, created_at, target, attempts,"
    " ready_at, last_error FROM outbox ORDER BY seq LIMIT ? OFFSET ?"
)
_QUARANTINED = (
    "SELECT id, destination, key, headers, body, created_at, target, attempts,"
    " error, quarantined_at FROM quarantine ORDER BY seq LIMIT ? OFFSET ?"
)


class OperatorQueries:
    """``list``, ``quarantined``, ``replay`` and ``purge`` of a SQLite outbox."""

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

    def replay(self, ids: Sequence[str] | Literal["all"]) -> int:
        """Move quarantined messages back to the end of the queue; returns how many."""
        selected = None if ids == "all" else builtins.list(ids)
        moved: int = self._call(self._replay_batch, selected)
        return moved

    def purge(self, ids: Sequence[str] | Literal["all"], *, waiting: bool = False) -> int:
        """Delete quarantined messages (``ids`` or ``"all"``) for good; with
        ``waiting=True`` also waiting ones. Returns how many were deleted."""
        selected = None if ids == "all" else builtins.list(ids)
        deleted: int = self._call(self._purge_batch, (selected, waiting))
        return deleted

    # --- writer-thread handlers -----------------------------------------------------------

    def _waiting_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        return _entries(conn, payloads, _WAITING, OutboxEntry)

    def _quarantined_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        return _entries(conn, payloads, _QUARANTINED, QuarantinedEntry)

    def _replay_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        results: builtins.list[object] = []
        added: builtins.list[tuple[bytes | None, int]] = []
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
            results.append(len(rows))
        return HandlerResult(results, self._restore(added))

    def _purge_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        results: builtins.list[object] = []
        dropped_q = 0
        removed: builtins.list[tuple[bytes | None, int]] = []
        for payload in payloads:
            selected, waiting = payload
            where, params = _selection(selected)
            n = conn.execute("DELETE FROM quarantine" + where, params).rowcount
            dropped_q += n
            if waiting:
                gone = conn.execute(
                    "DELETE FROM outbox" + where + " RETURNING key, size", params
                ).fetchall()
                removed.extend(gone)
                n += len(gone)
            results.append(n)
        return HandlerResult(results, self._remove(removed, quarantined=-dropped_q))

    # --- provided by the store --------------------------------------------------------------

    def _call(self, handler: Handler, payload: object) -> Any:
        """Run ``handler`` in a write transaction of the store's writer; its result."""
        raise NotImplementedError

    def _read(self, handler: Handler, payload: object) -> Any:
        """Run ``handler`` in a read transaction of the store's writer; its result."""
        raise NotImplementedError

    def _remove(
        self, removed: Iterable[tuple[bytes | None, int]], *, quarantined: int = 0
    ) -> Callable[[], None]:
        """The counter update for rows that left the queue (and the quarantine change)."""
        raise NotImplementedError

    def _restore(self, added: Iterable[tuple[bytes | None, int]]) -> Callable[[], None]:
        """The counter update for quarantined rows back in the queue."""
        raise NotImplementedError


def _entries(
    conn: sqlite3.Connection,
    payloads: builtins.list[Any],
    query: str,
    entry: type[OutboxEntry] | type[QuarantinedEntry],
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


def _selection(ids: builtins.list[str] | None) -> tuple[str, tuple[str, ...]]:
    if ids is None:
        return "", ()
    if not ids:
        return " WHERE 0", ()
    if len(ids) > _MAX_SELECTED:
        raise OutboxError(f"select at most {_MAX_SELECTED} ids at once")
    return f" WHERE id IN ({','.join('?' * len(ids))})", tuple(ids)
