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

__all__ = ["Listener", "busy_keys_sql", "claim_sql", "keys_sql", "lock_sql"]

log = logging.getLogger("msgsafe.outbox")

_RETURNING = "RETURNING seq, id, destination, key, headers, body, created_at, lease_epoch"


def keys_sql(table: str) -> str:
    """Keys whose first waiting row is ready and not behind a leased row, in queue order,
    found among the first ``scan`` ready rows (params: now, scan, keys). The keys are
    put in queue order before the leased ones are left out (``OFFSET 0`` keeps the
    planner from turning that round), so only the keys looked at until ``keys`` are
    found are checked, each by one probe of the ``(key, ready_at)`` index: a window of
    many keys costs a probe per key taken, not one per key in the window."""
    t = table
    return f"""
        SELECT h.key FROM (
            SELECT w.key, min(w.seq) AS first FROM (
                SELECT key, seq FROM {t}
                WHERE ready_at <= %(now)s AND key IS NOT NULL
                ORDER BY seq LIMIT %(scan)s) AS w
            GROUP BY w.key ORDER BY first OFFSET 0) AS h
        WHERE h.first < coalesce((
            SELECT min(p.seq) FROM {t} AS p
            WHERE p.key = h.key AND p.ready_at > %(now)s), 9223372036854775807)
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
    through the ``(seq) WHERE key IS NULL`` index, and at most ``per_key`` rows of each
    locked key through the ``(key, seq)`` index, before the first row of the key that is
    leased (its fence, found through the ``(key, ready_at)`` index)."""
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
                    SELECT w.seq FROM {t} AS w
                    WHERE w.key = k.key AND w.ready_at <= %(now)s
                      AND w.seq < coalesce((
                          SELECT min(p.seq) FROM {t} AS p
                          WHERE p.key = k.key AND p.ready_at > %(now)s),
                          9223372036854775807)
                    ORDER BY w.seq LIMIT %(per_key)s) AS r
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
