"""Key-level leases on a PostgreSQL outbox shared by many forwarders, and their wake-ups.

The order promise across forwarders: messages of one key reach the consumer in key
order by first arrival, however many producers and forwarders share the table. It rests
on one rule — a key is forwarded by one forwarder at a time, always from its first
waiting row — kept by these mechanisms:

- **the lease** of a key is the ``ready_at`` of its claimed rows: a claim sets it to
  ``now + lease``; while any earlier row of a key is leased, no claim takes a later one.
  A forwarder that dies (SIGKILL) holds its keys until the lease runs out (the store's
  ``lease_s``, 10 s by default); the next claim after that takes the key from its first
  waiting row, so what the dead one had in flight is sent again (duplicates of known
  ids, in order) and nothing overtakes it.
- **the claim** of a key is serialised: a claim transaction first picks the keys whose
  first waiting row is free, in queue order, and takes a transaction-scoped advisory lock
  on each (``pg_try_advisory_xact_lock``: a key another claim holds is skipped, as rows
  are with ``SKIP LOCKED``), then claims rows of only those keys (and keyless rows, with
  ``FOR UPDATE SKIP LOCKED``) in a statement whose snapshot sees every lease committed
  before it got the locks. Two claims racing for one key cannot both take it, which a
  single ``SKIP LOCKED`` statement does not ensure: it does not see another claim's
  uncommitted leases. A claim takes at most ``keys`` keys, so that forwarders share them,
  from four times as many candidates, so that claims racing for the first keys of the
  queue do not come back empty.
  A claimer stopped inside that transaction holds its keys' locks while it is stopped:
  the claim caps its transaction's idle time at about a lease
  (``idle_in_transaction_session_timeout``, local to the transaction), after which the
  server ends the session and the keys are free, as a dead claimer's are.
- **the epoch** of a lease is the ``lease_epoch`` its claim writes on every row it
  leases: the claim transaction's id (``pg_current_xact_id()``), so a later claim always
  writes a greater one. The store remembers the epoch of each row it claimed, and
  settles a row (deletes it once confirmed, releases it, quarantines it) only while the
  row still carries that epoch: a forwarder paused past its lease (SIGSTOP, a stalled
  VM) whose keys another forwarder took over meanwhile leaves those rows to their new
  holder, logs once at WARNING, and claims again. Before it publishes a claim that has
  grown old, a forwarder renews it (``renew``), on the same condition, and gives the
  claim up unsent when it is lost.
- **settling a key's rows back to ready** (a release, a retry, a renewal given up) takes
  the key's advisory lock for its transaction first (``pg_try_advisory_xact_lock``): a
  claim racing it skips the key, instead of skipping the row being released (``SKIP
  LOCKED``) and taking a later row of the key ahead of it. Settling never waits: rows
  of a key whose lock another transaction holds, or rows locked by one, are left as
  they are (leased until their lease runs out). Deleting a confirmed row needs no key
  lock: a claim that skips it skips a message already received.

What a paused forwarder does to per-key order. The guarantee: for each key, the first
copies of its messages that a consumer of the destination (one queue or partition, read
in order) receives come in the order the rows were stored (``seq``); later copies are
duplicates of known ids. Why it holds with a stale claimer too: every claim of a key
starts at the key's first waiting row (the key locks above keep a claim from skipping
an earlier row that is being released), and a row leaves the table only once a broker
confirmed it (or it is quarantined). So whatever a claimer sends of a key is a run, in
order on one channel and stopped at its first failure, whose predecessors were all in
the destination before the claim; interleaving such runs, however many claimers sent
the key and however late, can only add copies. The epoch bounds
those copies: a forwarder that learns its lease is lost sends nothing more of that claim,
and its late settling can neither delete rows another forwarder still sends nor make
them ready for a third. What it had handed to the broker before the pause (the round in
flight, or a round published in the instant between the renewal and the publish) may
still arrive after the new holder's copies: duplicates of known ids, after their first
arrival.

:class:`Listener` is the wake-up: every put (and replay) ends with ``pg_notify`` on the
table's channel, delivered when it commits; a forwarder's listener thread wakes it at
once instead of polling hot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ClaimCursor", "Listener", "busy_keys_sql", "claim_sql", "keys_sql", "lock_sql"]

log = logging.getLogger("msgsafe.outbox")

_RETURNING = "RETURNING seq, id, destination, key, headers, body, created_at, lease_epoch"


def keys_sql(table: str) -> str:
    """Keys whose first waiting row is ready and not behind a leased row, in queue order,
    found among the first ``scan`` ready rows from seq ``after`` on (params: now, scan,
    keys, after), each with the seq of the window's first row (its head). The keys are
    put in queue order before the leased ones are left out (``OFFSET 0`` keeps the
    planner from turning that round), so only the keys looked at until ``keys`` are
    found are checked, each by one probe of the ``(key, seq)`` index (is the key's first
    row ready?): a window of many keys costs a probe per key taken, not one per key in
    the window.

    ``after`` only bounds where keys are looked for (see :class:`ClaimCursor`): a claim
    of a key found there still starts at the key's first waiting row, however low."""
    t = table
    return f"""
        SELECT h.key, h.head FROM (
            SELECT w.key, min(w.seq) AS first, min(min(w.seq)) OVER () AS head FROM (
                SELECT key, seq FROM {t}
                WHERE ready_at <= %(now)s AND key IS NOT NULL AND seq >= %(after)s
                ORDER BY seq LIMIT %(scan)s) AS w
            GROUP BY w.key ORDER BY first OFFSET 0) AS h
        WHERE (
            SELECT p.ready_at FROM {t} AS p
            WHERE p.key = h.key ORDER BY p.seq LIMIT 1) <= %(now)s
        LIMIT %(keys)s"""


