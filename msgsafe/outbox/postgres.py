"""The transactional outbox in PostgreSQL (psycopg 3).

``put_in(conn, envelopes)`` writes the rows through the caller's own connection, inside
the caller's open transaction: they become visible — and the forwarder publishes them —
only if that transaction commits; a rollback leaves nothing to publish. Everything else
(claims, deliveries, quarantine) runs on the store's own connection.

Several processes may share the table (a fleet: every producer and any number of
``msgsafe outbox forward`` processes, see docs/fleet.md): claims take key-level leases
(:mod:`msgsafe.outbox._pg_leases`: one forwarder per key at a time, taken over
``lease_s`` after a forwarder dies; each claim's epoch fences a forwarder paused past its
lease) and ``has_key`` asks the database. Per-key order
follows the ``seq`` the rows got at insert; two transactions writing the same key at
once commit in an order the database chooses, so callers that need strict order for a
key write it from one transaction at a time.

A put knows whether it committed: a connection lost during COMMIT is resolved by asking
the server about the transaction, or by putting the same rows again, which the unique
ids make idempotent (:mod:`msgsafe.outbox._pg_commit`); a connection lost before COMMIT
is retried on a new one (libpq's host list finds the primary after a fail-over) until
``write_timeout``. So are the questions a send asks on its way (``has_key``, the row
count of ``max_rows``, ``pending``, ``stats``): a fail-over makes a send wait, not
fail. A put still unanswered at ``write_timeout`` (a COMMIT waiting for a synchronous
standby) is cut and raises :class:`~msgsafe.errors.StoreOutcomeUnknown`: retry with the
same ids — the insert is idempotent on them, and refuses an id stored as another
message. Errors are one line naming the first cause (:mod:`msgsafe.outbox._pg_errors`).
:meth:`PostgresOutbox.from_url` opens a store from a ``postgresql://`` URL
(:mod:`msgsafe.outbox._pg_url`).
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    MissingExtra,
    OutboxError,
    OutboxFull,
    OutboxLoginReadOnly,
    OutboxPoolingUnsupported,
    StoreOutcomeUnknown,
)
from msgsafe.message import Envelope
from msgsafe.outbox._pg_commit import (
    PutAttempt,
    Watchdog,
    outcome,
    rollback_open,
    server_identity,
    standby_wait_cancelled,
)
from msgsafe.outbox._pg_errors import (
    READ_ONLY_LOGIN,
    first_cause,
    is_auth_failure,
    is_read_only,
    store_error,
)
from msgsafe.outbox._pg_leases import (
    ClaimCursor,
    Listener,
    busy_keys_sql,
    claim_sql,
    keys_sql,
    lock_sql,
)
from msgsafe.outbox._pg_pooling import CONNECT_OPTIONS, PoolMode, pooling_mode
from msgsafe.outbox._pg_url import parse_store_url, redact_conninfo
from msgsafe.outbox._rows import (
    OutboxEntry,
    QuarantinedEntry,
    make_envelope,
    redact_target,
    reused_ids_error,
    row_headers,
)
from msgsafe.ports import OutboxStats, StoreCapabilities

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("postgres", "psycopg") from exc

__all__ = ["PostgresOutbox"]

log = logging.getLogger("msgsafe.outbox")

#: How long a count of the waiting rows (for max_rows) is reused: counting a large
#: table on every put would cost more than the put.
_COUNT_TTL_S = 5.0
#: How many rows stats() counts before it estimates (see PostgresOutbox.stats).
_EXACT_UP_TO = 100_000
#: The answer type of PostgresOutbox._ask.
_T = TypeVar("_T")

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_COLUMNS = "id, target, destination, key, headers, body, created_at, size"
_ROW = tuple[str, str, str, bytes | None, str | None, bytes, float, int]
#: The condition that fences settling by the claim's epoch (param: epoch, or None).
_HELD = " AND (%(epoch)s::bigint IS NULL OR lease_epoch = %(epoch)s)"


class PostgresOutbox:
    """An :class:`~msgsafe.ports.OutboxStore` in a PostgreSQL table (created if missing),
    with quarantined messages in ``<table>_quarantine``.

    ``conninfo`` is a libpq connection string or URL; it is never shown in errors or
    ``repr``. ``max_rows`` bounds the waiting messages (checked on the store's own puts
    against a count at most 5 s old, estimated beyond 100,000 rows, plus this store's
    puts since; ``put_in`` follows the caller's transaction and is not refused on the
    row bound). ``lease_s`` caps every
    claim's lease: a key a dead forwarder held is taken over after at most that long.
    ``max_keys``: keys one claim takes at most (forwarders share the rest).
    ``write_timeout``: how long a put, or a question a send asks (``has_key``), keeps
    trying a new connection (a fail-over) before it raises; a put that has not answered
    by then (a COMMIT waiting for a synchronous standby) is cut and raises
    :class:`~msgsafe.errors.StoreOutcomeUnknown`. Thread-safe.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "msgsafe_outbox",
        target: str | None = None,
        max_rows: int = 10_000_000,
        clock: Callable[[], float] = time.time,
        lease_s: float = 10.0,
        max_keys: int = 16,
        write_timeout: float = 30.0,
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
        self.lease_s = lease_s
        #: As the class declares, with the lease this store caps every claim at.
        self.capabilities = dataclasses.replace(PostgresOutbox.capabilities, lease_s=lease_s)
        self.max_keys = max_keys
        self.write_timeout = write_timeout
        #: The conninfo without its password, for repr and the CLI.
        self.redacted = redact_conninfo(conninfo)
        #: (rows counted, when: time.monotonic()) for the max_rows check.
        self._counted: tuple[int, float] | None = None
        self._listeners: list[Listener] = []
        #: The epoch of each row this store claimed and has not settled yet; the epochs
        #: of claims lost or given up (their rows are forgotten at the next claim, so
        #: that a late settling of them stays fenced until then), and those logged.
        self._held: dict[str, int] = {}
        #: The seq of each of those rows: a delete finds them through the primary key.
        self._seqs: dict[str, int] = {}
        self._fenced: set[int] = set()
        self._reported: set[int] = set()
        self._held_lock = threading.Lock()
        #: Where claims start looking for keys (see ClaimCursor).
        self._cursor = ClaimCursor()
        #: The server the store's connection talks to (for commit-unknown answers).
        self._server: tuple[str, int, str] | None = None
        t, q = table, f"{table}_quarantine"
        self._sql = {
            "insert": f"INSERT INTO {t} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            "insert_returning": f"INSERT INTO {t} ({_COLUMNS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING id",
            # Every stored row among the ids %s, locked, and whether it is another
            # message than the one put. The lock is written to the WAL: a put that
            # finds its rows stored already (a retry) still writes, so its COMMIT waits
            # for the synchronous standbys like any other (a put that wrote nothing
            # would not wait, and could report rows that only the primary holds).
            "reused": f"SELECT o.id, o.destination <> n.destination"
            " OR o.key IS DISTINCT FROM n.key OR o.body <> n.body"
            f" FROM {t} AS o JOIN unnest(%s::text[], %s::text[],"
            " %s::bytea[], %s::bytea[]) AS n(id, destination, key, body) ON o.id = n.id"
            " FOR KEY SHARE OF o",
            # Settling is fenced by the claim's epoch (see msgsafe.outbox._pg_leases):
            # a null epoch (rows this store did not claim) settles unconditionally.
            "delivered": f"DELETE FROM {t} WHERE id = ANY(%(ids)s)" + _HELD,
            "delivered_seqs": f"DELETE FROM {t} WHERE seq = ANY(%(seqs)s)"
            " AND lease_epoch = %(epoch)s",
            "retry": f"UPDATE {t} SET ready_at = %(at)s, last_error = %(error)s WHERE id = %(id)s",
            "quarantine": f"""
                WITH moved AS (DELETE FROM {t} WHERE id = %(id)s{_HELD} RETURNING *),
                kept AS (
                    INSERT INTO {q} ({_COLUMNS}, attempts, error, quarantined_at)
                    SELECT {_COLUMNS}, attempts, %(error)s, %(at)s FROM moved
                    ON CONFLICT (id) DO NOTHING)
                SELECT count(*) FROM moved""",
            "busy": busy_keys_sql(t),
            "idle_cap": "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
            "held": f"SELECT id FROM {t} WHERE id = ANY(%(ids)s){_HELD}"
            " AND (key IS NULL OR key <> ALL(%(busy)s::bytea[])) FOR UPDATE SKIP LOCKED",
            "ours": f"SELECT count(*) FROM {t} WHERE id = ANY(%(ids)s){_HELD}",
            "renew": f"UPDATE {t} SET ready_at = %(at)s WHERE id = ANY(%(ids)s)",
            "give_up": f"UPDATE {t} SET ready_at = %(at)s"
            " WHERE id = ANY(%(ids)s) AND ready_at > %(at)s",
            "has_epoch": "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attname = 'lease_epoch' AND NOT attisdropped",
            "add_epoch": f"ALTER TABLE {t} ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0",
            "keys": keys_sql(t),
            "lock": lock_sql(t),
            "claim_keys": claim_sql(t),
            "notify": f"SELECT pg_notify('{t}', '')",
            "xid": "SELECT pg_current_xact_id()::text",
            "has_key": f"SELECT EXISTS (SELECT 1 FROM {t} WHERE key = %s)",
            # Counts up to _EXACT_UP_TO rows, in queue order (the head of the queue):
            # what a stats question reads does not grow with the table.
            "stats": f"SELECT count(*), coalesce(sum(size), 0), min(created_at) FROM"
            f" (SELECT size, created_at FROM {t} ORDER BY seq LIMIT %s) AS h",
            # The server's estimate of the rows: the statistics' live rows (kept by every
            # insert and delete), else the planner's (pages now x rows per page).
            "estimate": "SELECT coalesce((SELECT nullif(n_live_tup, 0) FROM pg_stat_user_tables"
            " WHERE relid = c.oid), CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN"
            " c.reltuples / c.relpages * (pg_relation_size(c.oid)"
            " / current_setting('block_size')::int) END, 0)::bigint"
            " FROM pg_class AS c WHERE c.oid = %s::regclass",
            "count_q": f"SELECT count(*) FROM {q}",
            "count": f"SELECT count(*) FROM (SELECT 1 FROM {t} ORDER BY seq LIMIT %s) AS h",
            "list": f"SELECT id, destination, key, headers, body, created_at, target, attempts,"
            f" ready_at, last_error FROM {t} ORDER BY seq LIMIT %s OFFSET %s",
            "quarantined": f"SELECT id, destination, key, headers, body, created_at, target,"
            f" attempts, error, quarantined_at FROM {q} ORDER BY seq LIMIT %s OFFSET %s",
            "destinations": f"SELECT destination, count(*) FROM {t} GROUP BY destination"
            " ORDER BY count(*) DESC, destination LIMIT %s",
            "locate": f"SELECT id, 'waiting' FROM {t} WHERE id = ANY(%s)"
            f" UNION ALL SELECT id, 'quarantined' FROM {q} WHERE id = ANY(%s)",
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
                last_error text,
                lease_epoch bigint NOT NULL DEFAULT 0) WITH (fillfactor = 50)""",
            # What a claim reads (see msgsafe.outbox._pg_leases.claim_sql): without them
            # a claim scans the table when its keys' rows do not fill it.
            f"CREATE INDEX IF NOT EXISTS {t}_key_seq ON {t} (key, seq) WHERE key IS NOT NULL",
            f"CREATE INDEX IF NOT EXISTS {t}_keyless ON {t} (seq) WHERE key IS NULL",
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
        with self._session() as conn:
            #: The pooling found between this store and its server (see
            #: msgsafe.outbox._pg_pooling): a heuristic, asked once when the store opens.
            self.pooling: PoolMode = pooling_mode(conn, self._connect_plain)
        if self.pooling == "statement":
            raise OutboxPoolingUnsupported(
                "the PostgreSQL outbox's connections go through a pooler in statement mode,"
                " which refuses the transactions every put commits in: set pool_mode ="
                " transaction (or session) for this database in the pooler",
                endpoint=self.redacted,
            )
        if self.pooling == "transaction":
            # NOTE: LISTEN does not survive transaction pooling (the server connection
            # that listens goes back to the pool): forwarders poll instead.
            self.capabilities = dataclasses.replace(self.capabilities, notify=False)
        with self._session() as conn, conn.transaction():
            # Serialise concurrent first opens: CREATE ... IF NOT EXISTS can race.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (t,))
            for statement in self._schema:
                conn.execute(statement)
            # NOTE: a table made before leases had epochs gets the column (no rewrite: a
            # constant default). Asked first: ALTER TABLE would lock the table against
            # every producer and forwarder at each open, even with nothing to add.
            if conn.execute(self._sql["has_epoch"], (t,)).fetchone() is None:
                conn.execute(self._sql["add_epoch"])

    # --- connection ------------------------------------------------------------------------

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """The store's own connection (reconnected when lost), under the store's lock."""
        with self._lock:
            if self._closed:
                raise ClosedError("the outbox is closed")
            try:
                yield self._live()
            except pg_errors.DiskFull as exc:
                raise self._full(exc) from exc
            except psycopg.Error as exc:
                raise self._failed(exc) from exc

    def _live(self) -> psycopg.Connection[Any]:
        """The store's connection, made anew when there is none or it was lost (call
        under the store's lock)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._connect()
        return self._conn

    def _failed(self, exc: psycopg.Error) -> OutboxError:
        """``exc`` as one short line naming its first cause (see
        :mod:`msgsafe.outbox._pg_errors`); a read-only login says so."""
        if is_read_only(exc) and self._login_read_only():
            return OutboxLoginReadOnly(READ_ONLY_LOGIN, endpoint=self.redacted)
        return store_error(exc, self.redacted)

    def _permanent(self, exc: psycopg.Error) -> bool:
        """True when no new connection can help: the login is refused or read-only."""
        return is_auth_failure(exc) or (is_read_only(exc) and self._login_read_only())

    def _login_read_only(self) -> bool:
        """True when a host of the conninfo is a primary (not in recovery) on which this
        login's sessions are read-only: what libpq reports as "session is read-only",
        like a standby's, when it looks for a host that takes writes."""
        params = psycopg.conninfo.conninfo_to_dict(self._conninfo)
        hosts = str(params.get("host") or "").split(",")
        ports = str(params.get("port") or "").split(",")
        for i, host in enumerate(hosts):
            port = ports[i] if i < len(ports) else ports[-1]
            try:
                with psycopg.connect(
                    self._conninfo,
                    prepare_threshold=None,
                    host=host or None,
                    port=port or None,
                    target_session_attrs="any",
                    connect_timeout=5,
                ) as conn:
                    row = conn.execute(
                        "SELECT pg_is_in_recovery(),"
                        " current_setting('default_transaction_read_only')"
                    ).fetchone()
            except psycopg.Error:
                continue
            if row is not None and not row[0] and row[1] == "on":
                return True
        return False

    def _full(self, exc: pg_errors.DiskFull) -> OutboxFull:
        return OutboxFull(
            f"the PostgreSQL outbox is out of disk: {first_cause(exc)}", endpoint=self.redacted
        )

    def _connect_plain(self) -> psycopg.Connection[Any]:
        """A new connection to the store (see :data:`CONNECT_OPTIONS`: nothing that a
        transaction pooler would drop between transactions)."""
        return psycopg.connect(self._conninfo, **CONNECT_OPTIONS)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._connect_plain()
        self._server = server_identity(conn)
        return conn

    def _ask(self, question: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``question`` answered on the store's connection, asked again on a new one
        through a fail-over as :meth:`_through_failover` says. Only for questions that
        change nothing."""

        def attempt(deadline: float, conn: psycopg.Connection[Any]) -> tuple[_T]:
            return (question(conn),)

        return self._through_failover("read", attempt)[0]

    def _through_failover(
        self, what: str, attempt: Callable[[float, psycopg.Connection[Any]], _T | None]
    ) -> _T:
        """``attempt(deadline, connection)``'s answer, under the store's lock; an attempt
        that fails with the connection (a fail-over: the server away, or a standby where
        the primary was) or answers None is made again on a new connection until
        ``write_timeout`` has passed; then :class:`~msgsafe.errors.OutboxError`."""
        deadline = time.monotonic() + self.write_timeout
        pause = 0.05
        while True:
            # Another put or question may hold the connection for its own write_timeout.
            if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise OutboxError(
                    f"the PostgreSQL outbox was busy for write_timeout={self.write_timeout:g}s"
                    f" (its {what} was not made)",
                    endpoint=self.redacted,
                )
            try:
                if self._closed:
                    raise ClosedError("the outbox is closed")
                answer = attempt(deadline, self._live())
            except pg_errors.DiskFull as exc:
                raise self._full(exc) from exc
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # Lost before a COMMIT was sent: nothing committed, try a new connection
                # (unless no connection can help: a refused or read-only login).
                if time.monotonic() >= deadline or self._permanent(exc):
                    raise self._failed(exc) from exc
                log.info("outbox %s on %s retried: %s", what, self.redacted, exc)
                answer = None
            except psycopg.Error as exc:
                raise self._failed(exc) from exc
            finally:
                self._lock.release()
            if answer is not None:
                return answer
            if time.monotonic() >= deadline:
                raise OutboxError(
                    f"the PostgreSQL outbox found no primary within"
                    f" write_timeout={self.write_timeout:g}s",
                    endpoint=self.redacted,
                )
            time.sleep(pause)  # the server is away (a fail-over): try again shortly
            pause = min(pause * 2, 1.0)

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

    #: Writes inside the caller's transaction (put_in), releases in one transaction, a
    #: count without the rest of stats(), wake-ups by LISTEN/NOTIFY (listen), leases
    #: fenced by epochs (renew; see msgsafe.ports). Its claim makes envelopes.
    capabilities = StoreCapabilities(
        transactional=True, release=True, pending=True, notify=True, renew=True
    )

    @property
    def table(self) -> str:
        """The table holding waiting messages."""
        return self._table

    @classmethod
    def from_url(cls, url: str, *, target: str | None = None, **options: Any) -> PostgresOutbox:
        """The store a ``postgresql://user:pw@h1:5432,h2:5432/db?table=T&lease=S``
        URL names (default table ``msgsafe_outbox``; ``&write_timeout=S`` sets
        ``write_timeout``), with libpq's multi-host fail-over
        (``target_session_attrs=read-write`` unless the URL says otherwise); see
        :mod:`msgsafe.outbox._pg_url`. ``options`` as for the constructor."""
        parsed = parse_store_url(url)
        if parsed.lease_s is not None:
            options.setdefault("lease_s", parsed.lease_s)
        if parsed.write_timeout_s is not None:
            options.setdefault("write_timeout", parsed.write_timeout_s)
        try:
            store = cls(parsed.conninfo, table=parsed.table, target=target, **options)
        except OutboxError as exc:
            exc.endpoint = parsed.redacted  # the URL as given, without its password
            raise
        store.redacted = parsed.redacted
        return store

    def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever rows are put into the table by any process (LISTEN/
        NOTIFY on a connection of its own, kept until :meth:`close`). Behind transaction
        pooling the store declares no ``notify`` and this refuses."""
        if self._closed:
            raise ClosedError("the outbox is closed")
        if not self.capabilities.notify:
            raise OutboxPoolingUnsupported(
                "LISTEN does not work through a pooler in transaction mode: "
                "forwarders of this store poll instead",
                endpoint=self.redacted,
            )
        self._listeners.append(Listener(self._connect_plain, self._table, wake))

    def put(self, envelopes: Sequence[Envelope]) -> None:
        """Store ``envelopes`` in one committed transaction (durable when this returns).

        Idempotent on the message id: an id already stored with the same destination,
        key and body is left as it is (a retry stores no second row); one stored with
        another message raises :class:`~msgsafe.errors.MessageIdReused` and stores
        nothing. Returns only for a commit known to have happened; a connection lost
        before or during COMMIT is handled as the module docstring says, for up to
        ``write_timeout`` seconds; then :class:`~msgsafe.errors.OutboxError` (nothing
        stored), or :class:`~msgsafe.errors.StoreOutcomeUnknown` when the store did not
        answer in time or a COMMIT's outcome stayed unknown (retry with the same ids)."""
        if not envelopes:
            return
        rows = [self._row(env) for env in envelopes]
        self._check_room(len(rows))
        unknown: list[str] = []

        def attempt(deadline: float, conn: psycopg.Connection[Any]) -> Literal[True] | None:
            try:
                try:
                    return self._put_once(conn, rows, deadline)
                except BaseException:
                    self._end_failed_put(conn)
                    raise
            except _Unanswered as exc:
                raise self._unknown(envelopes, str(exc)) from exc.__cause__
            except _Unknown as exc:
                unknown.append(str(exc))
                return None

        try:
            self._through_failover("put", attempt)
        except OutboxError as exc:
            if unknown and not isinstance(exc, StoreOutcomeUnknown):
                raise self._unknown(envelopes, unknown[-1]) from exc
            raise
        if self._counted is not None:
            self._counted = (self._counted[0] + len(rows), self._counted[1])

    def _unknown(self, envelopes: Sequence[Envelope], why: str) -> StoreOutcomeUnknown:
        """The error of a put whose outcome is not known, naming each message."""
        one = envelopes[0] if len(envelopes) == 1 else None
        return StoreOutcomeUnknown(
            f"PostgreSQL outbox: {why}",
            destination=None if one is None else one.destination,
            destinations={env.message_id: env.destination for env in envelopes},
            endpoint=self.redacted,
            message_id=None if one is None else one.message_id,
        )

    def _put_once(
        self, conn: psycopg.Connection[Any], rows: list[_ROW], deadline: float
    ) -> Literal[True]:
        """One attempt on ``conn`` under the lock: True once committed (known).

        The attempt is cut at ``deadline`` (its connection shut: see
        :class:`~msgsafe.outbox._pg_commit.Watchdog`) and raises :class:`_Unanswered`;
        :class:`_Unknown` when a lost COMMIT's outcome could not be learnt (the rows are
        put again, idempotent)."""
        server = self._server
        with Watchdog(conn.pgconn.socket, deadline) as watchdog:
            try:
                # One round trip for BEGIN, the rows, the wake-up and the transaction's
                # id, then COMMIT: what bare psycopg spends on the same rows and commit,
                # less the BEGIN.
                with conn.cursor() as cur:
                    with conn.pipeline():
                        conn.execute("BEGIN")
                        cur.executemany(self._sql["insert_returning"], rows, returning=True)
                        conn.execute(self._sql["notify"])
                        xid_cur = conn.execute(self._sql["xid"])
                    inserted = _returned_ids(cur)
                xid_row = xid_cur.fetchone()
                if len(inserted) < len(rows):
                    self._refuse_reused(conn, rows, inserted)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if watchdog.fired:
                    raise _Unanswered(
                        f"no answer within write_timeout={self.write_timeout:g}s"
                    ) from exc
                raise
            assert xid_row is not None and server is not None
            attempt = PutAttempt(str(xid_row[0]), server, conn.info.backend_pid)
            try:
                with standby_wait_cancelled(conn) as cancelled:
                    self._commit(conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                lost: BaseException = exc
                cut = watchdog.fired
            else:
                if not cancelled:
                    return True
                log.warning(
                    "outbox put on %s: %s; the rows are put again so that COMMIT waits "
                    "for the synchronous standby",
                    self.redacted,
                    cancelled[0],
                )
                raise _Unknown(f"committed on the primary alone ({cancelled[0]})")
        conn.close()
        self._conn = None
        # Cut at the deadline: asked once, for the log (even a commit that just happened
        # may have cancelled its standby wait: the put's outcome is unknown); lost
        # otherwise: asked until the deadline, and put again unless it aborted.
        known = outcome(self._connect, attempt, deadline=time.monotonic() if cut else deadline)
        log.warning(
            "outbox put on %s: %s during COMMIT (%s); the transaction is %s",
            self.redacted,
            "no answer within write_timeout" if cut else "the connection was lost",
            lost,
            known,
        )
        if cut:
            raise _Unanswered(
                f"COMMIT did not return within write_timeout={self.write_timeout:g}s"
            ) from lost
        if known == "aborted":
            raise _Unknown("the COMMIT was lost and the transaction aborted")
        if known == "committed":
            # Perhaps a terminated standby wait (committed on the primary alone): put
            # again, a COMMIT that waits for the standbys and stores nothing twice.
            raise _Unknown("the COMMIT's answer was lost; the transaction committed")
        raise _Unknown("the connection was lost during COMMIT")

    def _end_failed_put(self, conn: psycopg.Connection[Any]) -> None:
        """Roll back what a failed put left open on ``conn``: its explicit BEGIN (sent
        in the pipeline) keeps a failed transaction open on an autocommit connection,
        and every later put's BEGIN would be refused ("current transaction is aborted")
        until the connection was dropped. A full disk wedged a producer's outbox that
        way, for good, after the space came back. A connection that cannot roll back is
        dropped (the next put connects anew)."""
        failed = rollback_open(conn)
        if failed is not None:
            log.info("outbox %s: a failed put's connection dropped: %s", self.redacted, failed)
            conn.close()
            if self._conn is conn:
                self._conn = None

    def _refuse_reused(
        self, conn: psycopg.Connection[Any], rows: list[_ROW], inserted: set[str]
    ) -> None:
        """Some ids were stored already: :class:`MessageIdReused` (the transaction
        rolled back) when any of them is stored as another message; otherwise they are
        locked (see the ``reused`` query: the COMMIT then waits for the standbys)."""
        kept = [r for r in rows if r[0] not in inserted]
        columns = ([r[0] for r in kept], [r[2] for r in kept], [r[3] for r in kept])
        stored = conn.execute(self._sql["reused"], (*columns, [r[5] for r in kept])).fetchall()
        found = [r for r in stored if r[1]]
        if found:
            conn.execute("ROLLBACK")
            raise reused_ids_error((str(r[0]) for r in found), self.redacted)

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        """Send COMMIT and wait for its answer (a seam for tests that lose it)."""
        conn.execute("COMMIT")

    def _check_room(self, adding: int) -> None:
        now = time.monotonic()
        counted = self._counted
        if counted is None or now - counted[1] > _COUNT_TTL_S:
            counted = self._counted = (self.pending(), now)
        if counted[0] + adding > self.max_rows:
            self._counted = None  # counted again next time: rows may have been forwarded
            raise OutboxFull(f"the outbox holds max_rows={self.max_rows}")

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
                # Delivered to the forwarders' listeners when the caller commits.
                cur.execute(self._sql["notify"])
        except pg_errors.DiskFull as exc:
            raise self._full(exc) from exc
        except psycopg.Error as exc:
            raise self._failed(exc) from exc

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        """Lease up to ``limit`` ready envelopes of at most ``max_keys`` keys (and keyless
        ones), per-key order kept, for ``min(lease_s, self.lease_s)`` seconds; keys and
        rows another claimer holds are skipped (see :mod:`msgsafe.outbox._pg_leases`)."""
        if limit < 1:
            return []
        now = self._clock()
        lease = min(lease_s, self.lease_s)
        with self._session() as conn, conn.transaction():
            # NOTE: a claimer stopped inside this transaction (SIGSTOP between two of its
            # statements) would hold its keys' locks for as long as it stays stopped; the
            # server ends its session once it has idled about a lease (a second at least),
            # and the keys are free, as a dead claimer's are.
            conn.execute(self._sql["idle_cap"], (f"{max(1000, int(lease * 1000))}ms",))
            after, token = self._cursor.start(now)
            found = conn.execute(
                self._sql["keys"],
                {
                    "now": now,
                    "scan": max(limit, 10_000),
                    "keys": 4 * self.max_keys,
                    "after": after,
                },
            ).fetchall()
            self._cursor.found(int(found[0][1]) if found else None, token)
            keys = [bytes(k[0]) for k in found]
            if keys:
                keys = [
                    bytes(k[0])
                    for k in conn.execute(
                        self._sql["lock"], {"keys": keys, "take": self.max_keys}
                    ).fetchall()
                ]
            rows = conn.execute(
                self._sql["claim_keys"],
                {
                    "now": now,
                    "until": now + lease,
                    "limit": limit,
                    "keys": keys,
                    # The keys' share of the claim: what a key does not fill is left
                    # for the next claim (reading more would grow with the backlog).
                    "per_key": -(-limit // max(1, len(keys))),
                },
            ).fetchall()
        rows.sort(key=lambda r: r[0])
        if rows:
            self._hold([(str(r[1]), int(r[0])) for r in rows], int(rows[0][7]))
        return [make_envelope(*r[1:7]) for r in rows]

    def delivered(self, ids: Sequence[str]) -> None:
        """Remove envelopes the broker confirmed, those of them this store still holds
        (see :meth:`renew`): a row another claimer took over is left to it."""
        if not ids:
            return
        for epoch, group in self._by_epoch(ids).items():
            params: dict[str, Any] = {"ids": group, "epoch": epoch}
            query = "delivered"
            if epoch is not None:
                # Rows claimed here: found through the primary key, whose entries for
                # one claim lie together (a text id's lie anywhere in its index).
                with self._held_lock:
                    seqs = [self._seqs.get(mid) for mid in group]
                if None not in seqs:
                    params, query = {"seqs": seqs, "epoch": epoch}, "delivered_seqs"
            with self._session() as conn:
                done = conn.execute(self._sql[query], params).rowcount
            self._settled(group, epoch, len(group) - done, "deletes")

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        """Release until ``retry_at``, or quarantine with ``error`` when it is None (only
        while this store still holds the row: see :meth:`renew`)."""
        if retry_at is not None:
            self.release([(message_id, error)], retry_at=retry_at)
            return
        epoch = self._epoch_of(message_id)
        params = {"id": message_id, "epoch": epoch, "error": error, "at": self._clock()}
        with self._session() as conn:
            row = conn.execute(self._sql["quarantine"], params).fetchone()
        self._settled([message_id], epoch, 0 if row and row[0] else 1, "quarantines")

    def release(self, items: Sequence[tuple[str, str]], *, retry_at: float) -> None:
        """Release many leased envelopes ``(id, error)`` until ``retry_at`` at once: those
        this store still holds (see :meth:`renew`), each key's under its advisory lock;
        rows another transaction is settling or claiming are left leased (see
        :mod:`msgsafe.outbox._pg_leases`)."""
        if not items:
            return
        errors = dict(items)
        for epoch, group in self._by_epoch(list(errors)).items():
            with self._session() as conn, conn.transaction(), conn.cursor() as cur:
                held, ours = self._held_rows(conn, group, epoch)
                params = [{"id": mid, "error": errors[mid], "at": retry_at} for mid in held]
                cur.executemany(self._sql["retry"], params)
            self._cursor.reset(retry_at)
            self._settled(group, epoch, len(group) - ours, "releases")

    def renew(self, ids: Sequence[str], *, lease_s: float) -> bool:
        """Extend the lease of ``ids`` (rows this store claimed) to ``min(lease_s,
        self.lease_s)`` from now when every one still carries its claim's epoch, and
        return True. Otherwise another claimer took some of them over after the lease
        ran out: the claim is given up (those this store still holds are ready again at
        once), logged once at WARNING, and False is returned: send none of them."""
        now = self._clock()
        until = now + min(lease_s, self.lease_s)
        renewed: builtins.list[tuple[int | None, builtins.list[str]]] = []
        lost_any = False
        for epoch, group in self._by_epoch(ids).items():
            if lost_any:
                self._give_up(epoch, group, now)
                continue
            with self._session() as conn, conn.transaction():
                held, ours = self._held_rows(conn, group, epoch)
                if len(held) == len(group):
                    conn.execute(self._sql["renew"], {"ids": held, "at": until})
                    renewed.append((epoch, group))
                    continue
                conn.execute(self._sql["give_up"], {"ids": held, "at": now})
            self._cursor.reset(now)
            lost_any = True
            self._settled(group, epoch, len(group) - ours, "sends", given_up=True)
        if lost_any:
            # Groups renewed before the loss showed in a later one are given up too.
            for epoch, group in renewed:
                self._give_up(epoch, group, now)
        return not lost_any

    def _held_rows(
        self, conn: psycopg.Connection[Any], ids: builtins.list[str], epoch: int | None
    ) -> tuple[builtins.list[str], int]:
        """(In an open transaction.) The rows of ``ids`` still under ``epoch`` that this
        transaction could lock, with their keys' advisory locks, and how many of ``ids``
        are still under ``epoch`` at all (the others were taken over). Never waits."""
        busy = [bytes(r[0]) for r in conn.execute(self._sql["busy"], {"ids": ids}).fetchall()]
        params = {"ids": ids, "epoch": epoch, "busy": busy}
        held = [str(r[0]) for r in conn.execute(self._sql["held"], params).fetchall()]
        if len(held) == len(ids):
            return held, len(ids)
        row = conn.execute(self._sql["ours"], params).fetchone()
        return held, int(row[0]) if row else 0

    def _give_up(self, epoch: int | None, ids: builtins.list[str], now: float) -> None:
        """Make the rows of ``ids`` still under ``epoch`` ready at ``now``: the claim is
        given up."""
        with self._session() as conn, conn.transaction():
            held, _ = self._held_rows(conn, ids, epoch)
            conn.execute(self._sql["give_up"], {"ids": held, "at": now})
        self._cursor.reset(now)
        self._settled(ids, epoch, 0, "sends", given_up=True)

    # --- the epochs of this store's claims (see msgsafe.outbox._pg_leases) ---------------

    def _hold(self, rows: Sequence[tuple[str, int]], epoch: int) -> None:
        """The rows ``(id, seq)`` were claimed under ``epoch``."""
        with self._held_lock:
            held, seqs = self._held, self._seqs
            if self._fenced:
                for mid in [m for m, e in held.items() if e in self._fenced]:
                    del held[mid]
                    seqs.pop(mid, None)
                self._fenced.clear()
                self._reported.clear()
            for mid, seq in rows:
                held[mid] = epoch
                seqs[mid] = seq

    def _epoch_of(self, message_id: str) -> int | None:
        with self._held_lock:
            return self._held.get(message_id)

    def _by_epoch(self, ids: Sequence[str]) -> dict[int | None, builtins.list[str]]:
        """``ids`` grouped by the epoch of the claim that leased them here (None: not
        claimed through this store, settled unconditionally)."""
        groups: dict[int | None, builtins.list[str]] = {}
        with self._held_lock:
            held = self._held
            for mid in ids:
                groups.setdefault(held.get(mid), []).append(mid)
        return groups

    def _settled(
        self,
        ids: Sequence[str],
        epoch: int | None,
        lost: int,
        what: str,
        *,
        given_up: bool = False,
    ) -> None:
        """``ids`` of the claim ``epoch`` are settled, or ``given_up``; ``lost`` of them
        were no longer under its epoch: the claim is lost, logged once."""
        if epoch is None:
            return
        with self._held_lock:
            report = lost > 0 and epoch not in self._reported
            if report:
                self._reported.add(epoch)
            if lost > 0 or given_up or epoch in self._fenced:
                self._fenced.add(epoch)
            else:
                held = self._held
                for mid in ids:
                    if held.get(mid) == epoch:
                        del held[mid]
                        self._seqs.pop(mid, None)
        if report:
            log.warning(
                "outbox lease lost on %s: %d rows of a claim (epoch %d) were taken over by"
                " another forwarder after their lease (at most %gs) ran out, while this one"
                " was paused or slow; it %s none of them and claims again (what it had"
                " sent of them may reach consumers twice)",
                self.redacted,
                lost,
                epoch,
                self.lease_s,
                what,
            )

    def has_key(self, key: bytes) -> bool:
        """True while any envelope of ``key`` waits (asks the database: other processes
        may write the table)."""
        row = self._ask(lambda conn: conn.execute(self._sql["has_key"], (key,)).fetchone())
        return bool(row and row[0])

    def stats(self) -> OutboxStats:
        """Depth, bytes, oldest age and quarantined count.

        Up to 100,000 waiting rows, all four are exact. Beyond, what would read the whole
        table is estimated (``estimated=True``): ``depth`` is the server's estimate of
        the table's rows (its statistics' live rows, else the planner's), at least the
        rows counted; ``bytes`` is that times the mean size of the first 100,000 rows;
        the oldest age is the oldest among those first rows in queue order (exact
        unless producers' clocks disagree). ``quarantined`` is a count (the quarantine
        table holds what failed for good: few rows). :meth:`pending` follows the same
        rule."""

        def ask(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
            depth, size, oldest = conn.execute(
                self._sql["stats"], (_EXACT_UP_TO + 1,)
            ).fetchone() or (0, 0, None)
            estimate = None
            if depth > _EXACT_UP_TO:
                row = conn.execute(self._sql["estimate"], (self._table,)).fetchone()
                estimate = int(row[0]) if row else 0
            quarantined = (conn.execute(self._sql["count_q"]).fetchone() or (0,))[0]
            return depth, size, oldest, quarantined, estimate

        depth, size, oldest, quarantined, estimate = self._ask(ask)
        if estimate is not None:
            counted = int(depth)
            depth = max(estimate, counted)
            size = int(int(size) / counted * depth)
        return OutboxStats(
            depth=int(depth),
            bytes=int(size),
            oldest_age_s=None if oldest is None else max(0.0, self._clock() - float(oldest)),
            quarantined=int(quarantined),
            estimated=estimate is not None,
        )

    def pending(self) -> int:
        """How many messages wait (quarantined ones not counted): exact up to 100,000,
        the server's estimate beyond, as :meth:`stats` says (0 is always exact). A
        forwarder asks it after every round of a drain: counting a big table each time
        would cost more than the round."""

        def ask(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(self._sql["count"], (_EXACT_UP_TO + 1,)).fetchone()
            counted = int(row[0]) if row else 0
            if counted <= _EXACT_UP_TO:
                return counted
            row = conn.execute(self._sql["estimate"], (self._table,)).fetchone()
            return max(counted, int(row[0]) if row else 0)

        return self._ask(ask)

    def close(self) -> None:
        """Close the store's own connection and stop its listeners. Idempotent."""
        for listener in self._listeners:
            listener.stop()
        self._listeners.clear()
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

    def destinations(self, limit: int = 20) -> builtins.list[tuple[str, int]]:
        """Waiting messages per destination, the fullest first (at most ``limit``)."""
        with self._session() as conn:
            rows = conn.execute(self._sql["destinations"], (limit,)).fetchall()
        return [(str(r[0]), int(r[1])) for r in rows]

    def locate(self, ids: Sequence[str]) -> dict[str, Literal["waiting", "quarantined"]]:
        """Where each of ``ids`` is; ids in neither table are left out (unknown)."""
        wanted = builtins.list(ids)
        with self._session() as conn:
            rows = conn.execute(self._sql["locate"], (wanted, wanted)).fetchall()
        return {str(r[0]): "waiting" if r[1] == "waiting" else "quarantined" for r in rows}

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
            moved = cur.rowcount
            conn.execute(self._sql["notify"])
            return moved

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
        return f"PostgresOutbox({self.redacted!r}, table={self._table!r}, target={self._target!r})"


def _selection(ids: Sequence[str] | Literal["all"]) -> tuple[str, tuple[Any, ...]]:
    if ids == "all":
        return "", ()
    return " WHERE id = ANY(%s)", (list(ids),)


class _Unanswered(Exception):
    """A put cut at its deadline: whether it committed is not known (never leaves the
    module: it becomes :class:`~msgsafe.errors.StoreOutcomeUnknown`)."""


class _Unknown(Exception):
    """A COMMIT's outcome could not be learnt: the rows are put again (idempotent)."""


def _returned_ids(cur: psycopg.Cursor[Any]) -> set[str]:
    """The ids an ``executemany(..., returning=True)`` of inserts returned (the rows
    inserted; a conflicting id returns nothing)."""
    ids: set[str] = set()
    while True:
        ids.update(str(r[0]) for r in cur.fetchall())
        if not cur.nextset():
            return ids
