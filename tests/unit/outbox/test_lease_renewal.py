"""The forwarder and a store whose leases carry epochs (``capabilities.renew``, the
PostgreSQL outbox's): a claim that grew older than half its lease before it was published
(the process was paused between the claim and the publish) is renewed first, and sent
only when the store still holds it; a lost claim is neither sent nor settled. The store
side (epochs written at claim, settling fenced by them) is held to its contract by the
conformance suite and the paused-forwarder fleet test on PostgreSQL."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import pytest

from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import RenewingStore, store_capabilities
from tests.support.clock import Clock
from tests.unit.outbox.test_forwarder import ScriptedTransport, envs

LEASE_S = 0.05


class PausingStore:
    """A SQLite outbox that declares ``renew`` (answering ``renewals`` in turn) and whose
    next claim, when ``pause`` is set, returns only after that many seconds: the
    process stopped between its claim and its publish."""

    def __init__(self, inner: SqliteOutbox) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(
            store_capabilities(inner), claim_rows=False, renew=True
        )
        self.pause = 0.0
        self.renewals: list[bool] = []
        self.renewed: list[list[str]] = []
        self.settled: list[str] = []

    def put(self, envelopes: Sequence[Envelope]) -> None:
        self._inner.put(envelopes)

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        claimed = self._inner.claim(limit=limit, lease_s=lease_s)
        if self.pause:
            # NOTE: the fault itself (a SIGSTOP's length), not a wait for anything.
            time.sleep(self.pause)
            self.pause = 0.0
        return claimed

    def renew(self, ids: Sequence[str], *, lease_s: float) -> bool:
        self.renewed.append(list(ids))
        return self.renewals.pop(0)

    def delivered(self, ids: Sequence[str]) -> None:
        self.settled.append("delivered")
        self._inner.delivered(ids)

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        self.settled.append("failed")
        self._inner.failed(message_id, error=error, retry_at=retry_at)

    def release(self, items: Sequence[tuple[str, str]], *, retry_at: float) -> None:
        self.settled.append("release")
        self._inner.release(items, retry_at=retry_at)

    def has_key(self, key: bytes) -> bool:
        return self._inner.has_key(key)

    def pending(self) -> int:
        return self._inner.pending()

    def stats(self) -> Any:
        return self._inner.stats()

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def store(store: SqliteOutbox) -> PausingStore:
    """The outbox's store (conftest.py), taken for a renewing one."""
    return PausingStore(store)


def test_the_store_is_taken_for_a_renewing_one(store: PausingStore) -> None:
    assert isinstance(store, RenewingStore) and store.capabilities.renew


def test_a_claim_published_at_once_is_not_renewed(store: PausingStore, clock: Clock) -> None:
    store.put(envs(6, keys=2))
    transport = ScriptedTransport()
    fwd = Forwarder(store, transport, lease_s=LEASE_S, clock=clock)
    assert fwd.step() == 6
    assert store.renewed == []
    assert len(transport.published) == 6 and store.pending() == 0


def test_a_claim_paused_past_half_its_lease_is_renewed_then_sent(
    store: PausingStore, clock: Clock
) -> None:
    sent = envs(6, keys=2)
    store.put(sent)
    transport = ScriptedTransport()
    fwd = Forwarder(store, transport, lease_s=LEASE_S, clock=clock)
    store.pause, store.renewals = LEASE_S, [True]
    assert fwd.step() == 6
    assert store.renewed == [[e.message_id for e in sent]]
    assert [e.message_id for e in transport.published] == [e.message_id for e in sent]
    assert store.pending() == 0 and fwd.stats().delivered == 6


def test_a_lost_claim_is_neither_sent_nor_settled_and_the_next_claim_goes_on(
    store: PausingStore, clock: Clock
) -> None:
    sent = envs(6, keys=2)
    store.put(sent)
    transport = ScriptedTransport()
    fwd = Forwarder(store, transport, lease_s=LEASE_S, clock=clock)
    store.pause, store.renewals = LEASE_S, [False]
    assert fwd.step() == 6
    print(f"lost claim: renewed={len(store.renewed)} published={len(transport.published)}")
    assert len(store.renewed) == 1
    assert transport.published == [] and store.settled == []
    assert fwd.stats().delivered == 0 and store.pending() == 6
    # The store gave the claim up (here: its lease runs out); the forwarder claims again.
    clock.now += 3600
    assert fwd.step() == 6
    assert [e.message_id for e in transport.published] == [e.message_id for e in sent]
    assert store.pending() == 0 and len(store.renewed) == 1
