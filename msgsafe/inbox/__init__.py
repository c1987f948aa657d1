"""The inbox: exactly-once effects for a consumer, in the handler's own database.

A consumer that applies a message's effects and then acknowledges it can crash between
the two; the broker then redelivers a message whose effects are already applied. The
inbox closes that gap: :meth:`~msgsafe.ports.InboxStore.process` records the message id
in the same transaction as the handler's writes, commits, and only then does the
consumer acknowledge the broker.

- a crash before the commit: nothing was applied and the id is not recorded; the broker
  redelivers and the handler runs again;
- a crash after the commit, before the acknowledgement: the broker redelivers, the id
  is found, the message is acknowledged without calling the handler.

Stores:

- :class:`SqliteInbox` — ``sqlite:///abs/path.db`` (three slashes and an absolute path;
  four, as SQLAlchemy writes absolute paths, mean the same) or ``sqlite:relative/path.db``
  (relative to the working directory when the inbox is opened); ``?table=T`` and
  ``&busy_timeout=S``.
- :class:`PostgresInbox` — ``postgresql://user@h1:5432,h2:5432/db?table=T`` with the
  outbox's multi-host fail-over (``target_session_attrs=read-write``, connection
  retries; ``&write_timeout=S``); needs the ``postgres`` extra, imported on first use.

Retention: a recorded id must outlive every redelivery of it, or the message is handled
again when it comes back. Prune (:meth:`~msgsafe.ports.InboxStore.prune`) only ids
older than the longest a producer may still deliver them: the outbox's longest wait
plus the broker's retention (a topic's ``retention.ms``, a queue's message TTL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgsafe.errors import ConfigurationError
from msgsafe.inbox._schema import DEFAULT_TABLE
from msgsafe.inbox.sqlite import SqliteInbox, parse_sqlite_url
from msgsafe.ports import InboxStore, Processed

if TYPE_CHECKING:
    from msgsafe.inbox.postgres import PostgresInbox

__all__ = [
    "DEFAULT_TABLE",
    "InboxStore",
    "PostgresInbox",
    "Processed",
    "SqliteInbox",
    "open_inbox",
    "parse_sqlite_url",
]


def open_inbox(url: str, **options: Any) -> InboxStore:
    """The inbox ``url`` names: ``sqlite:…`` or ``postgresql://…`` (see the module
    docstring); ``options`` go to the store's constructor. :class:`ConfigurationError`
    (never quoting a password) for any other URL."""
    if not isinstance(url, str):
        raise ConfigurationError(f"an inbox URL is a str, not {type(url).__name__}")
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        return SqliteInbox.from_url(url, **options)
    if scheme in ("postgresql", "postgres"):
        from msgsafe.inbox.postgres import PostgresInbox

        return PostgresInbox.from_url(url, **options)
    raise ConfigurationError(
        f"an inbox URL starts with sqlite: or postgresql://, not {scheme + ':'!r}"
    )


def __getattr__(name: str) -> object:
    # psycopg is an optional extra: import the PostgreSQL inbox only when asked for.
    if name == "PostgresInbox":
        from msgsafe.inbox.postgres import PostgresInbox

        return PostgresInbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
