"""The durable outbox: where a message waits when the broker cannot take it.

- :class:`SqliteOutbox` — the embedded default, one SQLite file per target.
- :class:`PostgresOutbox` — the transactional outbox (``send(..., transaction=conn)``);
  needs the ``postgres`` extra and is imported on first use.
- :class:`Forwarder` — the background thread that delivers stored messages in key order.
- :func:`open_store` — the producer's ``outbox=`` argument turned into a store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgsafe.outbox._rows import OutboxEntry, QuarantinedEntry
from msgsafe.outbox.forwarder import Forwarder, ForwarderStats
from msgsafe.outbox.location import OutboxSpec, default_path, open_store
from msgsafe.outbox.sqlite import SqliteOutbox

if TYPE_CHECKING:
    from msgsafe.outbox.postgres import PostgresOutbox

__all__ = [
    "Forwarder",
    "ForwarderStats",
    "OutboxEntry",
    "OutboxSpec",
    "PostgresOutbox",
    "QuarantinedEntry",
    "SqliteOutbox",
    "default_path",
    "open_store",
]


def __getattr__(name: str) -> object:
    # psycopg is an optional extra: import the PostgreSQL store only when asked for.
    if name == "PostgresOutbox":
        from msgsafe.outbox.postgres import PostgresOutbox

        return PostgresOutbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
