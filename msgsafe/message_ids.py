"""Message ids: UUIDv7 text (RFC 9562), time ordered, unique across processes and
monotonic within a thread.

:func:`new_message_id` gives one id, :func:`new_message_ids` many at once (a batch's).
Each thread takes single ids from a pool of its own, so no lock is shared on that path;
a forked child (e.g. a Spark Python worker) starts with fresh pools and lock, so it
never hands out ids its parent had pooled. Also importable from :mod:`msgsafe.message`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

__all__ = ["new_message_id", "new_message_ids"]

_time_ns = time.time_ns
_uuid7_lock = threading.Lock()
#: The last sub-millisecond counter value taken (unix ms << 12 | counter).
_uuid7_last = 0

#: Largest pool of ids a thread makes at once (its pool grows while it runs dry within
#: a millisecond and shrinks to what it used when the millisecond turns).
_ID_POOL_MAX = 1024


#: Random bytes a thread fetches per ``os.urandom`` call for its pools: the call
#: releases the GIL, and with busy threads getting it back can take a switch interval.
_NOISE_CHUNK = 4096


class _IdPool(threading.local):
    """One thread's ids: made by new_message_ids, used within their millisecond."""

    def __init__(self) -> None:
        self.ms = -1
        #: The end of the pool's millisecond (time.time_ns()): its ids are used before it.
        self.until = 0
        self.size = 4
        self.ids: deque[str] = deque()
        #: self.ids.popleft: bound once per refill, not looked up per id.
        self.take = self.ids.popleft
        self.noise = b""
        self.noise_at = 0

    def next_noise(self) -> int:
        """64 random bits from this thread's buffer (refilled from os.urandom)."""
        at = self.noise_at
        if at + 8 > len(self.noise):
            self.noise = os.urandom(_NOISE_CHUNK)
            at = 0
        self.noise_at = at + 8
        return int.from_bytes(self.noise[at : at + 8], "big")


_id_pool = _IdPool()


def _ids_after_fork() -> None:
    # A forked child (e.g. a Spark Python worker) must not hand out the parent's pooled
    # ids; the lock may have been held by a thread that does not exist in the child.
    global _uuid7_lock, _id_pool
    _uuid7_lock = threading.Lock()
    _id_pool = _IdPool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids_after_fork)


def new_message_id() -> str:
    """A UUIDv7 string: time ordered, unique across processes, monotonic within a thread.

    NOTE: the stdlib gains uuid7 only in 3.14. Each thread takes its ids from its own
    pool, made by :func:`new_message_ids` and used only within its millisecond (so an
    id never carries an older time than the clock's): one id costs a clock read compared
    with the end of that millisecond and a ``deque.popleft`` bound at the refill. No lock
    is shared on this path: a lock held across the refill's ``os.urandom`` (which
    releases the GIL) made every sending thread queue behind it.
    """
    pool = _id_pool
    if _time_ns() < pool.until:
        try:
            return pool.take()
        except IndexError:
            pass
    return _refill_ids(pool)


def _refill_ids(pool: _IdPool) -> str:
    now_ms = time.time_ns() // 1_000_000
    if now_ms == pool.ms:
        # Ran dry within the millisecond: make more next time.
        pool.size = min(pool.size * 2, _ID_POOL_MAX)
    else:
        used = pool.size - len(pool.ids)
        pool.size = max(1, min(used * 2, _ID_POOL_MAX))
    ids = deque(_make_ids(pool.size, pool.next_noise()))
    first = ids.popleft()
    pool.ids = ids
    pool.take = ids.popleft
    pool.ms = now_ms
    pool.until = (now_ms + 1) * 1_000_000
    return first


def new_message_ids(count: int) -> list[str]:
    """``count`` UUIDv7 strings, time ordered and monotonic like
    :func:`new_message_id`, at a fraction of the cost per id.

    NOTE: RFC 9562 §6.2 method 2 ("monotonic random"): the batch takes one value of the
    process's sub-millisecond counter (``rand_a``) and 14 random bits, so its prefix
    differs from every other id of the process; within the batch the low 48 bits of
    ``rand_b`` count up from a random start. Each id is then one string format.
    """
    if count <= 0:
        return []
    if count > _BATCH_IDS_MAX:
        ids: list[str] = []
        for offset in range(0, count, _BATCH_IDS_MAX):
            ids.extend(new_message_ids(min(_BATCH_IDS_MAX, count - offset)))
        return ids
    ids = _make_ids(count, int.from_bytes(os.urandom(8), "big"))
    # This thread's pooled ids are older than these: the next single id comes from a
    # fresh pool, so the thread's ids stay in order.
    _id_pool.ms = -1
    _id_pool.until = 0
    return ids


def _make_ids(count: int, noise: int) -> list[str]:
    """``count`` ids (at most _BATCH_IDS_MAX) of one prefix, from 64 random bits."""
    global _uuid7_last
    now = time.time_ns() // 1_000_000 << 12
    with _uuid7_lock:
        stamp = now if now > _uuid7_last else _uuid7_last + 1
        _uuid7_last = stamp
    unix_ms = stamp >> 12
    ms_hex = f"{unix_ms & 0xFFFFFFFFFFFF:012x}"
    variant = 0x8000 | (noise >> 50 & 0x3FFF)
    # A start low enough that the counter cannot carry out of its 48 bits.
    first = (noise & 0xFFFFFFFFFFFF) % ((1 << 48) - count)
    prefix = f"{ms_hex[:8]}-{ms_hex[8:]}-7{stamp & 0xFFF:03x}-{variant:04x}-"
    # The counter's last two hex digits from a table, the rest formatted once per 256
    # ids: one string concatenation per id (a format per id cost several times more).
    ids: list[str] = []
    end = first + count
    at = first
    while at < end:
        high, low = divmod(at, 256)
        stop = min(end - high * 256, 256)
        ids.extend(map(f"{prefix}{high:010x}".__add__, _HEX2[low:stop]))
        at += stop - low
    return ids


#: "00" .. "ff": the last two hex digits of an id's counter (see _make_ids).
_HEX2 = [f"{i:02x}" for i in range(256)]


#: Ids made per prefix by new_message_ids (a bound on how far a counter start is drawn).
_BATCH_IDS_MAX = 1 << 20
