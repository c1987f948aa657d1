"""The SQLite outbox file: what it must look like, its lock, its schema, version and
migrations, and what its errors mean to a caller.

The file identifies itself with ``PRAGMA application_id`` (so a foreign SQLite file is
recognised and left alone) and records its schema version in ``PRAGMA user_version``.
Migrations run in order inside one transaction; a file from a newer msgsafe is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import sqlite3
import time
from pathlib import Path

from msgsafe.errors import MsgsafeError, OutboxCorrupt, OutboxError, OutboxFull, OutboxLocked

__all__ = [
    "APPLICATION_ID",
    "RETRY_LATER",
    "SCHEMA_VERSION",
    "check_header",
    "migrate",
    "salvage_hint",
    "take_lock",
    "translate_sqlite_error",
]

#: A transient failure: the row waits until its retry time; its attempt is counted.
RETRY_LATER = "UPDATE outbox SET ready_at = ?, last_error = ?, attempts = attempts + 1 WHERE id = ?"

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LOCK_WAIT_S = 0.1
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 5, 6, 11, 13, 26

#: "msgs" in ASCII: marks a file as an msgsafe outbox.
APPLICATION_ID = 0x6D736773

#: Each entry upgrades the schema from version ``index`` to ``index + 1``.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        # ready_at: epoch seconds when the row may be claimed (0.5: now). NOTE: SQLite stores
        # a REAL without fraction as a 0-byte integer; a claim would then grow every row
        # by 8 bytes and split pages. 0.5 keeps the row size fixed: claims update in place.
        # seq orders the queue; rowid reuse after deletes only ever yields a larger value
        # than every row still present, so the order of waiting messages is kept.
        """CREATE TABLE outbox (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            target TEXT NOT NULL,
            destination TEXT NOT NULL,
            key BLOB,
            headers TEXT,
            body BLOB NOT NULL,
            created_at REAL NOT NULL,
            size INTEGER NOT NULL,
            ready_at REAL NOT NULL DEFAULT 0.5,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT
        )""",
        # The per-key barrier of claim() looks for not-ready rows of one key: few, and
        # found through this index without scanning the key's whole queue.
        "CREATE INDEX outbox_key_ready ON outbox (key, ready_at) WHERE key IS NOT NULL",
        """CREATE TABLE quarantine (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            target TEXT NOT NULL,
            destination TEXT NOT NULL,
            key BLOB,
            headers TEXT,
            body BLOB NOT NULL,
            created_at REAL NOT NULL,
            size INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            error TEXT NOT NULL,
            quarantined_at REAL NOT NULL
        )""",
    ),
    (
        # Blocks (msgsafe.outbox._blocks): a row may hold the members of one stored
        # batch of one key. Adding columns rewrites nothing: rows written before read
        # as plain rows (count 1, no block).
        "ALTER TABLE outbox ADD COLUMN count INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE outbox ADD COLUMN block BLOB",
    ),
)

SCHEMA_VERSION = len(_MIGRATIONS)


def migrate(conn: sqlite3.Connection, current: int) -> None:
    """Bring the schema from ``current`` to :data:`SCHEMA_VERSION` in one transaction.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    if current > SCHEMA_VERSION:
        raise OutboxCorrupt(
            f"outbox schema version {current} is newer than this msgsafe understands "
            f"({SCHEMA_VERSION}); upgrade msgsafe"
        )
    if current == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for version in range(current, SCHEMA_VERSION):
            for statement in _MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any: SQLite may already have rolled it back by
    itself (SQLITE_FULL does), and a ROLLBACK then fails with "no transaction is active",
    hiding the error that matters."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


#: Room the outbox needs beyond its rows: SQLite's write-ahead log grows to about
#: 1000 pages (4 MiB) before its checkpoint, and a migration rewrites tables.
_HEADROOM = 8 << 20


def translate_sqlite_error(exc: sqlite3.Error, path: str = "") -> MsgsafeError:
    """Map a SQLite error to the outbox error a caller can act on."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    where = f" ({path})" if path else ""
    if code == _SQLITE_FULL:
        return OutboxFull(f"the disk holding the outbox is full{where}: {exc}; {_room(path)}")
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return OutboxLocked(f"the outbox file is locked by another process{where}: {exc}")
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return OutboxCorrupt(f"the outbox file is damaged{where}: {exc}; {salvage_hint(path)}")
    return OutboxError(f"outbox storage error{where}: {exc}")


def _room(path: str) -> str:
    """How much room the disk has, how much the outbox needs, and what to do."""
    folder = Path(path).parent if path else Path(".")
    try:
        stats = os.statvfs(folder)
    except OSError:
        return f"free at least {_HEADROOM >> 20} MiB there, or point outbox= at a bigger disk"
    free = stats.f_bavail * stats.f_frsize
    left = f"{free >> 20} MiB" if free >= 1 << 20 else f"{free >> 10} KiB"
    return (
        f"{left} free on {folder}, at least {_HEADROOM >> 20} MiB needed: "
        "free room there, or point outbox= at a bigger disk (the messages already in "
        "the outbox are intact)"
    )


def salvage_hint(path: str | Path) -> str:
    """What to tell the owner of a damaged outbox file: it was not changed, and the
    command that copies every intact message out of it."""
    name = shlex.quote(str(path)) if path else "PATH"
    return (
        "it was left untouched; copy its intact messages to a new file with "
        f"`msgsafe outbox salvage {name} --to NEW`, move it aside, then forward them "
        "with `msgsafe outbox drain NEW`"
    )


def take_lock(fd: int, path: Path) -> None:
    """Take the advisory lock that makes ``fd``'s file ours, or raise
    :class:`OutboxLocked`.

    A process only glancing at the file (:mod:`msgsafe.outbox.discovery`) holds the lock
    for milliseconds: worth a short wait before calling the file in use.
    """
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise OutboxLocked(f"the outbox file {path} is in use by another process") from exc
            time.sleep(0.005)


def check_header(path: Path) -> None:
    """Refuse a non-empty file that is not SQLite before SQLite gets to touch it."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutboxError(f"cannot read the outbox file {path}: {exc}") from exc
    if head and head != _SQLITE_MAGIC:
        raise OutboxCorrupt(
            f"{path} is not an SQLite file (another program's file, or an outbox damaged "
            "from its first bytes); it was left untouched: give the producer another "
            "outbox= path or move the file aside (were it an outbox, "
            f"`msgsafe outbox salvage {shlex.quote(str(path))} --to NEW` copies what is intact)"
        )
