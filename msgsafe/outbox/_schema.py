"""The SQLite outbox schema, its version and its migrations.

The file identifies itself with ``PRAGMA application_id`` (so a foreign SQLite file is
recognised and left alone) and records its schema version in ``PRAGMA user_version``.
Migrations run in order inside one transaction; a file from a newer msgsafe is refused.
"""

from __future__ import annotations

import sqlite3

from msgsafe.errors import OutboxCorrupt

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "migrate"]

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
        conn.execute("ROLLBACK")
        raise
