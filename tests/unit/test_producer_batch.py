"""Producer.send_batch: the same promise as send(), message by message.

Each test counts: every id of the batch ends confirmed (at the broker), stored (in the
outbox, then at the broker after a drain) or failed (named in BatchFailed.errors), and
no id is in two of those or in none.
"""

from __future__ import annotations

import pickle
import uuid
from concurrent.futures import Future
from pathlib import Path

import pytest

from msgsafe import Producer, RetryPolicy, Status
from msgsafe.errors import BatchFailed, ClosedError, InvalidMessage, OutboxFull, Refused, Rejected
from msgsafe.message import Batch, BatchReceipt, new_message_id, new_message_ids
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker

FAST = RetryPolicy(initial=0.01, maximum=0.05)


def producer(broker: MemoryBroker, path: Path | None, **options: object) -> Producer:
    outbox: Path | bool = path if path is not None else False
    return Producer(f"memory://{broker.name}", outbox=outbox, retry=FAST, **options)


def test_a_batch_is_confirmed_in_order_with_its_ids(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    bodies = [f"m{i}".encode() for i in range(500)]
    with producer(memory_broker, tmp_path / "o.db") as p:
        receipt = p.send_batch("q", bodies, keys=[f"k{i % 7}" for i in range(500)])
    assert isinstance(receipt, BatchReceipt)
    assert len(receipt) == 500 and receipt.confirmed == 500 and receipt.stored == 0
    assert list(receipt.message_ids) == memory_broker.ids("q")
    assert [m.body for m in memory_broker.messages("q")] == bodies
    assert {r.status for r in receipt.receipts()} == {Status.CONFIRMED}


def test_given_ids_are_kept(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    ids = [f"order-{i}" for i in range(10)]
    with producer(memory_broker, tmp_path / "o.db") as p:
        receipt = p.send_batch("q", [b"x"] * 10, message_ids=ids)
    assert list(receipt.message_ids) == ids == memory_broker.ids("q")


def test_a_refused_batch_is_stored_then_delivered_exactly(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.refuse_writes()
        receipt = p.send_batch("q", [f"m{i}".encode() for i in range(300)])
        assert receipt.stored + receipt.confirmed == 300
        assert receipt.stored == 300
        assert {r.status for r in receipt.receipts()} == {Status.STORED}
        memory_broker.accept_writes()
        assert p.drain(timeout=10) == 0
    assert sorted(memory_broker.ids("q")) == sorted(receipt.message_ids)


def test_messages_of_a_key_in_the_outbox_queue_behind_it(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.refuse_writes()
        first = p.send("q", b"a0", key="a")
        assert first.status is Status.STORED
        memory_broker.accept_writes()
        # Past the refusal pause, so only the key barrier holds messages back.
        p._settle.resume()
        receipt = p.send_batch("q", [b"a1", b"b1", b"a2", b"b2"], keys=["a", "b", "a", "b"])
        ids = list(receipt.message_ids)
        assert receipt.status(ids[0]) is Status.STORED
        assert receipt.status(ids[2]) is Status.STORED
        assert receipt.status(ids[1]) is Status.CONFIRMED
        assert receipt.status(ids[3]) is Status.CONFIRMED
        assert p.drain(timeout=10) == 0
    bodies_a = [m.body for m in memory_broker.messages("q") if m.key == b"a"]
    assert bodies_a == [b"a0", b"a1", b"a2"]


def test_invalid_input_raises_before_anything_is_sent(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        with pytest.raises(InvalidMessage, match="message 2"):
            p.send_batch("q", [b"a", b"b", "c", b"d"])  # type: ignore[list-item]
        with pytest.raises(InvalidMessage, match="one key per body"):
            p.send_batch("q", [b"a", b"b"], keys=["k"])
        with pytest.raises(InvalidMessage, match="single body"):
            p.send_batch("q", b"ab")
        with pytest.raises(InvalidMessage, match="one id per body"):
            p.send_batch("q", [b"a"], message_ids=["1", "2"])
        with pytest.raises(InvalidMessage, match="key must be"):
            p.send_batch("q", [b"a"], keys=[1])  # type: ignore[list-item]
    assert memory_broker.count("q") == 0


def test_permanent_failures_are_named_and_the_rest_is_safe(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.reject_next(2)
        with pytest.raises(BatchFailed) as caught:
            p.send_batch("q", [f"m{i}".encode() for i in range(20)])
        assert p.pending() == 0
    failed = caught.value
    assert len(failed.errors) == 2
    assert all(isinstance(e, Rejected) for e in failed.errors.values())
    assert all(mid == e.message_id for mid, e in failed.errors.items())
    safe = failed.receipt
    assert isinstance(safe, BatchReceipt) and safe.confirmed == 18
    delivered = set(memory_broker.ids("q"))
    assert delivered == set(safe.message_ids)
    assert not delivered & set(failed.errors)
    clone = pickle.loads(pickle.dumps(failed))
    assert set(clone.errors) == set(failed.errors) and clone.receipt == safe


def test_without_an_outbox_refused_messages_fail_typed(memory_broker: MemoryBroker) -> None:
    with producer(memory_broker, None) as p:
        memory_broker.refuse_writes()
        with pytest.raises(BatchFailed) as caught:
            p.send_batch("q", [b"x"] * 5)
    assert len(caught.value.errors) == 5
    assert all(isinstance(e, Refused) for e in caught.value.errors.values())
    assert memory_broker.count("q") == 0


def test_after_a_refusal_new_sends_go_to_the_outbox_without_trying_the_broker(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    # NOTE: forward=False: a forwarder's answered round ends the pause (see
    # Forwarder(on_answered=...)); here drain() alone forwards, after the pause.
    with producer(memory_broker, tmp_path / "o.db", forward=False) as p:
        memory_broker.refuse_writes()
        assert p.send("q", b"probe").status is Status.STORED
        memory_broker.accept_writes()
        # The broker answers again, but the producer is inside its refusal pause: these
        # are stored without a publish (the forwarder brings them over).
        p._settle.pause(float("inf"))
        assert p.send("q", b"x").status is Status.STORED
        assert p.send_batch("q", [b"y", b"z"]).stored == 2
        p._settle.resume()
        assert p.drain(timeout=10) == 0
        assert p.send("q", b"after").status is Status.CONFIRMED
    assert sorted(m.body for m in memory_broker.messages("q")) == [
        b"after",
        b"probe",
        b"x",
        b"y",
        b"z",
    ]


def test_flush_waits_for_batches_and_close_refuses_new_ones(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    p = producer(memory_broker, tmp_path / "o.db")
    memory_broker.delay_confirms(0.2)
    future = p.send_batch_async("q", [b"x"] * 50)
    assert p.flush(10)
    assert future.done() and future.result().confirmed == 50
    assert not future.cancel()
    p.close()
    with pytest.raises(ClosedError):
        p.send_batch("q", [b"x"])


def test_an_empty_batch_is_an_empty_receipt(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        receipt = p.send_batch("q", [])
    assert len(receipt) == 0 and receipt.destination == "q"


def test_bulk_ids_are_uuid7_unique_and_ordered_with_single_ids() -> None:
    before = new_message_id()
    bulk = new_message_ids(5000)
    after = new_message_id()
    assert len(set(bulk)) == 5000
    assert [before, *bulk, after] == sorted([before, *bulk, after])
    for text in (bulk[0], bulk[-1]):
        parsed = uuid.UUID(text)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert new_message_ids(0) == []


def test_batch_select_and_envelope_keep_each_message() -> None:
    batch = Batch.build("q", [b"a", b"b", b"c"], keys=["x", None, b"z"], headers={"h": "1"})
    part = batch.select([2, 0])
    assert list(part.bodies) == [b"c", b"a"]
    assert list(part.message_ids) == [batch.message_ids[2], batch.message_ids[0]]
    env = batch.envelope(0)
    assert (env.body, env.key, dict(env.headers)) == (b"a", b"x", {"h": "1"})
    assert env.message_id == batch.message_ids[0]


def test_a_batch_sent_in_the_refusal_pause_is_stored_whole_with_its_columns(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """In the refusal pause a batch reaches the store as one put of its columns (no
    transport attempt): each row is what the message's own envelope would have stored,
    and every id arrives once after the drain."""
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.refuse_writes()
        assert p.send("q", b"probe").status is Status.STORED
        p._settle.pause(float("inf"))
        store = p.outbox
        assert isinstance(store, SqliteOutbox)
        puts: list[int] = []
        whole = store.put_batch_async

        def counted(batch: Batch) -> Future[None]:
            puts.append(len(batch))
            return whole(batch)

        p._put_batch_async = counted
        bodies = [b"m%d" % i for i in range(250)]
        keys = [None if i % 3 == 0 else f"k{i % 7}" for i in range(250)]
        receipt = p.send_batch("q", bodies, keys=keys, headers={"h": "1"})
        assert puts == [250]
        assert receipt.stored == 250
        waiting = {entry.envelope.message_id: entry.envelope for entry in store.list(limit=1000)}
        assert len(waiting) == 251 and set(receipt.message_ids) <= set(waiting)
        for i, message_id in enumerate(receipt.message_ids):
            env = waiting[message_id]
            key = None if keys[i] is None else str(keys[i]).encode()
            assert (env.body, env.key, dict(env.headers)) == (bodies[i], key, {"h": "1"})
        memory_broker.accept_writes()
        p._settle.resume()
        assert p.drain(timeout=10) == 0
    delivered = memory_broker.ids("q")
    print(f"sent=251 stored=251 delivered={len(delivered)} unique={len(set(delivered))}")
    assert len(delivered) == 251 and set(delivered) == set(waiting)


def test_a_batch_the_store_refuses_in_the_pause_fails_whole_and_frees_its_keys(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """A whole-batch put at the outbox's row bound: every id is named in BatchFailed
    (the caller owns them), nothing is stored, and a later send of a key of that batch
    is not held back by it."""
    store = SqliteOutbox(tmp_path / "o.db", max_rows=10)
    with Producer(f"memory://{memory_broker.name}", outbox=store, retry=FAST) as p:
        memory_broker.refuse_writes()
        assert p.send("q", b"probe", key="k").status is Status.STORED
        p._settle.pause(float("inf"))
        with pytest.raises(BatchFailed) as caught:
            p.send_batch("q", [b"x"] * 20, keys=["j"] * 20)
        failed = caught.value
        assert len(failed.errors) == 20
        assert all(isinstance(e, OutboxFull) for e in failed.errors.values())
        assert p._settle.detouring_keys() == frozenset()
        assert p.pending() == 1
        assert p.send("q", b"after", key="j").status is Status.STORED
        memory_broker.accept_writes()
        p._settle.resume()
        assert p.drain(timeout=10) == 0
    assert sorted(m.body for m in memory_broker.messages("q")) == [b"after", b"probe"]


def test_batch_receipt_repr_is_short_however_big_the_batch() -> None:
    import dataclasses

    from msgsafe.message import Guarantee

    ids = [f"id-{i}" for i in range(100_000)]
    receipt = BatchReceipt("orders", ids, frozenset(ids[5:9]), Guarantee.REPLICATED)
    assert repr(receipt) == (
        "BatchReceipt(destination='orders', len=100000, confirmed=99996, stored=4, "
        "guarantee=Guarantee.REPLICATED, message_ids=['id-0', 'id-1', 'id-2', ...])"
    )
    assert repr(BatchReceipt("q", ["a", "b"])) == (
        "BatchReceipt(destination='q', len=2, confirmed=2, stored=0, "
        "guarantee=Guarantee.UNKNOWN, message_ids=['a', 'b'])"
    )
    # Otherwise the same dataclass: frozen, slotted, the same fields.
    assert [f.name for f in dataclasses.fields(BatchReceipt)] == [
        "destination",
        "message_ids",
        "stored_ids",
        "guarantee",
        "store_guarantee",
    ]
    assert BatchReceipt.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert not hasattr(receipt, "__dict__")


def test_a_replayed_batch_whose_route_fails_still_resolves(
    memory_broker: MemoryBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch a fast path parked is replayed on the fast path's thread, where no caller can be
    raised to: when its route fails before anything of it was routed, every message is
    failed (the outbox taking what it can), and its future resolves."""
    from msgsafe._receipts import BatchSend

    with producer(memory_broker, tmp_path / "o.db") as p:
        batch = Batch.build("q", [b"a", b"b"], keys=["k", "k"])
        send = BatchSend(p._settle, batch)

        def broken(item: BatchSend, *, replayed: bool = False) -> bool:
            raise RuntimeError("route failed")

        monkeypatch.setattr(p, "_route_batch", broken)
        p._replay(send)
        with pytest.raises(BatchFailed) as caught:
            send.result(5)
    assert set(caught.value.errors) == set(batch.message_ids)
    assert memory_broker.count("q") == 0
