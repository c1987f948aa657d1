"""Bounded memories of message ids: for dropping redeliveries and retried duplicates
(:class:`DedupWindow`), and for counting each message's deliveries
(:class:`AttemptMemory`)."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Collection
from typing import TypeVar

__all__ = ["AttemptMemory", "DedupWindow"]

V = TypeVar("V")


def _put_newest(ids: OrderedDict[str, V], message_id: str, value: V, capacity: int) -> None:
    """``ids[message_id] = value`` as the newest entry; the oldest beyond ``capacity`` go."""
    if message_id in ids:
        ids.move_to_end(message_id)
    ids[message_id] = value  # a new key goes to the end by itself
    while len(ids) > capacity:
        ids.popitem(last=False)


class DedupWindow:
    """The message ids seen lately: at least the last ``capacity``, at most twice that,
    the oldest forgotten first. Thread-safe.

    Bounded on purpose: memory stays flat however long a consumer runs. A duplicate
    older than the window passes through — size the window to cover the redelivery
    horizon (in-flight window + outbox backlog) of the producers you read from.

    Two generations of at most ``capacity`` ids each (as the producer's memory of
    recent ids, :mod:`msgsafe._recent_ids`): an id goes into the newer; once that is
    full it becomes the older and the oldest generation is dropped whole. An id seen
    again while in the older is copied into the newer (kept as recently used). Each
    step is a dict operation, atomic under the interpreter lock; only the swap of the
    generations takes the lock. No per-id bookkeeping of age, which an ordered dict's
    move-to-end cost on every look-up.
    """

    __slots__ = ("_lock", "_new", "_old", "capacity")

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._new: dict[str, None] = {}
        self._old: dict[str, None] = {}
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        """True if ``message_id`` was recorded and is still in the window."""
        if message_id in self._new:
            return True
        if message_id in self._old:
            self.record(message_id)
            return True
        return False

    def knows_none(self, message_ids: Collection[str | None]) -> bool:
        """True if no id of ``message_ids`` is in the window (a batch of new ids, told
        with two set operations, no step per id). Unlike :meth:`seen`, keeps no id."""
        return self._new.keys().isdisjoint(message_ids) and self._old.keys().isdisjoint(message_ids)

    def record(self, message_id: str) -> None:
        """Remember ``message_id``; forget the oldest generation once the newer is full."""
        new = self._new
        new[message_id] = None
        if len(new) >= self.capacity:
            with self._lock:
                if self._new is new:
                    self._old, self._new = new, {}

    def __len__(self) -> int:
        """How many ids the window remembers now."""
        return len(self._new.keys() | self._old.keys())


class AttemptMemory:
    """Deliveries per message id within this process: an
    :class:`~msgsafe.ports.AttemptCounter` over the last ``capacity`` unsettled ids,
    oldest forgotten first. Thread-safe.

    Bounded as :class:`DedupWindow` is: a message forgotten here (or delivered before a
    restart) counts from 1 again, from 2 when the broker marks it redelivered.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        #: Ids forgotten and not dropped from ``_counts`` yet (see :meth:`forget`).
        self._forgotten: deque[str] = deque()

    def delivered(self, message_id: str, *, redelivered: bool) -> int:
        counts = self._counts
        with self._lock:
            if self._forgotten:
                self._drop_forgotten()
            before = counts.get(message_id)
            if before is None:
                # The common case, a first delivery: the new id goes to the end as is.
                attempt = 2 if redelivered else 1
                counts[message_id] = attempt
                if len(counts) > self.capacity:
                    counts.popitem(last=False)
                return attempt
            attempt = max(before + 1, 2) if redelivered else before + 1
            _put_newest(counts, message_id, attempt, self.capacity)
            return attempt

    def delivered_first(self, message_ids: list[str]) -> bool:
        """Count a first delivery of each of ``message_ids`` (none marked redelivered)
        when all are new here and distinct: each is attempt 1, and True. Otherwise
        nothing is counted and False: count them one by one with :meth:`delivered`.

        The common batch, counted with one lock and no Python call per id."""
        counts = self._counts
        with self._lock:
            if self._forgotten:
                self._drop_forgotten()
            if not counts.keys().isdisjoint(message_ids) or len(set(message_ids)) != len(
                message_ids
            ):
                return False
            counts.update(dict.fromkeys(message_ids, 1))
            popitem, capacity = counts.popitem, self.capacity
            while len(counts) > capacity:
                popitem(last=False)
            return True

    def retried(self, message_id: str, attempt: int) -> None:
        with self._lock:
            if self._forgotten:
                self._drop_forgotten()
            attempt = max(attempt, self._counts.get(message_id, 0))
            _put_newest(self._counts, message_id, attempt, self.capacity)

    def forget(self, message_id: str) -> None:
        # NOTE: queued (a deque's append is atomic: no lock), dropped by the next call
        # that takes the lock, before it looks: one lock per batch, not per message.
        self._forgotten.append(message_id)

    def forget_all(self, message_ids: list[str]) -> None:
        """:meth:`forget` each of ``message_ids`` (one call for a run of them)."""
        self._forgotten.extend(message_ids)

    def _drop_forgotten(self) -> None:
        """Drop the ids :meth:`forget` queued (with ``_lock`` held)."""
        forgotten, pop = self._forgotten, self._counts.pop
        while forgotten:
            pop(forgotten.popleft(), None)

    def __len__(self) -> int:
        with self._lock:
            self._drop_forgotten()
            return len(self._counts)
