"""The producer with its outbox: transient failures end STORED, the outbox drains when
the broker answers, per-key order holds across the detour, bounds raise typed errors."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer, RetryPolicy, Status
from msgsafe.errors import BatchFailed, ConfirmTimeout, InvalidMessage, OutboxFull, Rejected
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker

FAST = RetryPolicy(initial=0.01, maximum=0.05)


def producer(broker: MemoryBroker, path: Path, **options: object) -> Producer:
    return Producer(f"memory://{broker.name}", outbox=path, retry=FAST, **options)


@pytest.mark.parametrize("fault", ["refuse", "down", "drop_before", "drop_after", "late"])
def test_transient_faults_end_stored_then_delivered(
    memory_broker: MemoryBroker, tmp_path: Path, fault: str
) -> None:
    with producer(memory_broker, tmp_path / "o.db", confirm_timeout=0.1) as p:
        {
            "refuse": memory_broker.refuse_writes,
            "down": memory_broker.down,
            "drop_before": lambda: memory_broker.drop_before_confirm(1),
            "drop_after": lambda: memory_broker.drop_after_confirm(1),
            "late": lambda: memory_broker.delay_confirms(1.0),
        }[fault]()
        receipt = p.send("q", b"x")
        assert receipt.status is Status.STORED
        memory_broker.accept_writes()
        memory_broker.up()
        memory_broker.delay_confirms(0)
        assert p.drain(timeout=10) == 0
        assert p.pending() == 0
    assert receipt.message_id in memory_broker.ids("q")


def test_permanent_errors_are_raised_not_stored(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.reject_next(1)
        with pytest.raises(Rejected):
            p.send("q", b"x")
        assert p.pending() == 0


def test_a_tombstone_is_refused_before_anything_is_sent_without_null_bodies(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.down()  # refused before the outbox too: it would only be stored
        with pytest.raises(InvalidMessage, match="tombstone"):
            p.send("q", None, key="k")
        with pytest.raises(InvalidMessage, match="tombstone"):
            p.send_async("q", None)
        assert p.pending() == 0
        assert p.flush(1)
    assert memory_broker.ids("q") == []


def test_outbox_false_raises_transient_errors(memory_broker: MemoryBroker) -> None:
    with Producer(f"memory://{memory_broker.name}", outbox=False, confirm_timeout=0.05) as p:
        memory_broker.delay_confirms(1)
        with pytest.raises(ConfirmTimeout):
            p.send("q", b"x")
        assert p.pending() == 0 and p.drain(0.1) == 0


def test_per_key_order_holds_across_the_outbox_detour(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """Messages of a key sent while an earlier one waits in the outbox queue behind it,
    even after the broker is back; the consumer sees every key in send order."""
    with producer(memory_broker, tmp_path / "o.db") as p:
        sent: dict[str, list[int]] = {"a": [], "b": []}
        statuses = []
        for i in range(300):
            if i == 50:
                memory_broker.refuse_writes()
            if i == 120:
                memory_broker.accept_writes()  # the outbox still holds 50..119: later ones queue
            key = "a" if i % 3 else "b"
            statuses.append(p.send("q", b"%d" % i, key=key).status)
            sent[key].append(i)
        assert statuses[:50] == [Status.CONFIRMED] * 50
        assert Status.STORED in statuses[120:], "later messages must queue behind their key"
        assert p.drain(timeout=20) == 0
    with Consumer(f"memory://{memory_broker.name}", dedup=True) as c:
        c.subscribe("q")
        got = c.poll(max_messages=1000, timeout=1)
    for key, order in sent.items():
        seen = [int(d.body) for d in got if d.key == key.encode()]
        assert seen == order, f"key {key} out of order"


def test_concurrent_senders_during_outage_lose_nothing(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    receipts: list[str] = []
    lock = threading.Lock()
    memory_broker.down()
    with producer(memory_broker, tmp_path / "o.db") as p:

        def worker(n: int) -> None:
            futs = [p.send_async("q", b"w%d-%d" % (n, i)) for i in range(500)]
            mine = [f.result(timeout=30) for f in futs]
            assert all(r.status is Status.STORED for r in mine)
            with lock:
                receipts.extend(r.message_id for r in mine)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert p.pending() == 2000
        memory_broker.up()
        assert p.drain(timeout=30) == 0
    delivered = set(memory_broker.ids("q"))
    lost = set(receipts) - delivered
    print(f"sent=2000 stored={len(receipts)} delivered={len(delivered)} lost={len(lost)}")
    assert not lost


def test_a_new_producer_forwards_what_an_old_one_stored(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    path = tmp_path / "o.db"
    memory_broker.refuse_writes()
    with producer(memory_broker, path) as p:
        ids = [p.send("q", b"x").message_id for _ in range(20)]
    memory_broker.accept_writes()
    with producer(memory_broker, path) as p2:
        assert p2.drain(timeout=10) == 0
    assert set(ids) <= set(memory_broker.ids("q"))


def test_full_outbox_raises_outbox_full(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    store = SqliteOutbox(tmp_path / "o.db", max_rows=5)
    memory_broker.refuse_writes()
    with Producer(f"memory://{memory_broker.name}", outbox=store, retry=FAST) as p:
        for _ in range(5):
            assert p.send("q", b"x").status is Status.STORED
        with pytest.raises(OutboxFull) as info:
            p.send("q", b"x", message_id="sixth")
        assert info.value.message_id == "sixth"
        assert p.pending() == 5


def test_the_outbox_writer_keeps_no_stored_send_alive(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    # A wrapper's report (a done callback) refers to the wrapper, whose finalizer closes
    # the producer: a stored send the writer thread still held kept both alive.
    import gc
    import time
    import weakref

    class Owner:
        pass

    with producer(memory_broker, tmp_path / "o.db") as p:
        memory_broker.down()
        owner = Owner()
        future = p.send_async("q", b"x")
        future.add_done_callback(lambda f, o=owner: None)  # holds owner, as a report does
        assert future.result(10).status is Status.STORED
        dropped = weakref.ref(owner)
        del owner, future
        # The writer may still be running the callbacks it just resolved: poll, bounded.
        deadline = time.monotonic() + 5
        while gc.collect() >= 0 and dropped() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dropped() is None, "a stored send is still referenced while the writer waits"


def test_an_outbox_full_after_an_unanswered_send_says_the_broker_may_have_it(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """A send whose confirm timed out went to a full outbox: OutboxFull, but the broker
    holds the message and delivers it (the nemesis's Qpid seed 100: a message refused
    by a full disk arrived 30 s later, from a paused master). The error says so; one
    that never reached the broker does not."""
    store = SqliteOutbox(tmp_path / "o.db", max_bytes=1)
    memory_broker.delay_confirms(1.0)
    with Producer(
        f"memory://{memory_broker.name}", outbox=store, retry=FAST, confirm_timeout=0.05
    ) as p:
        with pytest.raises(OutboxFull) as unanswered:
            p.send("q", b"sent", message_id="sent")
        assert unanswered.value.maybe_delivered is True
        with pytest.raises(OutboxFull) as held:  # the refusal pause: straight to the outbox
            p.send("q", b"held", message_id="held")
        assert held.value.maybe_delivered is False
    assert pickle.loads(pickle.dumps(unanswered.value)).maybe_delivered is True
    assert "sent" in memory_broker.ids("q") and "held" not in memory_broker.ids("q")


def test_a_batch_refused_by_a_full_outbox_after_unanswered_sends_says_the_broker_may_have_it(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """The same for a batch: its confirms timed out, the full outbox refused what it could
    not hold. Each refused message's OutboxFull says the broker may hold it, and the
    broker does deliver them."""
    store = SqliteOutbox(tmp_path / "o.db", max_bytes=1)
    memory_broker.delay_confirms(1.0)
    ids = ["b0", "b1", "b2"]
    with (
        Producer(
            f"memory://{memory_broker.name}", outbox=store, retry=FAST, confirm_timeout=0.05
        ) as p,
        pytest.raises(BatchFailed) as caught,
    ):
        p.send_batch("q", [b"0", b"1", b"2"], message_ids=ids)
    errors = caught.value.errors
    assert errors, "the full outbox refused nothing: nothing was tested"
    assert sorted([*errors, *caught.value.receipt.message_ids]) == ids
    assert all(isinstance(e, OutboxFull) and e.maybe_delivered for e in errors.values())
    assert set(ids) <= set(memory_broker.ids("q"))
