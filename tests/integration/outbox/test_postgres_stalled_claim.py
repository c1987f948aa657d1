"""A claimer stopped inside its claim transaction, on a real PostgreSQL server: between
two statements it holds its keys' advisory locks, and every other claimer skips those
keys for as long as it stays stopped. The store caps that idle time at about a lease
(``idle_in_transaction_session_timeout``, set for the claim's transaction only): the
server ends the stalled session, the keys are claimed by another store, and the stalled
claim fails with a typed error rather than leasing anything."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from msgsafe.errors import OutboxError
from msgsafe.message import Envelope
from msgsafe.outbox import PostgresOutbox
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LEASE_S = 1.0


class Stalling:
    """The store's connection, stopped after the statement that takes the claim's key
    locks until ``go`` is set (a SIGSTOP landing inside the claim transaction)."""

    def __init__(self, conn: Any, after: str) -> None:
        self._conn = conn
        self._after = after
        self.stalled = threading.Event()
        self.go = threading.Event()

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        cursor = self._conn.execute(query, *args, **kwargs)
        if query == self._after and not self.go.is_set():
            self.stalled.set()
            self.go.wait(60)
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_a_claim_stalled_inside_its_transaction_frees_its_keys_after_a_lease(
    postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = f"stalled_{uuid.uuid4().hex[:8]}"
    stalled = PostgresOutbox(postgres_conninfo, table=table, lease_s=LEASE_S)
    other = PostgresOutbox(postgres_conninfo, table=table, lease_s=LEASE_S)
    try:
        sent = [Envelope.build("q", b"%d" % i, key=f"k{i % 2}") for i in range(6)]
        stalled.put(sent)
        conn = Stalling(stalled._live(), stalled._sql["lock"])
        monkeypatch.setattr(stalled, "_live", lambda: conn)
        outcome: list[object] = []

        def claim() -> None:
            try:
                outcome.append(stalled.claim(limit=10, lease_s=30))
            except OutboxError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=claim, daemon=True)
        worker.start()
        wait_until(conn.stalled.is_set, 10, "the claim to stall holding its key locks")
        assert other.claim(limit=10, lease_s=30) == []  # both keys locked by the stall
        started = time.monotonic()
        taken: list[Envelope] = []

        def take() -> bool:
            taken.extend(other.claim(limit=10, lease_s=30))
            return bool(taken)

        wait_until(take, LEASE_S + 10, "another store to claim the stalled claim's keys")
        freed_s = time.monotonic() - started
        conn.go.set()
        worker.join(10)
        print(f"keys free {freed_s:.2f} s after the stall was seen (lease {LEASE_S} s)")
        assert [e.message_id for e in taken] == [e.message_id for e in sent]
        assert len(outcome) == 1 and isinstance(outcome[0], OutboxError), outcome
    finally:
        monkeypatch.undo()
        stalled.close()
        other.close()
