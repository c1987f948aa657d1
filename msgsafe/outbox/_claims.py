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

One exception, asked for by the caller (``follow``): a key whose held rows are all the
caller's, in flight on a transport that keeps the order of what it was handed across
rounds (Kafka: one partition per key, idempotent producer), continues past them with its
next rows, so that the next round goes out while the last is answered. The caller names
such a key with the number of its rows it holds; the claim follows the key only when
that is every held row of the key (no other forwarder holds one). A key that failed is
never followed: its failed rows are re-sent first, once nothing of the key is held.

A block (:mod:`msgsafe.outbox._blocks`) is claimed whole: its members, each a claimed
row with its own ``seq``, id and body, are held like rows, and :attr:`Claims.blocks`
remembers which block each came from until it is settled, so that the store removes a
block whose members were all confirmed in one statement (or splits it).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

from msgsafe.message import Envelope
from msgsafe.outbox._blocks import members
from msgsafe.outbox._rows import ClaimedRows

__all__ = ["Claims", "count_keys", "subtract_counts"]

#: Ready rows in queue order, without the keys whose earliest row waits for a retry time.
_READY = """
SELECT o.seq, o.id, o.destination, o.key, o.headers, o.body, o.created_at, o.count, o.block
FROM outbox AS o
WHERE o.ready_at <= :now AND o.seq > :floor
  AND (o.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM outbox AS p
      WHERE p.key = o.key AND p.ready_at > :now AND p.seq < o.seq))
ORDER BY o.seq
"""

#: Lower than every seq (adopted rows get negative ones: see msgsafe.outbox.discovery).
_NO_SEQ = -(1 << 63)

#: How many messages up to a seq are ready: every held one is one of them (a held row is
#: in the file and was ready when claimed; whatever removes or releases a row ends its
#: lease in the same step), so the count equals the held messages exactly when no unheld
#: message up to that seq is ready. (A block's members are all at or below its seq.)
_READY_UPTO = "SELECT coalesce(sum(count), 0) FROM outbox WHERE seq <= ? AND ready_at <= ?"

#: Rows passed over (held, or behind a held row of their key) before a claim returns what
#: it found: several forwarders sharing a store must not each scan a hot key's backlog.
_SKIP_MIN = 10_000


_SEQ = itemgetter(0)
_ID = itemgetter(1)
_KEY = itemgetter(3)
_LEASE_KEY = itemgetter(0)


def count_keys(row_keys: Iterable[bytes | None]) -> Counter[bytes]:
    """How many of ``row_keys`` there are of each key (None, a row without a key, is
    not counted). A C loop: it runs over every row a drain holds or removes."""
    counts: Counter[Any] = Counter(row_keys)
    counts.pop(None, None)
    return counts


def subtract_counts(keys: dict[bytes, int], counts: Mapping[bytes, int]) -> None:
    """Take ``counts`` from the per-key counts ``keys``; a key that reaches 0 leaves."""
    for key, count in counts.items():
        left = keys.get(key, 0) - count
        if left > 0:
            keys[key] = left
        else:
            keys.pop(key, None)


