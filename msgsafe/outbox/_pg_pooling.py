"""A PostgreSQL store behind a connection pooler (PgBouncer): what it may rely on, and
which pooling it finds.

In **transaction** pooling (PgBouncer's ``pool_mode = transaction``) each transaction of
a client runs on whichever server connection is free, so nothing a server session keeps
follows the client to its next transaction:

- **prepared statements**: psycopg prepares a query after its fifth run on a
  connection (``prepare_threshold=5``) and then runs it by name, which the next server
  connection does not know (``prepared statement "_pg3_0" does not exist``). Every
  connection msgsafe opens to a store or an inbox therefore prepares nothing
  (:data:`CONNECT_OPTIONS`: ``prepare_threshold=None``), pooled or not: a query costs
  one parse more, which the outbox's round trips dwarf.
- **session advisory locks**: none are taken; the claim's key locks and the schema
  lock are transaction-scoped (``pg_advisory_xact_lock``, ``pg_try_advisory_xact_lock``)
  and end with the transaction that holds the server connection.
- **LISTEN**: a listening session's notifications reach the server connection, not the
  client, once the transaction ends. A store that finds transaction pooling declares no
  wake-ups (``capabilities.notify`` False): forwarders look for rows every
  ``_IDLE_POLL_S`` (one second) when idle instead of being woken at once.
- **SET**: msgsafe sets nothing in a session.

In **statement** pooling a transaction of several statements is refused, and the outbox
commits each put in one: the store refuses to open
(:class:`~msgsafe.errors.OutboxPoolingUnsupported`, naming ``pool_mode``).

How the pooling is found (:func:`pooling_mode`), a heuristic, since a pooler's own
settings (``SHOW pool_mode``) are on its admin console, not behind the application's
URL: PgBouncer hands each client a made-up backend pid, so a ``pg_backend_pid()`` other
than the one the connection's handshake announced says that something sits between
(``direct`` otherwise). Then a second connection opens a transaction: under transaction
pooling it is given the server connection the first one just released (the same
``pg_backend_pid()``), or the first one's next statement runs on another server
connection; under session pooling neither happens. A pooler that hands out server
connections in another order could hide transaction pooling from it (reported as
``session``); it never reports transaction pooling where there is none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

__all__ = ["CONNECT_OPTIONS", "POOL_MODES", "PoolMode", "describe_mode", "pooling_mode"]

PoolMode = Literal["direct", "session", "transaction", "statement"]
POOL_MODES: Final = ("direct", "session", "transaction", "statement")

#: What every msgsafe connection to a store or an inbox is opened with: autocommit
#: (transactions are explicit) and no prepared statements (see the module docstring).
CONNECT_OPTIONS: Final[dict[str, Any]] = {"autocommit": True, "prepare_threshold": None}

_PID = "SELECT pg_backend_pid()"


def _pid(conn: Any) -> int:
    row = conn.execute(_PID).fetchone()
    return int(row[0])


def pooling_mode(conn: Any, connect: Callable[[], Any]) -> PoolMode:
    """The pooling between ``conn`` (an autocommit connection, idle) and its server, as
    the module docstring finds it; ``connect()`` opens a second connection like it
    (closed here) when ``conn`` is not direct."""
    first = _pid(conn)
    if first == conn.info.backend_pid:
        return "direct"
    other = connect()
    try:
        try:
            other.execute("BEGIN")
            other_pid = _pid(other)
        except Exception as exc:
            # NOTE: PgBouncer in statement mode refuses the BEGIN of a transaction
            # ("transaction blocks not allowed in statement pooling mode").
            if "statement pooling" in str(exc):
                return "statement"
            raise
        try:
            if other_pid == first:
                return "transaction"
            # NOTE: asked only when the pool has another server connection: with one,
            # this would wait for the transaction held above until the pooler's timeout.
            second = _pid(conn)
        finally:
            other.execute("ROLLBACK")
    finally:
        other.close()
    return "transaction" if second != first else "session"


def describe_mode(mode: PoolMode) -> str:
    """One line for the doctor and the CLI saying what ``mode`` means for the store."""
    return {
        "direct": "no pooler between the client and the server",
        "session": (
            "a pooler in session mode (or one whose transaction pooling the heuristic "
            "cannot see): each client keeps its server session"
        ),
        "transaction": (
            "a pooler in transaction mode: no prepared statements, transaction-scoped "
            "locks only, and forwarders poll every second instead of LISTEN"
        ),
        "statement": (
            "a pooler in statement mode: the outbox's transactions are refused "
            "(set pool_mode = transaction or session for this database)"
        ),
    }[mode]
