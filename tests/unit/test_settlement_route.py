"""Settlement owns per-key order: the route of each send is its decision, taken behind
its methods; the producer carries the route out and never touches the counts.

The end-to-end order tests are test_producer_key_order.py, test_producer_outbox.py and
test_producer_batch.py; these pin each route down on its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Status
from msgsafe._receipts import BatchSend, Send
from msgsafe._settlement import Route, Settlement
from msgsafe.errors import ClosedError, ConnectError
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import SqliteOutbox

PRODUCER = Path(__file__).resolve().parents[2] / "msgsafe" / "producer.py"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteOutbox]:
    s = SqliteOutbox(tmp_path / "o.db")
    yield s
    s.close()


def _send(settle: Settlement, key: str | None = None) -> Send:
    return Send(settle, Envelope.build("q", b"x", key=key))


def test_without_a_key_or_a_store_a_send_is_published_uncounted(store: SqliteOutbox) -> None:
    assert Settlement(store).route(_send(Settlement(store))) is Route.PUBLISH
    no_store = Settlement(None)
    assert no_store.route(_send(no_store, "k")) is Route.PUBLISH


def test_a_keyed_send_is_counted_in_the_transport_until_it_leaves(store: SqliteOutbox) -> None:
    """While a send of its key is in the transport, a message of the key bound for the
    outbox is parked; when that send fails too, both reach the store in send order."""
    settle = Settlement(store)
    settle.start(lambda: None)
    try:
        first = _send(settle, "k")
        assert settle.route(first) is Route.PUBLISH_COUNTED
        settle.pause(float("inf"))
        second = _send(settle, "k")
        assert settle.route(second) is Route.HOLD
        assert settle.detouring_keys() == {b"k"}
        settle.hold(second)  # parked behind first, which the transport still has
        settle.published(first, ConnectError("refused"))
        assert settle.wait(10)
        assert [f.result(0).status for f in (first, second)] == [Status.STORED] * 2
    finally:
        settle.stop(10)
    claimed = store.claim(limit=5, lease_s=30)
    assert [e.message_id for e in claimed] == [
        first.envelope.message_id,
        second.envelope.message_id,
    ]
    assert settle.detouring_keys() == frozenset()


def test_a_key_waiting_in_the_store_holds_its_next_send(store: SqliteOutbox) -> None:
    settle = Settlement(store)
    store.put([Envelope.build("q", b"stored", key="k")])
    assert settle.route(_send(settle, "k")) is Route.HOLD
    assert settle.detouring_keys() == {b"k"}
    assert settle.route(_send(settle, "other")) is Route.PUBLISH_COUNTED


def test_the_refusal_pause_holds_every_send_until_resumed(store: SqliteOutbox) -> None:
    settle = Settlement(store)
    settle.pause(float("inf"))
    assert settle.paused()
    assert settle.route(_send(settle)) is Route.HOLD
    settle.resume()
    assert not settle.paused()
    assert settle.route(_send(settle)) is Route.PUBLISH


def test_a_transactional_send_skips_the_barrier_and_the_pause(store: SqliteOutbox) -> None:
    settle = Settlement(store)
    settle.pause(float("inf"))
    store.put([Envelope.build("q", b"stored", key="k")])
    assert settle.route(_send(settle, "k"), transactional=True) is Route.TRANSACTION
    assert settle.detouring_keys() == frozenset()


def test_after_close_a_send_is_refused_and_settled(store: SqliteOutbox) -> None:
    settle = Settlement(store)
    assert settle.close() and not settle.close()
    assert settle.closed
    assert settle.route(_send(settle, "k")) is Route.CLOSED
    batch = BatchSend(settle, Batch.build("q", [b"a"]))
    with pytest.raises(ClosedError):
        settle.route_batch(batch, None)
    assert settle.wait(0)  # both were counted and settled: flush() does not wait


def test_route_batch_holds_the_keys_behind_the_store(store: SqliteOutbox) -> None:
    settle = Settlement(store)
    store.put([Envelope.build("q", b"stored", key="a")])
    send = BatchSend(settle, Batch.build("q", [b"a1", b"b1", b"a2"], keys=["a", "b", "a"]))
    assert settle.route_batch(send, None) == [0, 2]
    assert settle.detouring_keys() == {b"a"}
    unkeyed = BatchSend(settle, Batch.build("q", [b"x", b"y"]))
    assert settle.route_batch(unkeyed, None) == []


def test_the_producer_reads_no_field_of_the_settlement() -> None:
    """Only methods: the counts, the lock, the tickets and the pause are the
    settlement's (a name with an underscore on it, or one of the old public fields)."""
    fields = {"lock", "tickets", "detouring", "in_transport", "refused_until", "store"}
    tree = ast.parse(PRODUCER.read_text(encoding="utf-8"))
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        named = (isinstance(owner, ast.Name) and owner.id == "settle") or (
            isinstance(owner, ast.Attribute) and owner.attr == "_settle"
        )
        if named and (node.attr.startswith("_") or node.attr in fields):
            reads.append(f"line {node.lineno}: .{node.attr}")
    assert not reads, "ask the Settlement through a method instead:\n" + "\n".join(reads)