class Claims:
    """The leases of one store's rows: ``id -> (key, until)``. Thread-safe.

    ``blocks``: the block ``seq`` of every claimed member of a block, until the member
    is settled (:meth:`drop`) or its block split (:meth:`unblock`); read and written by
    the store's writer thread only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[bytes | None, float]] = {}
        self.blocks: dict[str, int] = {}
        self._keys: dict[bytes, int] = {}
        #: No lease ends before this (a lower bound): most claims skip the expiry scan.
        self._soonest = float("inf")
        #: No held row has a higher seq (an upper bound; _NO_SEQ: nothing held).
        self._top = _NO_SEQ

    def claim(
        self,
        conn: sqlite3.Connection,
        now: float,
        limit: int,
        lease_s: float,
        follow: Mapping[bytes, int] | None = None,
    ) -> Sequence[Envelope]:
        """Lease up to ``limit`` ready rows until ``now + lease_s`` (see the module doc);
        ``follow``: keys the caller may continue past, with how many rows it holds."""
        with self._lock:
            self._expire(now)
            held, keys = self._held, self._keys
            skip_max = max(_SKIP_MIN, 10 * limit)
            taken: list[Any] = []
            skipped = 0
            floor = self._floor(conn, now) if held else _NO_SEQ
            rows = conn.execute(_READY, {"now": now, "floor": floor})
            # A followed key's rows come after its held ones (a held prefix, in queue
            # order): it continues only once all of them were passed, never through a
            # gap (an unheld row before a held one).
            go_on = {k: n for k, n in follow.items() if keys.get(k) == n} if follow else {}
            if not held or (floor > _NO_SEQ and len(go_on) == len(keys)):
                # Nothing held (the last round was settled), or only rows at or below the
                # floor, of keys all followed (a drain's round in flight): no filter.
                for row in rows:
                    if row[8] is None:
                        taken.append(row)
                    else:
                        self._take_block(row, taken)
                    if len(taken) >= limit:
                        break
            else:
                # Every held row is at or below the floor: passed, when the scan starts
                # above it.
                passed = dict(go_on) if floor > _NO_SEQ else dict.fromkeys(go_on, 0)
                for row in rows:
                    key = row[3]
                    if row[1] in held:  # a block's first member: the block is held
                        if key in passed:
                            passed[key] += row[7]
                    elif key is None or key not in keys or passed.get(key) == go_on.get(key, -1):
                        if row[8] is None:
                            taken.append(row)
                        else:
                            self._take_block(row, taken)
                        if len(taken) >= limit:
                            break
                        continue
                    else:
                        # An unheld row skipped: a later row of its key would overtake it.
                        go_on.pop(key, None)
                    skipped += 1
                    if skipped > skip_max:
                        break
            if taken:
                self._hold(taken, now + lease_s)
        return ClaimedRows(taken)

    def _floor(self, conn: sqlite3.Connection, now: float) -> int:
        """The seq after which the claim's scan may start: the highest held one when
        every ready row up to it is held (the usual case while a round is in flight:
        its rows are the oldest), so that they are not read again; else _NO_SEQ."""
        top, held = self._top, self._held
        if top == _NO_SEQ:
            return _NO_SEQ
        (ready,) = conn.execute(_READY_UPTO, (top, now)).fetchone()
        return top if ready == len(held) else _NO_SEQ

    def _take_block(self, row: Sequence[Any], taken: list[Any]) -> None:
        """Add block ``row``'s members to ``taken`` and remember their block."""
        claimed = members(row, row[8])
        taken += claimed
        self.blocks.update(zip(map(_ID, claimed), repeat(row[0])))

    def drop(self, ids: Iterable[str]) -> None:
        """The rows ``ids`` were settled (removed, released or quarantined)."""
        ids = list(ids)
        with self._lock:
            self._unhold(ids)
        if self.blocks:
            self.unblock(ids)

    def unblock(self, ids: Iterable[str]) -> None:
        """Members ``ids`` are no longer in a block (it was split or removed)."""
        deque(map(self.blocks.pop, ids, repeat(None)), maxlen=0)  # a C loop

    def clear(self) -> None:
        """Forget every lease (the file is being reopened or replaced)."""
        self.blocks.clear()
        with self._lock:
            self._held.clear()
            self._keys.clear()
            self._soonest = float("inf")
            self._top = _NO_SEQ

    # NOTE: map/zip/Counter are C loops: a drain holds and drops every row it sends,
    # and a Python loop per row here was a fifth of the forwarder's CPU.

    def _hold(self, rows: list[Any], until: float) -> None:
        row_keys = list(map(_KEY, rows))
        self._held.update(zip(map(_ID, rows), zip(row_keys, repeat(until)), strict=False))
        self._soonest = min(self._soonest, until)
        self._top = max(self._top, max(map(_SEQ, rows)))
        keys = self._keys
        for key, count in count_keys(row_keys).items():
            keys[key] = keys.get(key, 0) + count

    def _unhold(self, ids: Iterable[str]) -> None:
        entries = map(self._held.pop, ids, repeat(None))
        subtract_counts(self._keys, count_keys(map(_LEASE_KEY, filter(None, entries))))
        if not self._held:
            self._soonest = float("inf")
            self._top = _NO_SEQ

    def _expire(self, now: float) -> None:
        # A lease that ran out makes its row claimable again (its forwarder died or
        # hangs): a late confirm of the first attempt only makes a duplicate.
        if self._soonest > now:
            return
        held = self._held
        self._unhold([mid for mid, (_, until) in held.items() if until <= now])
        self._soonest = min((until for _, until in held.values()), default=float("inf"))
