"""The warning PostgreSQL sends when a COMMIT stops waiting for its synchronous standbys
is heard (and nothing else is): the store then puts its rows again rather than report
STORED for rows only the primary holds. The server side runs in
tests/integration/outbox/test_postgres_url_store.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from msgsafe.outbox._pg_commit import standby_wait_cancelled


@dataclass
class _Diag:
    message_primary: str | None
    message_detail: str | None


class _Conn:
    def __init__(self) -> None:
        self.handlers: list[Callable[[Any], None]] = []

    def add_notice_handler(self, handler: Callable[[Any], None]) -> None:
        self.handlers.append(handler)

    def remove_notice_handler(self, handler: Callable[[Any], None]) -> None:
        self.handlers.remove(handler)

    def notice(self, diag: _Diag) -> None:
        for handler in self.handlers:
            handler(diag)


DETAIL = (
    "The transaction has already committed locally, but might not have been replicated "
    "to the standby."
)


def test_a_cancelled_standby_wait_is_heard() -> None:
    conn = _Conn()
    with standby_wait_cancelled(conn) as heard:
        conn.notice(_Diag("canceling wait for synchronous replication due to user request", DETAIL))
    assert heard == ["canceling wait for synchronous replication due to user request"]
    assert conn.handlers == []


def test_either_its_headline_or_its_detail_is_enough() -> None:
    conn = _Conn()
    with standby_wait_cancelled(conn) as heard:
        conn.notice(_Diag("a headline worded otherwise", DETAIL))
        conn.notice(
            _Diag(
                "canceling the wait for synchronous replication and terminating connection"
                " due to administrator command",
                None,
            )
        )
    assert len(heard) == 2


def test_other_notices_are_not_taken_for_it() -> None:
    conn = _Conn()
    with standby_wait_cancelled(conn) as heard:
        conn.notice(_Diag('relation "t" already exists, skipping', None))
        conn.notice(_Diag(None, None))
    assert heard == []
    assert conn.handlers == []
