"""Claims of the SQLite outbox: which waiting rows a forwarder holds, kept in memory.

A claim is a read, not a write. The file belongs to one process (see
:mod:`msgsafe.outbox.sqlite`), so a lease only has to be known to this process; and a
lease written to the file would be useless after a crash anyway, since opening the file
makes every row ready again. What a crash can do without written leases: the rows a
forwarder had claimed and published, but not yet removed, are published again by the
next process — a duplicate of a known id, never a loss. So no claim pays a commit, and
the drain's only commits are the removal of what the broker confirmed and the release
of what it did not.

The claim keeps the store's order contract: oldest first, and for each key a prefix of
its queue — a key whose earlier row is held (leased here) or waits for a retry time
(``ready_at`` in the file) gives nothing until that row is settled.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from typing import Any

from msgsafe.message import Envelope
from msgsafe.outbox._rows import make_envelope

__all__ = ["Claims"]

#: Ready rows in queue order, without the keys whose earliest row waits for a retry time.
_READY = """
SELECT o.seq, o.id, o.destination, o.key, o.headers, o.body, o.created_at FROM outbox AS o
WHERE o.ready_at <= :now
  AND (o.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM outbox AS p
      WHERE p.key = o.key AND p.ready_at > :now AND p.seq < o.seq))
ORDER BY o.seq
"""

#: Rows passed over (held, or behind a held row of their key) before a claim returns what
#: it found: several forwarders sharing a store must not each scan a hot key's backlog.
_SKIP_MIN = 10_000


class Claims:
    """The leases of one store's rows: ``id -> (key, until)``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[bytes | None, float]] = {}
        self._keys: dict[bytes, int] = {}

    def claim(
        self, conn: sqlite3.Connection, now: float, limit: int, lease_s: float
    ) -> list[Envelope]:
        """Lease up to ``limit`` ready rows until ``now + lease_s`` (see the module doc)."""
        with self._lock:
            self._expire(now)
            held, keys = self._held, self._keys
            skip_max = max(_SKIP_MIN, 10 * limit)
            taken: list[Any] = []
            skipped = 0
            rows = conn.execute(_READY, {"now": now})
            if not held:
                # Nothing held (the usual claim: the last round was settled): no filter.
                taken.extend(rows.fetchmany(limit))
            else:
                for row in rows:
                    key = row[3]
                    if row[1] in held or (key is not None and key in keys):
                        skipped += 1
                        if skipped > skip_max:
                            break
                        continue
                    taken.append(row)
                    if len(taken) >= limit:
                        break
            until = now + lease_s
            for row in taken:
                self._hold(row[1], row[3], until)
        return [make_envelope(*row[1:]) for row in taken]

    def drop(self, ids: Iterable[str]) -> None:
        """The rows ``ids`` were settled (removed, released or quarantined)."""
        with self._lock:
            for message_id in ids:
                self._unhold(message_id)

    def clear(self) -> None:
        """Forget every lease (the file is being reopened or replaced)."""
        with self._lock:
            self._held.clear()
            self._keys.clear()

    def _hold(self, message_id: str, key: bytes | None, until: float) -> None:
        self._held[message_id] = (key, until)
        if key is not None:
            self._keys[key] = self._keys.get(key, 0) + 1

    def _unhold(self, message_id: str) -> None:
        entry = self._held.pop(message_id, None)
        if entry is None or entry[0] is None:
            return
        key = entry[0]
        left = self._keys.get(key, 0) - 1
        if left > 0:
            self._keys[key] = left
        else:
            self._keys.pop(key, None)

    def _expire(self, now: float) -> None:
        # A lease that ran out makes its row claimable again (its forwarder died or
        # hangs): a late confirm of the first attempt only makes a duplicate.
        expired = [mid for mid, (_, until) in self._held.items() if until <= now]
        for message_id in expired:
            self._unhold(message_id)