def lock_sql(table: str) -> str:
    """The first ``take`` keys of ``%(keys)s``, in their order, whose advisory lock this
    transaction got (params: keys, take). The candidates are more than ``take``: claims
    racing for the same first keys each get other ones instead of none. Locks are tried
    in order until ``take`` are held (``OFFSET 0`` keeps the order before the filter),
    so no key is locked that the claim does not take."""
    return f"""
        SELECT c.k FROM (
            SELECT u.k, u.i FROM unnest(%(keys)s::bytea[]) WITH ORDINALITY AS u(k, i)
            ORDER BY u.i OFFSET 0) AS c
        WHERE pg_try_advisory_xact_lock(hashtext('{table}'), hashtext(encode(c.k, 'hex')))
        LIMIT %(take)s"""


def claim_sql(table: str) -> str:
    """Lease ready rows of the locked keys (and keyless ones), key order kept, under the
    claim's epoch (params: now, until, keys, limit, per_key).

    Each part reads only what it may take, whatever the table's size: keyless rows
    through the ``(seq) WHERE key IS NULL`` index, and the first ``per_key`` rows of
    each locked key through the ``(key, seq)`` index, kept up to the first that is not
    ready (leased, or released until later: its fence).

    No index holds ``ready_at``, and the table leaves half of each page free
    (``fillfactor``): the lease is a HOT update, written on the row's own page with no
    new index entry (a lease that changed an indexed column would add one to every
    index of the table for each row claimed, and a dead one to walk until a vacuum)."""
    t = table
    return f"""
        UPDATE {t} SET ready_at = %(until)s, attempts = attempts + 1,
            lease_epoch = pg_current_xact_id()::text::bigint
        WHERE seq IN (
            SELECT o.seq FROM {t} AS o WHERE o.seq IN (
                SELECT f.seq FROM (
                    SELECT n.seq FROM {t} AS n
                    WHERE n.key IS NULL AND n.ready_at <= %(now)s
                    ORDER BY n.seq LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED) AS f
                UNION ALL
                SELECT r.seq FROM unnest(%(keys)s::bytea[]) AS k(key)
                CROSS JOIN LATERAL (
                    SELECT x.seq FROM (
                        SELECT w.seq, bool_or(w.ready_at > %(now)s)
                            OVER (ORDER BY w.seq) AS fenced
                        FROM {t} AS w WHERE w.key = k.key
                        ORDER BY w.seq LIMIT %(per_key)s) AS x
                    WHERE NOT x.fenced) AS r
                ORDER BY 1 LIMIT %(limit)s)
            FOR UPDATE SKIP LOCKED)
        {_RETURNING}"""


