"""A hypothesis state machine over the SQLite store and the forwarder.

The model is the queue itself: waiting rows in put order with their ``ready_at``. Every
claim is compared with the claim the model predicts (oldest first, per key a prefix of
its queue, nothing behind a leased or retrying head); forwarder rounds are checked
against what the transport accepted; a restart reopens the file. After every step
nothing is lost: every id ever put is waiting, delivered or quarantined.

Batches put whole are stored as blocks (msgsafe/outbox/_blocks.py): the model reads
which waiting messages still share a block from the file, and predicts that a claim
takes a block whole.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from msgsafe.errors import Refused, Rejected
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.outbox._blocks import unpack
from msgsafe.outbox._writer import HandlerResult
from msgsafe.ports import TransportCapabilities
from msgsafe.retry import RetryPolicy
from tests.support.clock import Clock

KEYS = st.sampled_from([None, "a", "b", "c"])


@dataclass
class Row:
    message_id: str
    key: bytes | None
    ready_at: float


class ChoosingTransport:
    """Outcomes drawn by the test: "ok", "transient" or "permanent" per publish."""

    capabilities = TransportCapabilities()

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.accepted: list[Envelope] = []
        self.attempted: list[tuple[Envelope, str]] = []

    @property
    def target(self) -> str:
        return "choosing://"

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        self.attempted.append((envelope, outcome))
        if outcome == "ok":
            self.accepted.append(envelope)
            future.set_result(None)
        elif outcome == "transient":
            future.set_exception(Refused("refused"))
        else:
            future.set_exception(Rejected("poison", condition="x"))
        return future

    def close(self, timeout: float | None = None) -> None:
        pass


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-sm-"))
        self.clock = Clock()
        self.store = SqliteOutbox(self.dir / "o.db", clock=self.clock)
        self.transport = ChoosingTransport()
        self.rows: list[Row] = []
        self.order: dict[str, int] = {}
        self.delivered: set[str] = set()
        self.quarantined: set[str] = set()
        self.leased: set[str] = set()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------

    def predicted_claim(self, limit: int) -> list[str]:
        now = self.clock.now
        blocked: set[bytes] = set()
        # A key with a row under an unexpired lease gives nothing, even a row before it
        # that was released meanwhile: sent now, it could arrive after the leased one.
        held = {
            r.key
            for r in self.rows
            if r.key is not None and r.message_id in self.leased and r.ready_at > now
        }
        blocks = self.blocks()
        out: list[str] = []
        for row in self.rows:
            # A claim stops at its limit, but not inside a block: it takes blocks whole.
            block = blocks.get(row.message_id)
            if len(out) >= limit and (block is None or block != blocks.get(out[-1])):
                break
            ready = row.ready_at <= now
            if row.key is not None and (row.key in blocked or row.key in held or not ready):
                if not ready:
                    blocked.add(row.key)
                continue
            if ready:
                out.append(row.message_id)
        return out

    def blocks(self) -> dict[str, int]:
        """The block of each waiting message still in one, as the file holds them."""

        def read(conn: sqlite3.Connection, payloads: list[Any]) -> HandlerResult[object]:
            found = {
                member: seq
                for seq, block in conn.execute(
                    "SELECT seq, block FROM outbox WHERE block IS NOT NULL"
                )
                for member in unpack(block)[0]
            }
            return HandlerResult([found] * len(payloads))

        found: dict[str, int] = self.store._read(read, None)
        return found

    def row(self, message_id: str) -> Row:
        return next(r for r in self.rows if r.message_id == message_id)

    def resync(self) -> None:
        # Leases are held in memory, not in the file: a leased row keeps its lease here.
        held = {r.message_id: r.ready_at for r in self.rows if r.message_id in self.leased}
        self.rows = [
            Row(e.envelope.message_id, e.envelope.key, held.get(e.envelope.message_id, e.ready_at))
            for e in self.store.list(limit=100_000)
        ]

    # --- rules -------------------------------------------------------------------------

    @rule(keys=st.lists(KEYS, min_size=1, max_size=8))
    def put(self, keys: list[str | None]) -> None:
        batch = [Envelope.build("q", b"body", key=k) for k in keys]
        self.store.put(batch)
        for e in batch:
            self.order[e.message_id] = len(self.order)
            self.rows.append(Row(e.message_id, e.key, 0.0))

    @rule(keys=st.lists(KEYS, min_size=2, max_size=8))
    def put_batch(self, keys: list[str | None]) -> None:
        batch = Batch.build("q", [b"body"] * len(keys), keys=keys)
        self.store.put_batch_async(batch).result(10)
        # The store keeps each key's messages together, keys in order of first sight.
        order: dict[bytes | None, list[int]] = {}
        for index, key in enumerate(batch.keys or []):
            order.setdefault(key, []).append(index)
        for indexes in order.values():
            for index in indexes:
                message_id = batch.message_ids[index]
                self.order[message_id] = len(self.order)
                self.rows.append(Row(message_id, batch.key(index), 0.0))

    @rule(limit=st.integers(1, 10), lease=st.sampled_from([1.0, 5.0, 30.0]))
    def claim(self, limit: int, lease: float) -> None:
        expected = self.predicted_claim(limit)
        got = [e.message_id for e in self.store.claim(limit=limit, lease_s=lease)]
        assert got == expected
        for message_id in got:
            self.row(message_id).ready_at = self.clock.now + lease
            self.leased.add(message_id)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.leased)), min_size=1, unique=True))
        self.store.delivered(chosen)
        self.rows = [r for r in self.rows if r.message_id not in chosen]
        self.delivered.update(chosen)
        self.leased.difference_update(chosen)

    @precondition(lambda self: self.leased)
    @rule(data=st.data(), delay=st.sampled_from([0.0, 2.0, 10.0]))
    def fail_for_later(self, data: st.DataObject, delay: float) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.leased)))
        self.store.failed(message_id, error="transient", retry_at=self.clock.now + delay)
        self.row(message_id).ready_at = self.clock.now + delay
        self.leased.discard(message_id)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def quarantine(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.leased)))
        self.store.failed(message_id, error="permanent", retry_at=None)
        self.rows = [r for r in self.rows if r.message_id != message_id]
        self.quarantined.add(message_id)
        self.leased.discard(message_id)

    @rule(seconds=st.sampled_from([0.5, 3.0, 40.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = SqliteOutbox(self.dir / "o.db", clock=self.clock)
        for row in self.rows:  # the file is ours alone: old leases died with the process
            row.ready_at = 0.0
        self.leased.clear()

    @rule(outcomes=st.lists(st.sampled_from(["ok", "ok", "ok", "transient", "permanent"])))
    def forwarder_round(self, outcomes: list[str]) -> None:
        self.transport.outcomes = list(outcomes)
        self.transport.attempted.clear()
        accepted_before = len(self.transport.accepted)
        forwarder = Forwarder(
            self.store,
            self.transport,
            batch=6,
            clock=self.clock,
            policy=RetryPolicy(initial=1.0, maximum=4.0),
        )
        before = {r.message_id for r in self.rows}
        forwarder.step()
        # At most one message of a key was attempted before its predecessor succeeded.
        per_key: dict[bytes, list[tuple[str, str]]] = {}
        for env, outcome in self.transport.attempted:
            if env.key is not None:
                per_key.setdefault(env.key, []).append((env.message_id, outcome))
        for attempts in per_key.values():
            assert all(o != "transient" for _, o in attempts[:-1])
        accepted = {e.message_id for e in self.transport.accepted[accepted_before:]}
        poisoned = {e.message_id for e, o in self.transport.attempted if o == "permanent"}
        self.delivered |= accepted
        self.quarantined |= poisoned
        self.resync()
        after = {r.message_id for r in self.rows}
        assert before - after == accepted | poisoned
        assert after <= before
        self.leased -= accepted | poisoned

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def nothing_lost(self) -> None:
        waiting = {r.message_id for r in self.rows}
        assert waiting | self.delivered | self.quarantined == set(self.order)
        assert not waiting & self.delivered and not waiting & self.quarantined
        assert self.store.pending() == len(self.rows)
        stats = self.store.stats()
        assert stats.quarantined == len(self.quarantined)
        # The in-memory counts after removals match what the file holds.
        assert stats.bytes == sum(e.envelope.size for e in self.store.list(limit=100_000))
        for key in (b"a", b"b", b"c"):
            assert self.store.has_key(key) == any(r.key == key for r in self.rows)

    @invariant()
    def forwarded_in_key_order(self) -> None:
        last: dict[bytes, int] = {}
        for env in self.transport.accepted:
            if env.key is None:
                continue
            position = self.order[env.message_id]
            assert position > last.get(env.key, -1), "a key's messages overtook each other"
            last[env.key] = position


OutboxMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOutboxStateMachine = OutboxMachine.TestCase
