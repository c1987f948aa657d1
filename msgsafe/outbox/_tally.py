"""The SQLite store's tally: what its file holds, counted in memory.

The file belongs to one process (see :mod:`msgsafe.outbox.sqlite`) and nobody else
writes it, so counts kept in memory stay exact as long as every commit that adds,
removes or moves rows updates them: how many rows wait and their payload bytes (the
``max_rows`` and ``max_bytes`` bounds, ``stats()``), how many are quarantined, how many
rows of each key wait (``has_key``, the key barrier, answered without a query), and when
the oldest waiting row was made (the ``max_age_s`` bound reads the file at most once a
second).

A change is handed to the writer as a function to run after its commit (a handler's
``after_commit``, see :mod:`msgsafe.outbox._writer`), so a rolled-back transaction
changes nothing here. A row that leaves the queue, or comes back to it from the
quarantine, ends its lease (:class:`~msgsafe.outbox._claims.Claims`) in the same step.

Both the store's own path (put, delivered, failed) and the operator's queries
(:mod:`msgsafe.outbox._sqlite_operator`: replay, purge, absorb) report here.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter

from msgsafe.outbox._claims import Claims, count_keys, subtract_counts
from msgsafe.outbox._rows import Rows

__all__ = ["Recount", "Tally", "recount"]

_FIRST, _SECOND = itemgetter(0), itemgetter(1)

#: Waiting rows, their payload bytes and the waiting rows per key, read from the file.
Recount = tuple[int, int, dict[bytes, int]]


@dataclass(slots=True)
class _Counts:
    rows: int = 0
    bytes: int = 0
    quarantined: int = 0


class Tally:
    """The counts of one store's file (see the module doc), and its leases' end.

    ``lock`` guards ``counts`` and ``keys`` for readers outside the writer; ``counts``
    may be replaced whole (:meth:`recounted`), so read it through the tally each time.
    ``oldest_at`` and ``oldest_checked`` are the writer's own: when the oldest waiting
    row was made (None: none waits, or not looked up yet) and when that was looked up
    (0.0: look again, the oldest row may be gone).
    """

    __slots__ = ("claims", "counts", "keys", "lock", "oldest_at", "oldest_checked")

    def __init__(self, claims: Claims) -> None:
        self.lock = threading.Lock()
        self.counts = _Counts()
        self.keys: dict[bytes, int] = {}
        self.claims = claims
        self.oldest_at: float | None = None
        self.oldest_checked = 0.0

    def load(self, conn: sqlite3.Connection) -> None:
        """Count everything from the file (on open, before anyone else uses the store)."""
        self.counts.rows, self.counts.bytes, self.keys = recount(conn)
        self.counts.quarantined = conn.execute("SELECT count(*) FROM quarantine").fetchone()[0]

    def added(self, accepted: list[Rows]) -> None:
        """The counts and key index after ``accepted`` puts committed."""
        with self.lock:
            counts, keys = self.counts, self.keys
            for batch in accepted:
                counts.rows += batch.count
                counts.bytes += batch.size
                for key in batch.keys:
                    keys[key] = keys.get(key, 0) + 1

    def replaced(self, waiting: Recount) -> None:
        """The waiting rows' counts and key index as :func:`recount` read them."""
        with self.lock:
            self.counts.rows, self.counts.bytes, self.keys = waiting

    def removed(
        self,
        removed: Iterable[tuple[bytes | None, int]],
        *,
        quarantined: int = 0,
        settled: Iterable[str] = (),
    ) -> Callable[[], None]:
        """What to do in memory once rows ``(key, size)`` left the queue, the quarantine
        changed by ``quarantined`` rows and the leases of ``settled`` ids ended (run
        after the commit)."""
        gone = list(removed)
        ended = list(settled)

        def apply() -> None:
            self.claims.drop(ended)
            self.oldest_checked = 0.0  # the oldest message may be gone
            # NOTE: C loops (map, count_keys): this runs for every row a drain removes.
            counts = count_keys(map(_FIRST, gone))
            with self.lock:
                self.counts.rows -= len(gone)
                self.counts.bytes -= sum(map(_SECOND, gone))
                self.counts.quarantined += quarantined
                subtract_counts(self.keys, counts)

        return apply

    def restored(
        self, added: Iterable[tuple[bytes | None, int]], *, settled: Iterable[str] = ()
    ) -> Callable[[], None]:
        """What to do in memory once quarantined rows ``(key, size)`` are back in the
        queue and the leases of ``settled`` ids ended (run after the commit)."""
        back = list(added)
        ended = list(settled)

        def apply() -> None:
            self.claims.drop(ended)
            with self.lock:
                self.counts.rows += len(back)
                self.counts.bytes += sum(size for _, size in back)
                self.counts.quarantined -= len(back)
                for key, _ in back:
                    if key is not None:
                        self.keys[key] = self.keys.get(key, 0) + 1

        return apply

    def recounted(self, conn: sqlite3.Connection) -> Callable[[], None]:
        """The counts and key index rebuilt from the file (after rows were moved in
        bulk), to apply after the commit."""
        rows, size, keys = recount(conn)
        quarantined = conn.execute("SELECT count(*) FROM quarantine").fetchone()[0]

        def apply() -> None:
            self.oldest_checked = 0.0
            with self.lock:
                self.counts = _Counts(rows, size, quarantined)
                self.keys = keys

        return apply


def recount(conn: sqlite3.Connection) -> Recount:
    """The waiting messages, their payload bytes and the waiting messages per key, from
    the file (a block counts its members: see msgsafe.outbox._blocks)."""
    rows, size = conn.execute(
        "SELECT coalesce(sum(count), 0), coalesce(sum(size), 0) FROM outbox"
    ).fetchone()
    keys = {
        bytes(key): n
        for key, n in conn.execute(
            "SELECT key, sum(count) FROM outbox WHERE key IS NOT NULL GROUP BY key"
        )
    }
    return rows, size, keys