def busy_keys_sql(table: str) -> str:
    """Take the advisory lock of every key among the rows ``%(ids)s`` that is free, and
    return the keys whose lock another transaction holds (param: ids)."""
    t = table
    return f"""
        SELECT s.k FROM (
            SELECT DISTINCT key AS k FROM {t} WHERE id = ANY(%(ids)s) AND key IS NOT NULL
        ) AS s
        WHERE NOT pg_try_advisory_xact_lock(hashtext('{t}'), hashtext(encode(s.k, 'hex')))"""


class ClaimCursor:
    """Where a store's claims start looking for keys: the head of the ready rows the
    last claim found, so that the next one does not walk again what lies below it (the
    rows it deleted since, dead in the ``seq`` index until a vacuum, and the rows it
    holds). Below the head, when the claim found it, were rows not ready: leased,
    deleted, or not committed yet.

    It only bounds where keys are found: a key found above the cursor is claimed from
    its first waiting row, however low (per-key order does not depend on it). A row
    that becomes ready below it is found once the cursor is back at 0: when rows this
    store released are ready (:meth:`reset`), or when a claim found no key ready above
    it; within ``every_s`` when another process made it ready (a lease run out, a
    release, a producer's transaction that committed late). A claim that raced a reset
    leaves the cursor at 0. Times are the store's clock."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._after = 0
        self._since = 0.0
        #: When rows this store released are ready again (the cursor goes back then).
        self._due = float("inf")
        self._resets = 0

    def start(self, now: float) -> tuple[int, int]:
        """(The seq a claim at ``now`` starts from, a token for :meth:`found`)."""
        with self._lock:
            if now >= self._due:
                self._due = float("inf")
                self._after = 0
                self._resets += 1
            if self._after and now - self._since >= self.every_s:
                self._after = 0
            if not self._after:
                self._since = now
            return self._after, self._resets

    def found(self, head: int | None, token: int) -> None:
        """The claim started with ``token`` found the ready rows' head at ``head``
        (None: no key ready from its start: look from 0 next time)."""
        with self._lock:
            if token == self._resets:
                self._after = 0 if head is None else max(self._after, head)

    def reset(self, ready_at: float) -> None:
        """Rows below the cursor are ready again at ``ready_at`` (this store released
        them): the cursor goes back to 0 now and at that time."""
        with self._lock:
            self._after = 0
            self._resets += 1
            self._due = min(self._due, ready_at)


class Listener:
    """A daemon thread that LISTENs on ``channel`` through its own connection and calls
    ``wake()`` for each notification, and once after every (re)connect (rows may have
    come while it was away). Reconnects after a lost connection (a fail-over) with a
    capped backoff; :meth:`stop` ends it."""

    def __init__(self, connect: Callable[[], Any], channel: str, wake: Callable[[], None]) -> None:
        self._connect = connect
        self._channel = channel
        self._wake = wake
        self._stopping = threading.Event()
        self._conn: Any = None
        self._thread = threading.Thread(target=self._run, name="msgsafe-pg-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = 0.1
        while not self._stopping.is_set():
            try:
                conn = self._conn = self._connect()
                conn.execute(f"LISTEN {self._channel}")
                pause = 0.1
                self._wake()
                while not self._stopping.is_set():
                    for _ in conn.notifies(timeout=0.5, stop_after=1):
                        self._wake()
            except Exception as exc:  # lost connection, fail-over: listen again
                if self._stopping.is_set():
                    break
                log.info("outbox listener on %s reconnects: %s", self._channel, exc)
                self._close()
                self._stopping.wait(pause)
                pause = min(pause * 2, 2.0)
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing to save
                log.debug("closing the listener's connection failed", exc_info=True)

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread (within about half a second) and close its connection."""
        self._stopping.set()
        self._thread.join(timeout)
