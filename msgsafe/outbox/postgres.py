"""The transactional outbox in PostgreSQL (psycopg 3).

``put_in(conn, envelopes)`` writes the rows through the caller's own connection, inside
the caller's open transaction: they become visible — and the forwarder publishes them —
only if that transaction commits; a rollback leaves nothing to publish. Everything else
(claims, deliveries, quarantine) runs on the store's own connection.

Several processes may share the table: claims use ``FOR UPDATE SKIP LOCKED`` and
``has_key`` asks the database. Per-key order follows the ``seq`` the rows got at insert;
two transactions writing the same key at once commit in an order the database chooses,
so callers that need strict order for a key write it from one transaction at a time.
"""

from __future__ import annotations

import builtins
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    MissingExtra,
    OutboxError,
    OutboxFull,
)
from msgsafe.message import Envelope
from msgsafe.outbox._rows import (
    OutboxEntry,
    QuarantinedEntry,
    make_envelope,
    redact_target,
    row_headers,
)
from msgsafe.ports import OutboxStats

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("postgres", "psycopg") from exc

__all__ = ["PostgresOutbox"]

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_COLUMNS = "id, target, destination, key, headers, body, created_at, size"
_ROW = tuple[str, str, str, bytes | None, str | None, bytes, float, int]


class PostgresOutbox:
    """An :class:`~msgsafe.ports.OutboxStore` in a PostgreSQL table (created if missing),
    with quarantined messages in ``<table>_quarantine``.

    ``conninfo`` is a libpq connection string or URL; it is never shown in errors or
    ``repr``. ``max_rows`` bounds the waiting messages (checked on the store's own puts;
    ``put_in`` follows the caller's transaction and is not refused on the row bound).
    Thread-safe.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "msgsafe_outbox",
        target: str | None = None,
        max_rows: int = 10_000_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not _TABLE_NAME.match(table):
            raise ConfigurationError(
                f"table must be a lower-case SQL identifier (letters, digits, _), not {table!r}"
            )
        self._conninfo = conninfo
        self._table = table
        self._target = redact_target(target)
        self.max_rows = max_rows
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._conn: psycopg.Connection[Any] | None = None
        t, q = table, f"{table}_quarantine"
        self._sql = {
            "insert": f"INSERT INTO {t} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            "claim": f"""
                UPDATE {t} SET ready_at = %(until)s, attempts = attempts + 1
                WHERE seq IN (
                    SELECT o.seq FROM {t} AS o
                    WHERE o.ready_at <= %(now)s
                      AND (o.key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM {t} AS p
                          WHERE p.key = o.key AND p.ready_at > %(now)s AND p.seq < o.seq))
                    ORDER BY o.seq LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED)
                RETURNING seq, id, destination, key, headers, body, created_at""",
            "delivered": f"DELETE FROM {t} WHERE id = ANY(%s)",
            "retry": f"UPDATE {t} SET ready_at = %s, last_error = %s WHERE id = %s",
            "quarantine": f"""
                WITH moved AS (DELETE FROM {t} WHERE id = %s RETURNING *)
                INSERT INTO {q} ({_COLUMNS}, attempts, error, quarantined_at)
                SELECT {_COLUMNS}, attempts, %s, %s FROM moved
                ON CONFLICT (id) DO NOTHING""",
            "has_key": f"SELECT EXISTS (SELECT 1 FROM {t} WHERE key = %s)",
            "stats": f"SELECT count(*), coalesce(sum(size), 0), min(created_at) FROM {t}",
            "count_q": f"SELECT count(*) FROM {q}",
            "count": f"SELECT count(*) FROM {t}",
            "list": f"SELECT id, destination, key, headers, body, created_at, target, attempts,"
            f" ready_at, last_error FROM {t} ORDER BY seq LIMIT %s OFFSET %s",
            "quarantined": f"SELECT id, destination, key, headers, body, created_at, target,"
            f" attempts, error, quarantined_at FROM {q} ORDER BY seq LIMIT %s OFFSET %s",
        }
        self._schema = (
            f"""CREATE TABLE IF NOT EXISTS {t} (
                seq bigserial PRIMARY KEY,
                id text NOT NULL UNIQUE,
                target text NOT NULL,
                destination text NOT NULL,
                key bytea,
                headers text,
                body bytea NOT NULL,
                created_at double precision NOT NULL,
                size integer NOT NULL,
                ready_at double precision NOT NULL DEFAULT 0,
                attempts integer NOT NULL DEFAULT 0,
                last_error text)""",
            f"CREATE INDEX IF NOT EXISTS {t}_key_ready ON {t} (key, ready_at)"
            " WHERE key IS NOT NULL",
            f"""CREATE TABLE IF NOT EXISTS {q} (
                seq bigserial PRIMARY KEY,
                id text NOT NULL UNIQUE,
                target text NOT NULL,
                destination text NOT NULL,
                key bytea,
                headers text,
                body bytea NOT NULL,
                created_at double precision NOT NULL,
                size integer NOT NULL,
                attempts integer NOT NULL,
                error text NOT NULL,
                quarantined_at double precision NOT NULL)""",
        )
        with self._session() as conn, conn.transaction():
            # Serialise concurrent first opens: CREATE ... IF NOT EXISTS can race.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (t,))
            for statement in self._schema:
                conn.execute(statement)

    # --- connection ------------------------------------------------------------------------

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """The store's own connection (reconnected when lost), under the store's lock."""
        with self._lock:
            if self._closed:
                raise ClosedError("the outbox is closed")
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(self._conninfo, autocommit=True)
                yield self._conn
            except pg_errors.DiskFull as exc:
                raise OutboxFull(f"the PostgreSQL outbox is out of disk: {exc}") from exc
            except psycopg.Error as exc:
                raise OutboxError(
                    f"PostgreSQL outbox {self._table}: {type(exc).__name__}: {exc}"
                ) from exc

    def _row(self, env: Envelope) -> _ROW:
        return (
            env.message_id,
            self._target,
            env.destination,
            env.key,
            row_headers(env),
            env.body,
            env.created_at,
            env.size,
        )

    # --- the OutboxStore protocol ------------------------------------------------------------

    @property
    def table(self) -> str:
        """The table holding waiting messages."""
        return self._table

    def put(self, envelopes: Sequence[Envelope]) -> None:
        """Store ``envelopes`` in one committed transaction (durable when this returns)."""
        if not envelopes:
            return
        rows = [self._row(env) for env in envelopes]
        with self._session() as conn, conn.transaction():
            count = conn.execute(self._sql["count"]).fetchone()
            if count is not None and count[0] + len(rows) > self.max_rows:
                raise OutboxFull(f"the outbox holds max_rows={self.max_rows}")
            with conn.cursor() as cur:
                cur.executemany(self._sql["insert"], rows)

    def put_in(self, connection: psycopg.Connection[Any], envelopes: Sequence[Envelope]) -> None:
        """Write ``envelopes`` through ``connection`` inside the caller's transaction.

        Nothing is committed here: the rows exist (and get published) only if the
        caller's transaction commits.
        """
        if self._closed:
            raise ClosedError("the outbox is closed")
        rows = [self._row(env) for env in envelopes]
        try:
            with connection.cursor() as cur:
                cur.executemany(self._sql["insert"], rows)
        except pg_errors.DiskFull as exc:
            raise OutboxFull(f"the PostgreSQL outbox is out of disk: {exc}") from exc
        except psycopg.Error as exc:
            raise OutboxError(
                f"PostgreSQL outbox {self._table}: {type(exc).__name__}: {exc}"
            ) from exc

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        """Lease up to ``limit`` ready envelopes, per-key order kept, skipping rows another
        claimer holds."""
        if limit < 1:
            return []
        now = self._clock()
        with self._session() as conn, conn.transaction():
            rows = conn.execute(
                self._sql["claim"], {"now": now, "until": now + lease_s, "limit": limit}
            ).fetchall()
        rows.sort(key=lambda r: r[0])
        return [make_envelope(*r[1:]) for r in rows]

    def delivered(self, ids: Sequence[str]) -> None:
        """Remove envelopes the broker confirmed."""
        if ids:
            with self._session() as conn:
                conn.execute(self._sql["delivered"], (list(ids),))

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        """Release until ``retry_at``, or quarantine with ``error`` when it is None."""
        with self._session() as conn:
            if retry_at is not None:
                conn.execute(self._sql["retry"], (retry_at, error, message_id))
            else:
                conn.execute(self._sql["quarantine"], (message_id, error, self._clock()))

    def release(self, items: Sequence[tuple[str, str]], *, retry_at: float) -> None:
        """Release many leased envelopes ``(id, error)`` until ``retry_at`` at once."""
        if not items:
            return
        with self._session() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(self._sql["retry"], [(retry_at, err, mid) for mid, err in items])

    def has_key(self, key: bytes) -> bool:
        """True while any envelope of ``key`` waits (asks the database: other processes
        may write the table)."""
        with self._session() as conn:
            row = conn.execute(self._sql["has_key"], (key,)).fetchone()
        return bool(row and row[0])

    def stats(self) -> OutboxStats:
        """Depth, bytes, oldest age and quarantined count."""
        with self._session() as conn:
            depth, size, oldest = conn.execute(self._sql["stats"]).fetchone() or (0, 0, None)
            quarantined = (conn.execute(self._sql["count_q"]).fetchone() or (0,))[0]
        return OutboxStats(
            depth=int(depth),
            bytes=int(size),
            oldest_age_s=None if oldest is None else max(0.0, self._clock() - float(oldest)),
            quarantined=int(quarantined),
        )

    def pending(self) -> int:
        """How many messages wait (quarantined ones not counted)."""
        with self._session() as conn:
            row = conn.execute(self._sql["count"]).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the store's own connection. Idempotent."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # --- for the CLI ----------------------------------------------------------------------

    def list(self, limit: int = 100, offset: int = 0) -> list[OutboxEntry]:
        """Waiting messages in queue order."""
        with self._session() as conn:
            rows = conn.execute(self._sql["list"], (limit, offset)).fetchall()
        return [OutboxEntry(make_envelope(*r[:6]), r[6], r[7], r[8], r[9]) for r in rows]

    def quarantined(self, limit: int = 100, offset: int = 0) -> builtins.list[QuarantinedEntry]:
        """Quarantined messages, oldest first."""
        with self._session() as conn:
            rows = conn.execute(self._sql["quarantined"], (limit, offset)).fetchall()
        return [QuarantinedEntry(make_envelope(*r[:6]), r[6], r[7], r[8], r[9]) for r in rows]

    def replay(self, ids: Sequence[str] | Literal["all"]) -> int:
        """Move quarantined messages back to the end of the queue; returns how many."""
        t, q = self._table, f"{self._table}_quarantine"
        where, params = _selection(ids)
        with self._session() as conn:
            cur = conn.execute(
                f"WITH moved AS (DELETE FROM {q}{where} RETURNING *)"
                f" INSERT INTO {t} ({_COLUMNS}) SELECT {_COLUMNS} FROM moved ORDER BY seq"
                " ON CONFLICT (id) DO NOTHING",
                params,
            )
            return cur.rowcount

    def purge(
        self,
        ids: Sequence[str] | Literal["all"],
        *,
        waiting: bool = False,
        quarantined: bool = True,
    ) -> int:
        """Delete quarantined messages unless ``quarantined=False``, and waiting ones too
        with ``waiting=True``."""
        where, params = _selection(ids)
        with self._session() as conn, conn.transaction():
            n = 0
            if quarantined:
                n += conn.execute(f"DELETE FROM {self._table}_quarantine{where}", params).rowcount
            if waiting:
                n += conn.execute(f"DELETE FROM {self._table}{where}", params).rowcount
        return n

    def __repr__(self) -> str:
        return f"PostgresOutbox(table={self._table!r}, target={self._target!r})"


def _selection(ids: Sequence[str] | Literal["all"]) -> tuple[str, tuple[Any, ...]]:
    if ids == "all":
        return "", ()
    return " WHERE id = ANY(%s)", (list(ids),)
