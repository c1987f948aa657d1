"""The inbox in PostgreSQL (psycopg 3), for a fleet of consumers on one database.

:meth:`PostgresInbox.process` sends ``BEGIN`` and, as the transaction's first statement,
``INSERT … ON CONFLICT (message_id) DO NOTHING RETURNING``: a concurrent transaction
that inserted the same id first makes this insert wait on the unique index until it
ends — committed: no row comes back and ``work`` is not called; rolled back: the row is
inserted here and ``work`` runs. So exactly one transaction per id runs ``work`` to a
commit, whichever host it comes from. Then ``work(tx)`` — ``tx`` the
:class:`psycopg.Connection` in that transaction — and ``COMMIT``.

Made for PgBouncer in transaction mode: no prepared statements (``prepare_threshold=
None``), no session state (no ``SET``, ``LISTEN`` or temporary tables); every
transaction is explicit.

Fail-over (the outbox's URL, :mod:`msgsafe.outbox._pg_url`: libpq's host list with
``target_session_attrs=read-write``): a connection lost before ``COMMIT`` was sent
rolled the transaction back, so the call starts again on a new connection (``work``
runs again); a connection lost during ``COMMIT`` is resolved by asking the server
(:mod:`msgsafe.outbox._pg_commit`): committed — the call returns ``ran=True``; aborted,
or unknown after a fail-over — the call starts again, and the insert tells whether the
id made it (``ran=False``: it did, through the synchronous standby) or not (``work``
runs). Until ``write_timeout``; then :class:`~msgsafe.errors.InboxUnavailable`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from msgsafe.errors import ClosedError, ConfigurationError, InboxError, InboxUnavailable
from msgsafe.inbox._schema import (
    DEFAULT_TABLE,
    SCHEMA_VERSION,
    InboxSql,
    check_id,
    check_older_than,
    check_records,
    check_table,
    check_version,
    fresh_indexes,
)
from msgsafe.outbox._pg_commit import (
    PutAttempt,
    ServerIdentity,
    outcome,
    rollback_open,
    server_identity,
)
from msgsafe.outbox._pg_errors import first_cause
from msgsafe.outbox._pg_url import parse_store_url, redact_conninfo
from msgsafe.ports import InboxCapabilities, Processed, ProcessedBatch

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.pq import TransactionStatus
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from msgsafe.errors import MissingExtra

    raise MissingExtra("postgres", "psycopg") from exc

__all__ = ["PostgresInbox"]

log = logging.getLogger("msgsafe.inbox")

_R = TypeVar("_R")
_T = TypeVar("_T")

#: Errors after which a new connection may succeed: the server went away (a fail-over,
#: a restart), or the host libpq found takes no writes (yet), or a repeatable-read
#: snapshot met a concurrent insert of the same id.
_AGAIN = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    pg_errors.ReadOnlySqlTransaction,
    pg_errors.SerializationFailure,
)


class _Again(Exception):
    """An attempt to make again on a new connection (internal)."""


class _WorkFailed(Exception):
    """``work`` raised ``error`` (rolled back): it goes to the caller unchanged, not
    retried nor translated (internal)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


@dataclass(slots=True)
class _Session:
    conn: psycopg.Connection[Any]
    server: ServerIdentity


