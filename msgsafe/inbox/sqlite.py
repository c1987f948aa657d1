"""The inbox in a SQLite database: the handler's own file, or one beside it.

``work(tx)`` gets a :class:`sqlite3.Connection` in autocommit mode
(``isolation_level=None``) inside a transaction the inbox opened with ``BEGIN
IMMEDIATE``: it takes the database's write lock at once, so two processes (or threads)
handling the same id serialise there, and the second finds the id recorded. ``work``
writes through ``tx`` and must not commit or roll back (nor use ``with tx:``, which
commits): the inbox commits the id and ``work``'s writes together. The database runs in
WAL mode with ``synchronous=FULL``: a commit that returned survives a crash of the
process or the machine.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, unquote

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
from msgsafe.ports import InboxCapabilities, Processed, ProcessedBatch

__all__ = ["SqliteInbox", "parse_sqlite_url"]

log = logging.getLogger("msgsafe.inbox")

_R = TypeVar("_R")


class SqliteInbox:
    """An :class:`~msgsafe.ports.InboxStore` in the SQLite database at ``path`` (created
    if missing, tables ``table``, ``<table>_attempts`` and ``<table>_schema``).

    Threads: every thread gets a connection of its own (opened on its first call,
    kept until :meth:`close`: use it from a pool of long-lived threads); ``tx``
    belongs to the thread that called :meth:`process` and is not to be kept after
    ``work`` returns. Writers — threads and processes —
    take turns on SQLite's write lock for the whole of ``work``: keep ``work`` short. A
    writer that waits longer than ``busy_timeout`` seconds for the lock gets
    :class:`~msgsafe.errors.InboxUnavailable` (nothing recorded). ``clock`` (epoch
    seconds) stamps records and is what :meth:`prune` measures age by.
    """

    #: Batches: :meth:`process_batch` and :meth:`record_attempts`.
    capabilities: ClassVar[InboxCapabilities] = InboxCapabilities(batch=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str = DEFAULT_TABLE,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = check_table(table)
        self.path = os.path.abspath(os.fspath(path))
        self.busy_timeout = busy_timeout
        self._clock = clock
        self._sql = InboxSql(table, "?", "REAL", keyed=True)
        self._handled_sql = (
            f"SELECT message_id FROM {table} WHERE message_id IN (SELECT value FROM json_each(?))"
        )
        # NOTE: one statement for many rows, its parameters one JSON array: sqlite3's
        # executemany returns no rows (RETURNING), and a statement per row is a call
        # into SQLite per row. "WHERE true": SQLite's parser reads "ON" after a bare
        # "FROM" as a join's.
        rows = "json_each(?) AS j"
        first, second, third = "j.value ->> 0", "j.value ->> 1", "j.value ->> 2"
        self._record_many_sql = (
            f"INSERT INTO {table} (message_id, source, attempt, handled_at)"
            f" SELECT {first}, {second}, {third}, ? FROM {rows} WHERE true"
            " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
        )
        self._forget_many_sql = (
            f"DELETE FROM {table}_attempts WHERE message_id IN (SELECT value FROM json_each(?))"
        )
        counters = f"{table}_attempts"
        self._count_many_sql = (
            f"INSERT INTO {counters} (message_id, source, attempts, updated_at)"
            f" SELECT {first}, {second}, 1, ? FROM {rows}"
            f" WHERE NOT EXISTS (SELECT 1 FROM {table} h WHERE h.message_id = {first})"
            f" ON CONFLICT (message_id) DO UPDATE SET attempts = {counters}.attempts + 1,"
            " source = excluded.source, updated_at = excluded.updated_at"
            " RETURNING message_id, attempts"
        )
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._closed = False
        conn = self._connection()
        self._begin(conn)
        try:
            for statement in self._sql.schema:
                conn.execute(statement)
            found = conn.execute(self._sql.version).fetchone()[0]
            check_version(found, table)
            if found is None:
                conn.execute(self._sql.stamp, (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        except BaseException as exc:
            _rollback(conn)
            self.close()
            if isinstance(exc, sqlite3.Error):
                raise self._failed("open", exc) from exc
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteInbox:
        """The inbox a ``sqlite:`` URL names (see :func:`msgsafe.inbox.open_inbox`)."""
        path, table, busy = parse_sqlite_url(url)
        if table is not None:
            options.setdefault("table", table)
        if busy is not None:
            options.setdefault("busy_timeout", busy)
        return cls(path, **options)

    @property
    def table(self) -> str:
        """The table holding handled message ids."""
        return self._table

    # --- connections -----------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise ClosedError("the inbox is closed")
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,  # close() closes every thread's connection
                )
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
            except sqlite3.Error as exc:
                raise self._failed("open", exc) from exc
            self._conns.append(conn)
        self._local.conn = conn
        return conn

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``: the write lock now, waiting up to ``busy_timeout``."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise InboxUnavailable(
                f"SQLite inbox {self.path}: no write lock within {self.busy_timeout:g} s: {exc}"
            ) from exc
        except sqlite3.Error as exc:
            raise self._failed("begin", exc) from exc

    def _failed(self, what: str, exc: sqlite3.Error) -> InboxError:
        return InboxError(f"SQLite inbox {self.path} ({what}): {type(exc).__name__}: {exc}")

    # --- the InboxStore protocol ------------------------------------------------------------

    def process(
        self, message_id: str, work: Callable[[Any], _R], *, source: str, attempt: int = 1
    ) -> Processed[_R]:
        """Run ``work(tx)`` and record ``message_id`` in one transaction, unless it is
        recorded already (then ``ran=False``, ``work`` not called); see
        :class:`~msgsafe.ports.InboxStore`."""
        check_id(message_id, source)
        conn = self._connection()
        self._begin(conn)
        try:
            inserted = conn.execute(
                self._sql.record, (message_id, source, attempt, self._clock())
            ).fetchone()
            if inserted is None:
                conn.execute("ROLLBACK")
                return Processed(ran=False)
            conn.execute(self._sql.forget_attempts, (message_id,))
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("record", exc).with_id(message_id) from exc
        return Processed(ran=True, value=self._work_and_commit(conn, work, message_id))

    def _work_and_commit(
        self, conn: sqlite3.Connection, work: Callable[[Any], _R], message_id: str
    ) -> _R:
        """``work(tx)`` in the open transaction, then ``COMMIT``: its answer; rolled back
        when ``work`` raises, refused when it ended the transaction itself."""
        try:
            value = work(conn)
        except BaseException:
            _rollback(conn)
            raise
        if not conn.in_transaction:
            raise InboxError(
                "work committed or rolled back the inbox's transaction: it must only write"
                " through tx",
                message_id=message_id,
            )
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("commit", exc).with_id(message_id) from exc
        return value

    def process_batch(
        self, records: Sequence[tuple[str, str, int]], work: Callable[[list[int], Any], _R]
    ) -> ProcessedBatch[_R]:
        """Record the ids of ``records`` (``(id, source, attempt)``) not recorded yet and
        run ``work(fresh, tx)`` for them, in one transaction; see
        :class:`~msgsafe.ports.BatchInboxStore`."""
        check_records(records)
        if not records:
            return ProcessedBatch(())
        conn = self._connection()
        self._begin(conn)
        try:
            inserted = conn.execute(
                self._record_many_sql, (self._clock(), json.dumps(records))
            ).fetchall()
            if not inserted:
                conn.execute("ROLLBACK")
                return ProcessedBatch(())
            ids = json.dumps([row[0] for row in inserted])
            conn.execute(self._forget_many_sql, (ids,))
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("record", exc).with_id(records[0][0]) from exc
        fresh = fresh_indexes(records, {row[0] for row in inserted})
        value = self._work_and_commit(conn, lambda tx: work(fresh, tx), records[fresh[0]][0])
        return ProcessedBatch(tuple(fresh), value)

    def record_attempts(self, items: Sequence[tuple[str, str]]) -> dict[str, int]:
        """One more attempt at each id of ``items`` (``(id, source)``) not handled yet,
        committed in one statement; their counts (a handled id is absent)."""
        for message_id, source in items:
            check_id(message_id, source)
        if not items:
            return {}
        conn = self._connection()
        self._begin(conn)
        try:
            rows = conn.execute(self._count_many_sql, (self._clock(), json.dumps(items))).fetchall()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("record_attempts", exc).with_id(items[0][0]) from exc
        return {str(row[0]): int(row[1]) for row in rows}

    def handled(self, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` are recorded (one query)."""
        if not message_ids:
            return set()
        conn = self._connection()
        try:
            rows = conn.execute(self._handled_sql, (json.dumps(list(message_ids)),)).fetchall()
        except sqlite3.Error as exc:
            raise self._failed("handled", exc) from exc
        return {str(r[0]) for r in rows}

    def record_attempt(self, message_id: str, *, source: str) -> int:
        """One more attempt at ``message_id``, committed; the count so far (1 at first)."""
        check_id(message_id, source)
        conn = self._connection()
        self._begin(conn)
        try:
            row = conn.execute(
                self._sql.count_attempt, (message_id, source, self._clock())
            ).fetchone()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("record_attempt", exc).with_id(message_id) from exc
        return int(row[0])

    def prune(self, *, older_than_s: float) -> int:
        """Forget ids recorded more than ``older_than_s`` seconds ago (and attempt
        counters not touched for that long); how many ids. See the retention rule in
        :mod:`msgsafe.inbox`."""
        cutoff = self._clock() - check_older_than(older_than_s)
        conn = self._connection()
        self._begin(conn)
        try:
            removed = conn.execute(self._sql.prune, (cutoff,)).rowcount
            conn.execute(self._sql.prune_attempts, (cutoff,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self._failed("prune", exc) from exc
        log.info("inbox %s: %d ids older than %g s pruned", self.path, removed, older_than_s)
        return int(removed)

    def close(self) -> None:
        """Close every thread's connection. Idempotent."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def __repr__(self) -> str:
        return f"SqliteInbox({self.path!r}, table={self._table!r})"


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back whatever transaction is open (none: nothing to do)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # the transaction is gone with the error that ended it
            log.debug("inbox rollback failed", exc_info=True)


def parse_sqlite_url(url: str) -> tuple[str, str | None, float | None]:
    """``(path, table, busy_timeout)`` of a ``sqlite:`` inbox URL; ``path`` absolute
    (a relative one resolved against the working directory now)."""
    if not url.lower().startswith("sqlite:"):
        raise ConfigurationError(f"a SQLite inbox URL starts with sqlite:, not {url!r}")
    rest, _, query = url[len("sqlite:") :].partition("?")
    if rest.startswith("//"):
        after = rest[2:]
        if not after.startswith("/"):
            raise ConfigurationError(
                "a SQLite inbox URL is sqlite:///absolute/path or sqlite:relative/path,"
                f" not {url!r} (no host part)"
            )
        path = "/" + unquote(after).lstrip("/")
    else:
        path = unquote(rest)
    if not path:
        raise ConfigurationError(f"the SQLite inbox URL {url!r} names no file")
    params = dict(parse_qsl(query, keep_blank_values=True))
    table = params.pop("table", None)
    busy_text = params.pop("busy_timeout", None)
    if params:
        raise ConfigurationError(f"unknown SQLite inbox options: {', '.join(sorted(params))}")
    busy: float | None = None
    if busy_text is not None:
        try:
            busy = float(busy_text)
        except ValueError:
            raise ConfigurationError(f"busy_timeout must be seconds, not {busy_text!r}") from None
        if not busy > 0:
            raise ConfigurationError("busy_timeout must be > 0 seconds")
    return os.path.abspath(path), table, busy
