"""The embedded outbox: one SQLite file, WAL, ``synchronous=FULL``, group commit.

The file belongs to one process at a time: an advisory ``flock`` plus SQLite's
``locking_mode=EXCLUSIVE`` make a second opener fail with :class:`OutboxLocked`
instead of interleaving with us. That single ownership is also why the key index
(``has_key``) and the row/byte counters can live in memory: nobody else writes the file.

Opening never modifies a file it does not recognise: a non-SQLite file, a damaged one or
someone else's SQLite database raises :class:`OutboxCorrupt` and is left as it was.

This module is the file's life (open, check, lock, recover, close, one store per file
and process) and the store contract a message's way relies on
(:class:`~msgsafe.ports.OutboxStore`: put, claim, delivered, failed, release, stats).
Its collaborators: the writer that commits (:mod:`msgsafe.outbox._writer`), the leases
(:mod:`msgsafe.outbox._claims`), the counts kept in memory
(:mod:`msgsafe.outbox._tally`), and what an operator asks of the file through
``msgsafe outbox`` (:mod:`msgsafe.outbox._sqlite_operator`: list, quarantine, replay,
purge, locate, absorb), which :class:`SqliteOutbox` offers as its own methods.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    MessageIdReused,
    MsgsafeError,
    OutboxCorrupt,
    OutboxError,
    OutboxFull,
    OutboxGone,
    OutboxLocked,
)
from msgsafe.message import Batch, Envelope
from msgsafe.outbox._blocks import split
from msgsafe.outbox._claims import Claims
from msgsafe.outbox._rows import (
    COLUMNS,
    COLUMNS_AT,
    INSERT,
    OutboxEntry,
    QuarantinedEntry,
    Rows,
    batch_rows,
    envelope_rows,
    insert_rows,
    redact_target,
    reused_ids_error,
)
from msgsafe.outbox._schema import (
    APPLICATION_ID,
    RETRY_LATER,
    check_header,
    migrate,
    rollback,
    salvage_hint,
    take_lock,
    translate_sqlite_error,
)
from msgsafe.outbox._sqlite_operator import OperatorQueries
from msgsafe.outbox._tally import Tally, recount
from msgsafe.outbox._writer import GroupCommitWriter, Handler, HandlerResult
from msgsafe.ports import OutboxStats, StoreCapabilities

__all__ = ["SqliteOutbox", "held_here"]

log = logging.getLogger("msgsafe.outbox")

_AGE_CHECK_S = 1.0
_IN_CHUNK = 500  # ids per "IN (...)" list, far below SQLite's variable limit


#: Stores opened through SqliteOutbox.shared, by real path.
_shared: dict[str, SqliteOutbox] = {}
_shared_lock = threading.Lock()
#: Shared stores whose last user closed them and that still hold their file, by real
#: path: set once the file is free (shared() waits for it rather than fail to lock it).
_closing: dict[str, threading.Event] = {}
#: How long shared() waits for a closing store of the same file to let it go.
_CLOSING_WAIT_S = 30.0
#: Real paths of every file a SqliteOutbox of this process holds (shared or not).
_held: set[str] = set()
_held_lock = threading.Lock()  # NOTE: not _shared_lock: shared() opens while holding that


def held_here(path: str | os.PathLike[str]) -> bool:
    """True while a store of this process holds ``path``. Such a file must not even be
    opened by another descriptor: closing any descriptor of a file drops the POSIX locks
    SQLite holds on it for this process."""
    with _held_lock:
        return os.path.realpath(path) in _held


class SqliteOutbox:
    """An :class:`~msgsafe.ports.OutboxStore` in one SQLite file.

    Bounds: ``max_rows`` waiting messages, ``max_bytes`` of their payloads, and
    ``max_age_s`` — once the oldest waiting message is older than that, new puts are
    refused (the broker has been unreachable too long; nothing already stored is dropped).
    Any bound, or a full disk, raises :class:`OutboxFull` and stores nothing of that put.

    ``target`` is the broker URL the rows are for (credentials are stripped).
    ``check`` is the integrity check run on open: ``"quick"`` (``PRAGMA quick_check``),
    ``"full"`` (``PRAGMA integrity_check``) or ``"off"``. ``clock`` (epoch seconds) is
    injectable for tests. Thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_rows: int = 10_000_000,
        max_bytes: int = 4 << 30,
        max_age_s: float = 7 * 24 * 3600.0,
        target: str | None = None,
        check: Literal["quick", "full", "off"] = "quick",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_rows < 1 or max_bytes < 1 or max_age_s <= 0:
            raise ConfigurationError("outbox bounds must be positive")
        if check not in ("quick", "full", "off"):
            raise ConfigurationError("check must be 'quick', 'full' or 'off'")
        self.path = Path(path)
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._target = redact_target(target)
        self._clock = clock
        self._lock = threading.Lock()  # guards _closed (the counts have the tally's)
        self._claims = Claims()  # leases live in memory: see msgsafe.outbox._claims
        self._tally = Tally(self._claims)  # so do the counts: see msgsafe.outbox._tally
        self._operator = OperatorQueries(self._call, self._read, self._tally)
        self._closed = False
        self._users = 1
        self._shared_key = ""
        self._lock_fd = -1
        #: (device, inode) of the file opened: still the one at ``path``? (see put)
        self._identity: tuple[int, int] = (-1, -1)
        #: Set once the file is found no longer at its path, for good (see put).
        self._gone: OutboxGone | None = None
        self._holds = False  # this store's path is in _held
        self._conn: sqlite3.Connection | None = None
        try:
            self._open(check)
        except BaseException:
            self._release()
            raise
        if self._conn is None:  # pragma: no cover - _open sets it or raises
            raise OutboxError("the outbox connection was not opened")
        self._writer: GroupCommitWriter = GroupCommitWriter(self._conn, self._translate)
        self._writer.start()

    # --- opening -----------------------------------------------------------------------------

    def _open(self, check: str) -> None:
        path = self.path
        if path.is_dir():
            raise ConfigurationError(f"outbox path {path} is a directory")
        if not path.parent.is_dir():
            raise ConfigurationError(f"outbox directory {path.parent} does not exist")
        check_header(path)
        if held_here(path):
            raise OutboxLocked(f"the outbox file {path} is already open in this process")
        try:
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise OutboxError(f"cannot open the outbox file {path}: {exc}") from exc
        take_lock(self._lock_fd, path)
        held = os.fstat(self._lock_fd)
        self._identity = (held.st_dev, held.st_ino)
        with _held_lock:
            _held.add(os.path.realpath(path))
        self._holds = True
        try:
            conn = sqlite3.connect(path, timeout=1.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        self._conn = conn
        try:
            # NOTE: nothing below may write until the file is known to be ours.
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            if not self._at_path():
                # SQLite opened the path after the lock's descriptor: the same file, or
                # the lock would guard another one than the database.
                raise OutboxError(f"the outbox file {path} was replaced while it was opened")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
            if app_id != APPLICATION_ID and (app_id != 0 or version != 0 or tables):
                raise OutboxCorrupt(
                    f"{path} is an SQLite database but not an msgsafe outbox "
                    f"(application_id={app_id}, {len(tables)} schema objects); "
                    "it was left untouched"
                )
            if tables and check != "off":
                pragma = "quick_check" if check == "quick" else "integrity_check"
                result = [r[0] for r in conn.execute(f"PRAGMA {pragma}")]
                if result != ["ok"]:
                    raise OutboxCorrupt(
                        f"the outbox file {path} failed its integrity check "
                        f"({'; '.join(result[:3])}); {salvage_hint(path)}"
                    )
            conn.execute("PRAGMA journal_mode = WAL")
            # NOTE: FULL: a put is the promise (STORED means on disk), so its commit
            # syncs the WAL. Claims commit nothing (msgsafe.outbox._claims). Removals and
            # releases need no sync of their own (lost, they only re-send: a duplicate)
            # but share the writer's transactions with puts, so they get it anyway.
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            migrate(conn, version)
            self._recover(conn)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc

    def _recover(self, conn: sqlite3.Connection) -> None:
        # The file is ours alone, so any lease in it belongs to a process that died:
        # make those messages ready again now instead of after the lease ran out.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("UPDATE outbox SET ready_at = 0.5 WHERE ready_at > 0.5")
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        self._tally.load(conn)

    def _translate(self, exc: sqlite3.Error) -> MsgsafeError:
        return translate_sqlite_error(exc, str(self.path))

    def _release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if self._lock_fd >= 0:
            # Closing our descriptor only after SQLite closed its own: closing any
            # descriptor of the file drops the process's POSIX locks on it.
            if self._holds:
                with _held_lock:
                    _held.discard(os.path.realpath(self.path))
                self._holds = False
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- the OutboxStore protocol ---------------------------------------------------------

    #: Claims as columns that follow keys in flight, whole batches put from their
    #: columns, releases in one commit, counts from memory (see msgsafe.ports).
    capabilities = StoreCapabilities(
        claim_rows=True, put_batch_async=True, release=True, pending=True
    )

    @property
    def target(self) -> str:
        """The broker URL (without credentials) the rows are stored for."""
        return self._target

    def put(self, envelopes: Sequence[Envelope]) -> None:
        """Store ``envelopes`` durably (fsync'd when this returns), all or none.

        Raises :class:`OutboxFull` at a bound or on a full disk, :class:`ClosedError`
        after :meth:`close`, :class:`OutboxGone` once the file is no longer the one at
        :attr:`path` (its directory removed, the file deleted or replaced): a row in a
        file nobody can open again is lost with this process, so a put is durable only
        if the file is still at its path after its commit. That is checked once per
        commit group, before and after it (two ``stat`` calls of a few microseconds, to
        a commit's fsync of hundreds); once it fails the store takes no more puts, logs
        at ERROR how many messages the lost file holds (and which), and
        :meth:`pending` raises the same error. The forwarder still forwards what the
        lost file holds while the process lives: nothing else can.
        """
        if not envelopes:
            return
        if self._closed:
            raise ClosedError("the outbox is closed")
        # The rows are made in the caller's thread: the writer only binds.
        self._writer.call(self._put_batch, envelope_rows(envelopes, self._target))

    def put_async(self, envelopes: Sequence[Envelope]) -> Future[None]:
        """Like :meth:`put`, returning a future that resolves once the envelopes are
        durable."""
        if not envelopes:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return self._submit(self._put_batch, envelope_rows(envelopes, self._target))

    def put_batch_async(self, batch: Batch) -> Future[None]:
        """Every message of ``batch`` as :meth:`put_async` stores ``batch.envelope(i)``
        for each ``i`` (the same rows, in batch order, all or none), built from the
        batch's columns: the producer's way to buffer a batch during an outage."""
        return self._submit(self._put_batch, batch_rows(batch, self._target))

    def claim(self, *, limit: int, lease_s: float) -> builtins.list[Envelope]:
        """Lease up to ``limit`` ready envelopes for ``lease_s`` seconds, oldest first,
        each key's messages a prefix of its queue (see the protocol). A read: leases
        are kept in memory (:mod:`msgsafe.outbox._claims` says why that is safe)."""
        return list(self.claim_rows(limit=limit, lease_s=lease_s))

    def claim_rows(
        self, *, limit: int, lease_s: float, follow: Mapping[bytes, int] | None = None
    ) -> Sequence[Envelope]:
        """:meth:`claim` without an envelope per row (the forwarder's claim, see
        :class:`~msgsafe.outbox._rows.ClaimedRows`); for the keys in ``follow``, the
        rows after those the caller holds in flight (see :mod:`msgsafe.outbox._claims`)."""
        if limit < 1:
            return []
        rows: Sequence[Envelope] = self._read(self._claim_batch, (limit, lease_s, follow))
        return rows

    def delivered(self, ids: Sequence[str]) -> None:
        """Remove envelopes the broker confirmed. Unknown ids are ignored."""
        if ids:
            self._call(self._delivered_batch, list(ids))

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        """Release a leased envelope until ``retry_at`` (epoch seconds), or move it to the
        quarantine with ``error`` when ``retry_at`` is None."""
        self._call(self._failed_batch, (message_id, error, retry_at))

    def release(self, items: Sequence[tuple[str, str]], *, retry_at: float) -> None:
        """Release many leased envelopes ``(id, error)`` until ``retry_at`` in one commit."""
        if items:
            self._call(self._release_batch, ([(retry_at, err, mid) for mid, err in items]))

    def has_key(self, key: bytes) -> bool:
        """True while any envelope of ``key`` waits (O(1): an in-memory index)."""
        # NOTE: no lock: a dict lookup is atomic, and the index is replaced whole, never
        # left half-built. Under the lock the answer would be the same one, a moment
        # later: the key barrier rests on the producer's counts, not on this instant.
        return key in self._tally.keys

    def stats(self) -> OutboxStats:
        """Depth, payload bytes, age of the oldest waiting message, quarantined count,
        and whether the file is gone from its path (see :meth:`put`)."""
        oldest: float | None = self._read(self._oldest_batch, None)
        tally = self._tally
        with tally.lock:
            counts = tally.counts
            return OutboxStats(
                depth=counts.rows,
                bytes=counts.bytes,
                oldest_age_s=None if oldest is None else max(0.0, self._clock() - oldest),
                quarantined=counts.quarantined,
                gone=self._gone is not None,
            )

    def pending(self) -> int:
        """How many messages wait (quarantined ones not counted). Raises
        :class:`OutboxGone` once the file is no longer at its path (see :meth:`put`):
        they wait in a file no process will open again."""
        if self._gone is not None:
            raise self._gone.with_id(None)
        tally = self._tally
        with tally.lock:
            return tally.counts.rows

    def close(self) -> None:
        """Finish queued writes, checkpoint, release the file and its lock. Idempotent.

        A store obtained through :meth:`shared` closes when its last user closed it.
        """
        released: threading.Event | None = None
        with _shared_lock:
            if self._users > 1:
                self._users -= 1
                return
            self._users = 0
            if _shared.get(self._shared_key) is self:
                del _shared[self._shared_key]
                released = _closing[self._shared_key] = threading.Event()
        try:
            self._close_file()
        finally:
            if released is not None:
                with _shared_lock:
                    if _closing.get(self._shared_key) is released:
                        del _closing[self._shared_key]
                released.set()

    def _close_file(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._writer.close()
        if self._gone is not None:
            counts = self._tally.counts
            if counts.rows or counts.quarantined:
                log.error(
                    "closing the outbox %s, which is no longer at its path: %d waiting "
                    "and %d quarantined messages in it are lost",
                    self.path,
                    counts.rows,
                    counts.quarantined,
                )
        self._release()

    @classmethod
    def shared(cls, path: str | os.PathLike[str], *, target: str | None = None) -> SqliteOutbox:
        """The store for ``path`` in this process, opened once and shared by every caller
        (each must :meth:`close` it; the file closes with the last one).

        The file admits one process; within it, several producers for one broker (one
        default file) share the store instead of failing with :class:`OutboxLocked`.
        """
        key = os.path.realpath(path)
        deadline = time.monotonic() + _CLOSING_WAIT_S
        while True:
            with _shared_lock:
                closing = _closing.get(key)
                if closing is None:
                    store = _shared.get(key)
                    if store is not None and not store._closed:
                        store._users += 1
                        return store
                    store = cls(path, target=target)
                    store._shared_key = key
                    _shared[key] = store
                    return store
            # Its last user closed it a moment ago and it still holds the file: opening
            # now would fail with OutboxLocked although the file is this process's.
            if not closing.wait(max(0.0, deadline - time.monotonic())):
                raise OutboxLocked(f"{path}: still being closed in this process")

    def __repr__(self) -> str:
        return f"SqliteOutbox({str(self.path)!r}, target={self._target!r})"

    # --- what an operator asks (msgsafe outbox): msgsafe.outbox._sqlite_operator ---------

    def list(self, limit: int = 100, offset: int = 0) -> builtins.list[OutboxEntry]:
        """Waiting messages in queue order."""
        return self._operator.list(limit, offset)

    def quarantined(self, limit: int = 100, offset: int = 0) -> builtins.list[QuarantinedEntry]:
        """Quarantined messages, oldest first, with the error that put them there."""
        return self._operator.quarantined(limit, offset)

    def destinations(self, limit: int = 20) -> builtins.list[tuple[str, int]]:
        """Waiting messages per destination, the fullest first (at most ``limit``)."""
        return self._operator.destinations(limit)

    def replay(self, ids: Sequence[str] | Literal["all"]) -> int:
        """Move quarantined messages back to the end of the queue; returns how many."""
        return self._operator.replay(ids)

    def purge(
        self,
        ids: Sequence[str] | Literal["all"],
        *,
        waiting: bool = False,
        quarantined: bool = True,
    ) -> int:
        """Delete messages (``ids`` or ``"all"``) for good: quarantined ones unless
        ``quarantined=False``, waiting ones too with ``waiting=True``. Returns how many
        were deleted."""
        return self._operator.purge(ids, waiting=waiting, quarantined=quarantined)

    def locate(self, ids: Sequence[str]) -> dict[str, Literal["waiting", "quarantined"]]:
        """Where each of ``ids`` is; ids in neither table are left out (unknown)."""
        return self._operator.locate(ids)

    def absorb(self, other: SqliteOutbox) -> tuple[int, int]:
        """Move every message of ``other`` (another outbox file for the same destination,
        opened by this process) into this one; returns ``(waiting, quarantined)`` moved.

        Its waiting messages go ahead of the ones waiting here, in their own order, with
        their ids and attempts; its quarantine joins this quarantine. Bounds do not apply:
        these messages were accepted already. A crash while they move leaves a message in
        both files (sent twice at worst, never lost; an id already here is not added).
        """
        return self._operator.absorb(other._operator)

    # --- writer-thread handlers -----------------------------------------------------------

    def _submit(self, handler: Handler, payload: object) -> Future[Any]:
        if self._closed:
            raise ClosedError("the outbox is closed")
        future: Future[Any] = self._writer.submit(handler, payload)
        return future

    def _call(self, handler: Handler, payload: object) -> Any:
        if self._closed:
            raise ClosedError("the outbox is closed")
        return self._writer.call(handler, payload)

    def _read(self, handler: Handler, payload: object) -> Any:
        # Reads never share a transaction with writes (see GroupCommitWriter).
        if self._closed:
            raise ClosedError("the outbox is closed")
        return self._writer.call(handler, payload, read_only=True)

    def _put_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        gone = self._verify()
        if gone is not None:
            return HandlerResult([gone] * len(payloads))
        tally = self._tally
        counts = tally.counts
        rows, size = counts.rows, counts.bytes
        now = self._clock()
        if now - tally.oldest_checked > _AGE_CHECK_S or tally.oldest_at is None:
            # Looked up at most once a second: the age bound needs no finer grain, and
            # every statement costs a GIL hand-off under load.
            tally.oldest_at, tally.oldest_checked = _oldest(conn), now
        too_old = tally.oldest_at is not None and now - tally.oldest_at > self.max_age_s
        results: builtins.list[object] = []
        accepted: builtins.list[Rows] = []
        count = inserts = 0
        before = conn.total_changes
        for batch in payloads:
            if too_old or rows + batch.count > self.max_rows or size + batch.size > self.max_bytes:
                results.append(self._full(too_old, rows + batch.count > self.max_rows))
                continue
            changed = conn.total_changes
            if batch.spans is not None:
                # Blocks reserve their members' seq values above every row in the file.
                (top,) = conn.execute("SELECT coalesce(max(seq), 0) FROM outbox").fetchone()
                batch.place(top)
                insert_rows(conn, batch.params, at=True)
            elif batch.count == 1:
                conn.execute(INSERT, batch.params)
            else:
                insert_rows(conn, batch.params)
            added = conn.total_changes - changed
            if added != batch.inserts:
                # Some ids are stored already: a put repeated (kept as it is), or an id
                # reused for another message (refused, and this put undone).
                reused = _refuse_reused(conn, batch, added)
                if reused is not None:
                    results.append(reused)
                    continue
            inserts += batch.inserts
            rows += batch.count
            size += batch.size
            count += batch.count
            accepted.append(batch)
            results.append(None)
        if not accepted:
            return HandlerResult(results)
        # Fewer changes than rows: some ids were already stored (a put repeated after an
        # unknown outcome, or a put refused and undone); the stored copies stay and the
        # counters are rebuilt from the file.
        if conn.total_changes - before != inserts:
            return HandlerResult(results, partial(tally.replaced, recount(conn)), self._verify)
        return HandlerResult(results, partial(tally.added, accepted), self._verify)

    def _at_path(self) -> bool:
        """True while the file at :attr:`path` is the one this store opened."""
        try:
            found = os.stat(self.path)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == self._identity

    def _verify(self) -> OutboxGone | None:
        """None while the file is at its path; the error of a put otherwise (found out
        once, for good: a file of the same name later is not this one). Writer thread."""
        if self._gone is None:
            if self._at_path():
                return None
            self._gone = self._lost()
        return self._gone.with_id(None)

    def _lost(self) -> OutboxGone:
        """The error for a file found no longer at its path, logged at ERROR with what
        it holds (in the writer thread, between transactions or inside a put's)."""
        path = self.path
        if not path.parent.exists():
            why = "its directory was removed"
        elif not path.exists():
            why = "the file was removed"
        else:
            why = "another file took its place"
        conn = self._conn
        first = last = None
        counts = self._tally.counts
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                first = conn.execute("SELECT id FROM outbox ORDER BY seq LIMIT 1").fetchone()
                last = conn.execute("SELECT id FROM outbox ORDER BY seq DESC LIMIT 1").fetchone()
        held = f"{counts.rows} waiting messages"
        if first is not None and last is not None:
            held += f" (ids {first[0]} .. {last[0]} in queue order)"
        log.error(
            "the outbox file %s is no longer at its path (%s): %s and %d quarantined "
            "ones are in a file no process can open again, lost if this process ends "
            "before they are forwarded; sends are no longer stored (they raise "
            "OutboxGone): give the producer an outbox on a persistent volume",
            path,
            why,
            held,
            counts.quarantined,
        )
        return OutboxGone(
            f"the outbox file {path} is no longer at its path ({why}): the message was not "
            f"stored; {held} in it are lost if this process ends before they are forwarded",
            path=str(path),
            at_risk=counts.rows + counts.quarantined,
        )

    def _full(self, too_old: bool, too_many: bool) -> OutboxFull:
        """The error of a put refused at a bound (see :meth:`_put_batch`)."""
        if too_old:
            return OutboxFull(
                f"the oldest waiting message is older than max_age_s={self.max_age_s}"
            )
        if too_many:
            return OutboxFull(f"the outbox holds max_rows={self.max_rows}")
        return OutboxFull(f"the outbox holds max_bytes={self.max_bytes}")

    def _claim_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        now = self._clock()
        claims = self._claims
        return HandlerResult([claims.claim(conn, now, *payload) for payload in payloads])

    def _delivered_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        ids = [i for payload in payloads for i in payload]
        removed: builtins.list[tuple[bytes | None, int]] = []
        plain, split_ids, whole = self._settle_blocks(conn, ids, removed)
        for start in range(0, len(plain), _IN_CHUNK):
            chunk = plain[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            removed.extend(
                conn.execute(
                    f"DELETE FROM outbox WHERE id IN ({marks}) RETURNING key, size", chunk
                ).fetchall()
            )
        after = self._tally.removed(removed, settled=ids)
        return HandlerResult(
            [None] * len(payloads), self._split_after(conn, split_ids, whole, after)
        )

    def _settle_blocks(
        self,
        conn: sqlite3.Connection,
        ids: builtins.list[str],
        removed: builtins.list[tuple[bytes | None, int]],
    ) -> tuple[builtins.list[str], builtins.list[str], bool]:
        """Remove the blocks whose every member is in ``ids`` (one statement each), split
        those of which only some are; returns the ids to remove as rows, the ids of the
        split blocks' members and whether every split wrote all its members."""
        blocks = self._claims.blocks
        if not blocks:
            return ids, [], True
        plain: builtins.list[str] = []
        members: dict[int, builtins.list[str]] = {}
        for message_id in ids:
            seq = blocks.get(message_id)
            if seq is None:
                plain.append(message_id)
            else:
                members.setdefault(seq, []).append(message_id)
        partial_seqs: builtins.list[int] = []
        for seq, settled in members.items():
            gone = conn.execute(
                "DELETE FROM outbox WHERE seq = ? AND block IS NOT NULL AND count = ?"
                " RETURNING key, size, count",
                (seq, len(set(settled))),
            ).fetchone()
            if gone is None:
                # Some members only (or the block is split already): as rows.
                partial_seqs.append(seq)
                plain += settled
            else:
                key, size, count = gone
                removed.append((key, size))
                removed.extend(repeat((key, 0), count - 1))
        split_ids, whole = split(conn, partial_seqs)
        return plain, split_ids, whole

    def _split_after(
        self,
        conn: sqlite3.Connection,
        split_ids: builtins.list[str],
        whole: bool,
        after: Callable[[], None] | None,
    ) -> Callable[[], None] | None:
        """``after``, preceded by forgetting the blocks of ``split_ids`` and, when a split
        found an id stored twice, followed by a recount of the file."""
        if not split_ids:
            return after
        recount_after = None if whole else self._tally.recounted(conn)
        claims = self._claims

        def apply() -> None:
            claims.unblock(split_ids)
            if after is not None:
                after()
            if recount_after is not None:
                recount_after()

        return apply

    def _split_members(
        self, conn: sqlite3.Connection, ids: Iterable[str]
    ) -> tuple[builtins.list[str], bool]:
        """Split the blocks that ``ids`` are members of: one message needs handling on its
        own (a retry, the quarantine)."""
        blocks = self._claims.blocks
        if not blocks:
            return [], True
        seqs = {blocks[i] for i in ids if i in blocks}
        return split(conn, sorted(seqs))

    def _failed_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        removed: builtins.list[tuple[bytes | None, int]] = []
        quarantined = 0
        now = self._clock()
        split_ids, whole = self._split_members(conn, [payload[0] for payload in payloads])
        for payload in payloads:
            message_id, error, retry_at = payload
            if retry_at is not None:
                conn.execute(
                    RETRY_LATER,
                    (retry_at, error, message_id),
                )
                continue
            moved = conn.execute(
                "INSERT OR REPLACE INTO quarantine (id, target, destination, key, headers, body,"
                " created_at, size, attempts, error, quarantined_at)"
                " SELECT id, target, destination, key, headers, body, created_at, size,"
                " attempts + 1, ?, ? FROM outbox WHERE id = ?",
                (error, now, message_id),
            ).rowcount
            if moved:
                quarantined += 1
                removed.extend(
                    conn.execute(
                        "DELETE FROM outbox WHERE id = ? RETURNING key, size", (message_id,)
                    ).fetchall()
                )
        settled = [payload[0] for payload in payloads]
        after = self._tally.removed(removed, quarantined=quarantined, settled=settled)
        return HandlerResult(
            [None] * len(payloads), self._split_after(conn, split_ids, whole, after)
        )

    def _recount_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        # For rows written around the store's own methods (salvage's inserts): the
        # counts are rebuilt from the file once they are committed.
        return HandlerResult([None] * len(payloads), self._tally.recounted(conn))

    def _release_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        items = [item for payload in payloads for item in payload]
        ids = [i[2] for i in items]
        split_ids, whole = self._split_members(conn, ids)
        conn.executemany(RETRY_LATER, items)
        after = self._split_after(conn, split_ids, whole, partial(self._claims.drop, ids))
        return HandlerResult([None] * len(payloads), after)

    def _oldest_batch(
        self, conn: sqlite3.Connection, payloads: builtins.list[Any]
    ) -> HandlerResult[object]:
        oldest = _oldest(conn)
        return HandlerResult([oldest] * len(payloads))


def _oldest(conn: sqlite3.Connection) -> float | None:
    row = conn.execute("SELECT created_at FROM outbox ORDER BY seq LIMIT 1").fetchone()
    return None if row is None else float(row[0])


#: Ids per ``IN (...)`` list: under SQLite's default limit of 999 parameters.
_IDS_PER_QUERY = 900


def _refuse_reused(conn: sqlite3.Connection, batch: Rows, added: int) -> MessageIdReused | None:
    """None when every id of ``batch`` that was stored already holds the same message
    (destination, key, body), as the PostgreSQL store decides; otherwise the error, once
    the ``added`` rows this batch just inserted are deleted again (the last ones in
    ``seq`` order: one writer, one transaction), so that the put stores nothing."""
    columns, first = (COLUMNS_AT, 1) if batch.spans is not None else (COLUMNS, 0)
    params = batch.params
    wanted: dict[object, tuple[object, object, object]] = {}
    for at in range(first, len(params), columns):
        # id, target, destination, key, headers, body: the message is the 3rd, 4th, 6th.
        wanted[params[at]] = (params[at + 2], _plain(params[at + 3]), _plain(params[at + 5]))
    ids = list(wanted)
    differ: list[str] = []
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        for id, destination, key, body in conn.execute(
            f"SELECT id, destination, key, body FROM outbox WHERE id IN ({marks})", chunk
        ):
            if wanted[id] != (destination, _plain(key), _plain(body)):
                differ.append(str(id))
    if not differ:
        return None
    if added:
        conn.execute(
            "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq DESC LIMIT ?)",
            (added,),
        )
    return reused_ids_error(differ)


def _plain(value: object) -> object:
    """Bytes as ``bytes`` whatever buffer held them (a stored BLOB reads as bytes)."""
    return bytes(value) if isinstance(value, bytearray | memoryview) else value
