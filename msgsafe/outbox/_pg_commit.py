"""A put whose COMMIT may be lost in transit: knowing whether it happened.

A connection that breaks while COMMIT is on its way leaves the client not knowing:
the server may have committed (and the rows will be forwarded) or not (and they are
gone). :class:`PutAttempt` remembers what identifies the transaction — its 64-bit id
(``pg_current_xact_id()``, taken before COMMIT), the server it ran on (address, port,
postmaster start time) and its backend — and :func:`outcome` asks again on a new
connection:

- the same server, not restarted: ``pg_xact_status`` answers ``committed`` or
  ``aborted`` exactly (``in progress``: the old backend still finishes its COMMIT, e.g.
  waiting for a synchronous standby; polled until it ends or the deadline passes);
- another server (a fail-over: libpq's ``target_session_attrs=read-write`` found the
  promoted standby) or one restarted: transaction ids there need not mean the same
  transaction, so the answer is ``unknown``. The caller then puts the same rows again:
  ids are unique and the insert is ``ON CONFLICT (id) DO NOTHING``, so a row that did
  commit (and reached the standby: synchronous replication) is not doubled; only a row
  forwarded and deleted in between would be stored twice — a duplicate of a known id.

``send()`` reports ``STORED`` only after a COMMIT answered (see below).

A COMMIT that answers may still not be durable where the promise needs it: the server
commits locally first, then waits for its synchronous standbys, and a wait that is
cancelled (``pg_cancel_backend``, ``pg_terminate_backend``, a shutdown) ends with the
transaction committed on the primary alone, a WARNING that says so, and for a
cancel a COMMIT that answers success. :func:`standby_wait_cancelled` hears that
warning; the store then puts the same rows again: the insert changes nothing, but the
rows it finds are locked (a lock is written to the WAL, and a transaction that wrote
nothing would not wait), so the new transaction's COMMIT waits for the standbys, and it
can only be acknowledged once they hold everything before it, the first commit included. A lost
COMMIT that :func:`outcome` finds ``committed`` is put again for the same reason (it
may have been a terminated wait). ``STORED`` therefore never names a row that only the
primary holds.

A COMMIT may also never answer: a synchronous standby that does not acknowledge keeps
the primary's backend waiting. :class:`Watchdog` shuts the connection's socket at the
put's deadline (``write_timeout``), so the client stops waiting; the server keeps the
transaction's fate (it commits once the standby answers, or aborts with the backend),
and the put reports that it does not know
(:class:`~msgsafe.errors.StoreOutcomeUnknown`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

__all__ = [
    "Outcome",
    "PutAttempt",
    "Watchdog",
    "outcome",
    "rollback_open",
    "server_identity",
    "standby_wait_cancelled",
]

Outcome = Literal["committed", "aborted", "unknown"]
ServerIdentity = tuple[str, int, str]

_IDENTITY_SQL = (
    "SELECT coalesce(host(inet_server_addr()), ''), coalesce(inet_server_port(), 0),"
    " pg_postmaster_start_time()::text"
)


def rollback_open(conn: Any) -> Exception | None:
    """Roll back the transaction ``conn`` (a psycopg connection) has open, if any; a
    lost connection has none. None once none is open; the error of a ROLLBACK that
    failed otherwise (the connection is then of no further use)."""
    import psycopg  # the postgres extra: imported by the stores that call this
    from psycopg.pq import TransactionStatus

    if conn.closed or conn.broken or conn.info.transaction_status == TransactionStatus.IDLE:
        return None
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error as exc:
        return exc
    return None


def server_identity(conn: Any) -> ServerIdentity:
    """Which server (and which life of it) ``conn`` talks to."""
    row = conn.execute(_IDENTITY_SQL).fetchone()
    return (str(row[0]), int(row[1]), str(row[2]))


@dataclass(frozen=True, slots=True)
class PutAttempt:
    """One put's transaction, as far as it must be known to ask about it later."""

    xid: str  #: pg_current_xact_id() as text (xid8: no wrap-around)
    server: ServerIdentity
    backend_pid: int


def outcome(
    connect: Callable[[], Any],
    attempt: PutAttempt,
    *,
    deadline: float,
    poll_s: float = 0.05,
) -> Outcome:
    """Whether ``attempt`` committed, asked through ``connect()`` (a new connection,
    closed here) until ``deadline`` (``time.monotonic()``); see the module docstring."""
    conn = None
    try:
        while True:
            try:
                if conn is None:
                    conn = connect()
                if server_identity(conn) != attempt.server:
                    return "unknown"
                row = conn.execute("SELECT pg_xact_status(%s::xid8)", (attempt.xid,)).fetchone()
                status = None if row is None else row[0]
            except Exception:  # the server is still away: ask again until the deadline
                if conn is not None:
                    conn.close()
                    conn = None
                status = "retry"
            if status == "committed":
                return "committed"
            if status == "aborted":
                return "aborted"
            if status is None:
                return "unknown"
            if time.monotonic() >= deadline:
                return "unknown"
            time.sleep(poll_s)  # the old backend still commits, or the server restarts
    finally:
        if conn is not None:
            conn.close()


class Watchdog:
    """Shuts the socket ``fd`` (both ways) at ``deadline`` (``time.monotonic()``) unless
    the ``with`` block ended first: whatever waits on it then fails at once. ``fired``
    says whether it did. Shutting (not closing) leaves the descriptor to its owner."""

    def __init__(self, fd: int, deadline: float) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._over = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        with self._lock:
            if self._over:
                return
            self.fired = True
            try:
                with socket.socket(fileno=os.dup(self._fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed: nothing waits on it
                pass

    def __enter__(self) -> Self:
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._over = True
        self._timer.cancel()


#: What PostgreSQL says when a COMMIT stops waiting for its synchronous standbys (the
#: WARNING's detail; its headline names the cause: a cancel, a terminate, a shutdown).
_NOT_REPLICATED = "might not have been replicated"


@contextmanager
def standby_wait_cancelled(conn: Any) -> Iterator[list[str]]:
    """While the block runs (a COMMIT), collect the server's warnings that the
    transaction committed locally without its synchronous standbys' acknowledgement;
    the list yielded is empty when there were none."""
    heard: list[str] = []

    def notice(diag: Any) -> None:
        detail = str(diag.message_detail or "")
        primary = str(diag.message_primary or "")
        if _NOT_REPLICATED in detail or "synchronous replication" in primary:
            heard.append(primary)

    conn.add_notice_handler(notice)
    try:
        yield heard
    finally:
        conn.remove_notice_handler(notice)