class PostgresInbox:
    """An :class:`~msgsafe.ports.InboxStore` in PostgreSQL tables (created if missing:
    ``table``, ``<table>_attempts``, ``<table>_schema``).

    ``conninfo`` is a libpq connection string or URL; it is never shown in errors,
    logs or ``repr``. Threads: every thread gets a connection of its own (opened on its
    first call, made anew when lost, kept until :meth:`close`: use it from a pool of
    long-lived threads), so handlers on a worker pool run their transactions side by
    side; ``tx`` belongs to the calling thread and is not to be kept after ``work``
    returns. ``write_timeout``: how long a call keeps
    trying new connections through a fail-over before it raises
    :class:`~msgsafe.errors.InboxUnavailable`. ``clock`` (epoch seconds) stamps records.
    """

    #: Batches: :meth:`process_batch` and :meth:`record_attempts`.
    capabilities: ClassVar[InboxCapabilities] = InboxCapabilities(batch=True)

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = DEFAULT_TABLE,
        write_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = check_table(table)
        self._conninfo = conninfo
        #: The conninfo without its password, for repr, logs and errors.
        self.redacted = redact_conninfo(conninfo)
        self.write_timeout = write_timeout
        self._clock = clock
        self._sql = InboxSql(table, "%s", "double precision")
        self._handled_sql = f"SELECT message_id FROM {table} WHERE message_id = ANY(%s)"
        self._record_many_sql = (
            f"INSERT INTO {table} (message_id, source, attempt, handled_at)"
            " SELECT m, s, a, %s FROM unnest(%s::text[], %s::text[], %s::integer[]) AS r(m, s, a)"
            " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
        )
        self._forget_many_sql = f"DELETE FROM {table}_attempts WHERE message_id = ANY(%s)"
        counters = f"{table}_attempts"
        self._count_many_sql = (
            f"INSERT INTO {counters} (message_id, source, attempts, updated_at)"
            " SELECT m, s, 1, %s FROM unnest(%s::text[], %s::text[]) AS r(m, s)"
            f" WHERE NOT EXISTS (SELECT 1 FROM {table} h WHERE h.message_id = r.m)"
            f" ON CONFLICT (message_id) DO UPDATE SET attempts = {counters}.attempts + 1,"
            " source = excluded.source, updated_at = excluded.updated_at"
            " RETURNING message_id, attempts"
        )
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list[_Session] = []
        self._closed = False
        try:
            self._retrying("open", self._create)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresInbox:
        """The inbox a ``postgresql://user:pw@h1:5432,h2:5432/db?table=T`` URL names
        (default table ``msgsafe_inbox``; ``&write_timeout=S`` sets ``write_timeout``),
        with libpq's multi-host fail-over as the PostgreSQL outbox has it
        (:mod:`msgsafe.outbox._pg_url`). ``options`` as for the constructor."""
        parsed = parse_store_url(url, table=DEFAULT_TABLE, store="inbox")
        if parsed.lease_s is not None:
            raise ConfigurationError("lease is an outbox option; an inbox URL takes none")
        if parsed.write_timeout_s is not None:
            options.setdefault("write_timeout", parsed.write_timeout_s)
        store = cls(parsed.conninfo, table=parsed.table, **options)
        store.redacted = parsed.redacted
        return store

    @property
    def table(self) -> str:
        """The table holding handled message ids."""
        return self._table

    # --- connections -----------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        # NOTE: PgBouncer in transaction mode hands each transaction to any server
        # connection: a statement prepared on one would be missing on the next.
        return psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=None)

    def _session(self) -> _Session:
        """This thread's session, (re)connected when there is none or it was lost."""
        if self._closed:
            raise ClosedError("the inbox is closed")
        session: _Session | None = getattr(self._local, "session", None)
        if session is not None and not (session.conn.closed or session.conn.broken):
            return session
        if session is not None:
            self._drop(session)
        conn = self._connect()
        try:
            session = _Session(conn, server_identity(conn))
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self._closed:
                conn.close()
                raise ClosedError("the inbox is closed")
            self._sessions.append(session)
        self._local.session = session
        return session

    def _drop(self, session: _Session) -> None:
        """Close ``session`` (lost, or its transaction state unknown) and forget it."""
        session.conn.close()
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)
        if getattr(self._local, "session", None) is session:
            self._local.session = None

    def _failed(self, what: str, exc: BaseException) -> InboxError:
        # One line, the first cause (libpq's multi-line dump stays in __cause__), as the
        # outbox's errors say it.
        return InboxError(f"PostgreSQL inbox {self._table} ({what}): {first_cause(exc)}")

    def _retrying(self, what: str, attempt: Callable[[_Session, float], _T]) -> _T:
        """``attempt(session, deadline)``'s answer; made again on a new connection while
        it fails as :data:`_AGAIN` says (or raises :class:`_Again`), until
        ``write_timeout`` has passed: then :class:`InboxUnavailable`. Other database
        errors are :class:`InboxError`; anything else propagates."""
        deadline = time.monotonic() + self.write_timeout
        pause = 0.05
        while True:
            session: _Session | None = None
            try:
                session = self._session()
                return attempt(session, deadline)
            except (_Again, *_AGAIN) as exc:
                if session is not None and (
                    session.conn.closed
                    or session.conn.broken
                    or session.conn.info.transaction_status != TransactionStatus.IDLE
                ):
                    self._drop(session)
                if time.monotonic() >= deadline:
                    raise InboxUnavailable(
                        f"PostgreSQL inbox {self._table} took no {what} within"
                        f" {self.write_timeout:g} s: {first_cause(exc)}",
                        endpoint=self.redacted,
                    ) from exc
                log.info("inbox %s on %s retried: %s", what, self.redacted, exc)
            except psycopg.Error as exc:
                if session is not None:
                    _rollback(session.conn)
                raise self._failed(what, exc) from exc
            time.sleep(pause)  # the server is away (a fail-over): try again shortly
            pause = min(pause * 2, 1.0)

    def _create(self, session: _Session, deadline: float) -> None:
        conn = session.conn
        with conn.transaction():
            # Serialise concurrent first opens: CREATE ... IF NOT EXISTS can race.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._table,))
            for statement in self._sql.schema:
                conn.execute(statement)
            row = conn.execute(self._sql.version).fetchone()
            found = None if row is None else row[0]
            check_version(found, self._table)
            if found is None:
                conn.execute(self._sql.stamp, (SCHEMA_VERSION,))

    # --- the InboxStore protocol ------------------------------------------------------------

    def process(
        self, message_id: str, work: Callable[[Any], _R], *, source: str, attempt: int = 1
    ) -> Processed[_R]:
        """Run ``work(tx)`` and record ``message_id`` in one transaction, unless it is
        recorded already (then ``ran=False``, ``work`` not called); see the module
        docstring and :class:`~msgsafe.ports.InboxStore`."""
        check_id(message_id, source)

        def once(session: _Session, deadline: float) -> Processed[_R]:
            return self._process_once(session, deadline, message_id, work, source, attempt)

        try:
            return self._retrying("process", once)
        except _WorkFailed as failed:
            raise failed.error from failed.error.__cause__
        except InboxError as exc:
            raise exc.with_id(message_id) from exc

    def _process_once(
        self,
        session: _Session,
        deadline: float,
        message_id: str,
        work: Callable[[Any], _R],
        source: str,
        attempt: int,
    ) -> Processed[_R]:
        conn = session.conn
        # One round trip for BEGIN, the record, the attempt counter and the xid.
        with conn.pipeline():
            conn.execute("BEGIN")
            recorded = conn.execute(self._sql.record, (message_id, source, attempt, self._clock()))
            conn.execute(self._sql.forget_attempts, (message_id,))
            xid_cur = conn.execute("SELECT pg_current_xact_id()::text")
        if recorded.fetchone() is None:
            conn.execute("ROLLBACK")
            return Processed(ran=False)
        xid_row = xid_cur.fetchone()
        assert xid_row is not None
        put = PutAttempt(str(xid_row[0]), session.server, conn.info.backend_pid)
        return Processed(
            ran=True, value=self._work_and_commit(session, deadline, put, work, message_id)
        )

    def _work_and_commit(
        self,
        session: _Session,
        deadline: float,
        put: PutAttempt,
        work: Callable[[Any], _R],
        message_id: str,
    ) -> _R:
        """``work(tx)`` in the open transaction, then ``COMMIT``: its answer once the
        commit is known to have happened; :class:`_Again` when it is not (or the
        connection was lost in ``work``), :class:`_WorkFailed` when ``work`` raised."""
        conn = session.conn
        try:
            value = work(conn)
        except Exception as exc:
            if conn.broken or conn.closed:
                # Lost with the connection: nothing was committed; run it all again.
                raise _Again(f"connection lost in work: {type(exc).__name__}: {exc}") from exc
            _rollback(conn)
            raise _WorkFailed(exc) from exc
        except BaseException:
            _rollback(conn)
            raise
        status = conn.info.transaction_status
        if status != TransactionStatus.INTRANS:
            _rollback(conn)
            raise InboxError(
                "work ended the inbox's transaction or swallowed a failed statement"
                f" (transaction {status.name}): it must only write through tx",
                message_id=message_id,
            )
        try:
            conn.execute("COMMIT")
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._drop(session)
            known = outcome(self._connect, put, deadline=deadline)
            log.warning(
                "inbox %s on %s: the connection was lost during COMMIT (%s); the "
                "transaction is %s%s",
                message_id,
                self.redacted,
                exc,
                known,
                "" if known == "committed" else ": processed again",
            )
            if known == "committed":
                return value
            raise _Again(f"COMMIT {known}") from exc
        return value

    def process_batch(
        self, records: Sequence[tuple[str, str, int]], work: Callable[[list[int], Any], _R]
    ) -> ProcessedBatch[_R]:
        """Record the ids of ``records`` (``(id, source, attempt)``) not recorded yet and
        run ``work(fresh, tx)`` for them, in one transaction, with :meth:`process`'s
        fail-over; see :class:`~msgsafe.ports.BatchInboxStore`."""
        check_records(records)
        if not records:
            return ProcessedBatch(())
        columns = (
            [r[0] for r in records],
            [r[1] for r in records],
            [r[2] for r in records],
        )

        def once(session: _Session, deadline: float) -> ProcessedBatch[_R]:
            return self._batch_once(session, deadline, records, columns, work)

        try:
            return self._retrying("process_batch", once)
        except _WorkFailed as failed:
            raise failed.error from failed.error.__cause__
        except InboxError as exc:
            raise exc.with_id(records[0][0]) from exc

    def _batch_once(
        self,
        session: _Session,
        deadline: float,
        records: Sequence[tuple[str, str, int]],
        columns: tuple[list[str], list[str], list[int]],
        work: Callable[[list[int], Any], _R],
    ) -> ProcessedBatch[_R]:
        conn = session.conn
        ids = columns[0]
        # One round trip for BEGIN, the records, the attempt counters and the xid.
        with conn.pipeline():
            conn.execute("BEGIN")
            recorded = conn.execute(self._record_many_sql, (self._clock(), *columns))
            conn.execute(self._forget_many_sql, (ids,))
            xid_cur = conn.execute("SELECT pg_current_xact_id()::text")
        inserted = {str(row[0]) for row in recorded.fetchall()}
        if not inserted:
            conn.execute("ROLLBACK")
            return ProcessedBatch(())
        fresh = fresh_indexes(records, inserted)
        xid_row = xid_cur.fetchone()
        assert xid_row is not None
        put = PutAttempt(str(xid_row[0]), session.server, conn.info.backend_pid)
        value = self._work_and_commit(
            session, deadline, put, lambda tx: work(fresh, tx), records[fresh[0]][0]
        )
        return ProcessedBatch(tuple(fresh), value)

    def record_attempts(self, items: Sequence[tuple[str, str]]) -> dict[str, int]:
        """One more attempt at each id of ``items`` (``(id, source)``) not handled yet,
        in one statement (its own transaction); their counts (a handled id is absent).
        As with :meth:`record_attempt`, a lost commit may count one too many."""
        for message_id, source in items:
            check_id(message_id, source)
        if not items:
            return {}
        ids, sources = [i[0] for i in items], [i[1] for i in items]

        def count(session: _Session, deadline: float) -> dict[str, int]:
            rows = session.conn.execute(
                self._count_many_sql, (self._clock(), ids, sources)
            ).fetchall()
            return {str(row[0]): int(row[1]) for row in rows}

        return self._retrying("record_attempts", count)

    def handled(self, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` are recorded (one query)."""
        if not message_ids:
            return set()
        wanted = list(message_ids)

        def ask(session: _Session, deadline: float) -> set[str]:
            rows = session.conn.execute(self._handled_sql, (wanted,)).fetchall()
            return {str(r[0]) for r in rows}

        return self._retrying("handled", ask)

    def record_attempt(self, message_id: str, *, source: str) -> int:
        """One more attempt at ``message_id``, committed (one statement, its own
        transaction); the count so far (1 at first). A connection lost while that
        statement commits makes it run again: the count may then be one too high,
        never too low."""
        check_id(message_id, source)

        def count(session: _Session, deadline: float) -> int:
            row = session.conn.execute(
                self._sql.count_attempt, (message_id, source, self._clock())
            ).fetchone()
            assert row is not None
            return int(row[0])

        return self._retrying("record_attempt", count)

    def prune(self, *, older_than_s: float) -> int:
        """Forget ids recorded more than ``older_than_s`` seconds ago (and attempt
        counters not touched for that long), in one transaction; how many ids. See the
        retention rule in :mod:`msgsafe.inbox`."""
        cutoff = self._clock() - check_older_than(older_than_s)

        def delete(session: _Session, deadline: float) -> int:
            conn = session.conn
            with conn.transaction():
                removed = conn.execute(self._sql.prune, (cutoff,)).rowcount
                conn.execute(self._sql.prune_attempts, (cutoff,))
            return int(removed)

        removed = self._retrying("prune", delete)
        log.info("inbox %s: %d ids older than %g s pruned", self.redacted, removed, older_than_s)
        return removed

    def close(self) -> None:
        """Close every thread's connection. Idempotent."""
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.conn.close()

    def __repr__(self) -> str:
        return f"PostgresInbox({self.redacted!r}, table={self._table!r})"


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """Roll back an open transaction, if any (a lost connection has none to roll back)."""
    failed = rollback_open(conn)
    if failed is not None:
        log.debug("inbox rollback failed", exc_info=failed)
