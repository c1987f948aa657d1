"""What the SQLite and PostgreSQL inboxes share: the tables, their SQL, the checks.

Three tables in the user's database, named after ``table`` (default ``msgsafe_inbox``):

- ``<table>``: one row per handled message id (``source``, the ``attempt`` that handled
  it, ``handled_at`` in epoch seconds), the id its primary key: the unique index is what
  makes a second insert of one id wait for the first transaction and then do nothing;
- ``<table>_attempts``: the durable attempt counter of ids not handled yet, dropped in
  the transaction that handles the id;
- ``<table>_schema``: the schema version (the user's database is not ours to stamp with
  ``PRAGMA user_version``); a newer version than this code knows is refused.

Retention: a record must outlive every redelivery of its id, or the message is handled
again when it comes back. Keep records at least as long as a producer may still deliver
the id — the outbox's longest wait (its ``max_age``, or how long an operator lets a
stored message sit) plus the broker's retention of an unacknowledged or replayable message
(a Kafka topic's ``retention.ms``, a queue's message TTL) — then prune older ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from msgsafe.errors import ConfigurationError, InboxError, InvalidMessage

__all__ = [
    "DEFAULT_TABLE",
    "SCHEMA_VERSION",
    "InboxSql",
    "check_id",
    "check_older_than",
    "check_records",
    "check_table",
    "check_version",
    "fresh_indexes",
]

DEFAULT_TABLE = "msgsafe_inbox"
#: The version of the tables below; a database holding a newer one is refused.
SCHEMA_VERSION = 1

_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


def check_table(table: str) -> str:
    """``table``, or :class:`ConfigurationError` unless a lower-case SQL identifier."""
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ConfigurationError(
            f"table must be a lower-case SQL identifier (letters, digits, _), not {table!r}"
        )
    return table


def check_id(message_id: object, source: object) -> None:
    """:class:`InvalidMessage` unless ``message_id`` is a non-empty string and ``source``
    a string."""
    if not isinstance(message_id, str) or not message_id:
        raise InvalidMessage(f"an inbox message id is a non-empty str, not {message_id!r}")
    if not isinstance(source, str):
        raise InvalidMessage(f"an inbox source is a str, not {type(source).__name__}")


def check_records(records: Sequence[tuple[str, str, int]]) -> None:
    """:func:`check_id` for each ``(id, source, attempt)`` of a batch."""
    for message_id, source, _attempt in records:
        # NOTE: the test check_id makes, inline: it runs once per message of a batch.
        if type(message_id) is not str or not message_id or type(source) is not str:
            check_id(message_id, source)


def check_older_than(older_than_s: float) -> float:
    """``older_than_s``, or :class:`ConfigurationError` unless a number >= 0."""
    if not isinstance(older_than_s, (int, float)) or math.isnan(older_than_s):
        raise ConfigurationError(f"older_than_s must be seconds, not {older_than_s!r}")
    if older_than_s < 0:
        raise ConfigurationError("older_than_s must be >= 0 seconds")
    return float(older_than_s)


def check_version(found: int | None, table: str) -> None:
    """:class:`InboxError` when the database holds a newer schema than this code knows."""
    if found is not None and found > SCHEMA_VERSION:
        raise InboxError(
            f"the inbox {table} has schema version {found}; this msgsafe knows "
            f"{SCHEMA_VERSION}: upgrade msgsafe"
        )


def fresh_indexes(records: Sequence[tuple[str, str, int]], inserted: set[str]) -> list[int]:
    """The indexes of ``records`` whose id a batch's insert returned (``inserted``,
    consumed); an id given twice is fresh at its first index only."""
    if len(inserted) == len(records):  # every id new (and none twice): the usual case
        return list(range(len(records)))
    fresh: list[int] = []
    for index, record in enumerate(records):
        if record[0] in inserted:
            inserted.discard(record[0])
            fresh.append(index)
    return fresh


@dataclass(frozen=True, slots=True)
class InboxSql:
    """The statements of an inbox on ``table``, with ``mark`` as the parameter marker
    (``?`` for sqlite3, ``%s`` for psycopg) and ``real`` as the floating-point type;
    ``keyed``: the id tables created ``WITHOUT ROWID`` (SQLite: the rows kept in the
    primary key's B-tree, one tree a table instead of a rowid table and the key's index,
    so a commit writes fewer pages; tables made before by ``CREATE TABLE IF NOT EXISTS``
    stay as they are and the statements are the same for both)."""

    table: str
    mark: str
    real: str
    keyed: bool = False

    def _q(self, text: str) -> str:
        return text.replace("?", self.mark)

    @property
    def schema(self) -> tuple[str, ...]:
        """The tables and index, each created if missing."""
        t, real = self.table, self.real
        keyed = " WITHOUT ROWID" if self.keyed else ""
        return (
            f"""CREATE TABLE IF NOT EXISTS {t} (
                message_id text PRIMARY KEY,
                source text NOT NULL,
                attempt integer NOT NULL,
                handled_at {real} NOT NULL){keyed}""",
            f"CREATE INDEX IF NOT EXISTS {t}_handled_at ON {t} (handled_at)",
            f"""CREATE TABLE IF NOT EXISTS {t}_attempts (
                message_id text PRIMARY KEY,
                source text NOT NULL,
                attempts integer NOT NULL,
                updated_at {real} NOT NULL){keyed}""",
            f"CREATE TABLE IF NOT EXISTS {t}_schema (version integer NOT NULL)",
        )

    @property
    def version(self) -> str:
        return f"SELECT max(version) FROM {self.table}_schema"

    @property
    def stamp(self) -> str:
        return self._q(f"INSERT INTO {self.table}_schema (version) VALUES (?)")

    @property
    def record(self) -> str:
        """Record an id: a row back when this transaction inserted it, none when the id
        is recorded (after waiting for a concurrent inserter of the same id to end)."""
        return self._q(
            f"INSERT INTO {self.table} (message_id, source, attempt, handled_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
        )

    @property
    def forget_attempts(self) -> str:
        return self._q(f"DELETE FROM {self.table}_attempts WHERE message_id = ?")

    @property
    def count_attempt(self) -> str:
        t = f"{self.table}_attempts"
        return self._q(
            f"INSERT INTO {t} (message_id, source, attempts, updated_at) VALUES (?, ?, 1, ?)"
            f" ON CONFLICT (message_id) DO UPDATE SET attempts = {t}.attempts + 1,"
            " source = excluded.source, updated_at = excluded.updated_at RETURNING attempts"
        )

    @property
    def prune(self) -> str:
        return self._q(f"DELETE FROM {self.table} WHERE handled_at < ?")

    @property
    def prune_attempts(self) -> str:
        return self._q(f"DELETE FROM {self.table}_attempts WHERE updated_at < ?")
