"""The producer's fast path on Kafka (msgsafe/adapters/kafka/fast.py): single sends
straight into librdkafka while healthy, leaving for the safe way at the first failure
with nothing lost and each key's order kept, back once the outbox is empty.

Why the mock: each story needs a broker error on demand, for exactly as long as the test
says, which no real broker can be told to give; the fast path under real broker kills is in
tests/integration/kafka/test_broker_kill.py and test_all_down.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

import msgsafe
from msgsafe.adapters.kafka.fast import FastSend, KafkaFastSender
from msgsafe.errors import OutboxFull, TransientError
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from tests.support.kafka_ledger import consume_until
from tests.support.kafka_mock import MockKafkaCluster
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until

TOPIC = "fast"
KEYS = 8


def _fast(producer: msgsafe.Producer) -> KafkaFastSender:
    fast = producer._fast
    assert isinstance(fast, KafkaFastSender), "the Kafka transport declares a fast path"
    return fast


def _send(
    producer: msgsafe.Producer, ledger: Ledger, count: int, *, start: int = 0
) -> list[Future[msgsafe.Receipt]]:
    """``count`` keyed sends with ids of the ledger's, positions in key order."""
    futures = []
    for i in range(start, start + count):
        message_id = msgsafe.new_message_id()
        key = f"k{i % KEYS}"
        with ledger.lock:
            ledger.sent.add(message_id)
            ledger.positions[message_id] = (key, i // KEYS)
        futures.append(producer.send_async(TOPIC, b"%d" % i, key=key, message_id=message_id))
    return futures


def _settle(ledger: Ledger, futures: list[Future[msgsafe.Receipt]]) -> None:
    for future in futures:
        receipt = future.result(60)
        ledger.add_receipt(receipt.message_id, receipt.status)


def _check_arrivals(url: str, ledger: Ledger, name: str) -> None:
    """Read the topic: every receipted id arrived, no unknown one, each key in order."""
    order: list[str] = []
    received = consume_until(
        url,
        TOPIC,
        ledger.receipted,
        deadline_s=60,
        on_delivery=lambda d: order.append(d.message_id or ""),
    )
    ledger.received.update(received)
    print(f"\n{ledger.report(name)}")
    assert not ledger.lost and not ledger.unknown
    assert ledger.order_violations(order) == []


def test_healthy_single_sends_take_the_lane_confirmed_in_key_order(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(kafka_mock.url, outbox=tmp_path / "o.db", confirm_timeout=10) as p:
        futures = _send(p, ledger, 2000)
        # The common case, which takes the producer's inline path: no id, bytes key.
        plain = [p.send_async(TOPIC, b"plain", key=b"k0") for _ in range(200)]
        assert p.flush(30)
        _settle(ledger, futures)
        for j, future in enumerate(plain):
            receipt = future.result(0)
            ledger.add_sent(receipt.message_id)
            ledger.positions[receipt.message_id] = ("k0", 2000 // KEYS + j)
            ledger.add_receipt(receipt.message_id, receipt.status)
        assert ledger.statuses["confirmed"] == 2200
        fast = _fast(p)
        assert not fast.resting and fast.leaves == 0
        assert fast.sent == 2200, "every single send went through the fast path"
        stats = p.stats()
        assert (stats.sent, stats.confirmed, stats.in_flight) == (2200, 2200, 0)
    _check_arrivals(kafka_mock.url, ledger, "fast path healthy")


def test_the_lanes_sends_are_futures_sharing_one_lock_making_receipts_when_asked(
    kafka_mock: MockKafkaCluster,
) -> None:
    """A FastSend holds no lock or receipt of its own (one object per message in
    flight for the cyclic GC): the fast path's one re-entrant lock serves concurrent.futures'
    wait and as_completed over many of them, a thread blocked in result(), a callback
    and asyncio; each result() makes an equal receipt."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    with msgsafe.Producer(kafka_mock.url, outbox=False, linger_ms=1000) as p:
        assert p.send(TOPIC, b"warm").status is msgsafe.Status.CONFIRMED
        futures: list[FastSend] = []
        for i in range(50):
            future = p.send_async(TOPIC, b"%d" % i, key=b"k%d" % (i % 3))
            assert isinstance(future, FastSend), "the fast path took it"
            futures.append(future)
        assert len({id(f._mutex) for f in futures}) == 1
        assert not any(f.done() for f in futures), "lingering in librdkafka"
        woken: list[msgsafe.Receipt] = []
        blocked = threading.Thread(target=lambda: woken.append(futures[-1].result(30)))
        blocked.start()
        called: list[msgsafe.Receipt] = []
        futures[0].add_done_callback(lambda f: called.append(f.result()))

        async def awaited() -> msgsafe.Receipt:
            return await asyncio.wrap_future(futures[1])

        done, not_done = concurrent.futures.wait(futures, timeout=30)
        assert len(done) == 50 and not not_done
        assert set(concurrent.futures.as_completed(futures, timeout=5)) == set(futures)
        blocked.join(30)
        assert woken == [futures[-1].result()]
        assert called == [futures[0].result()]
        assert asyncio.run(awaited()) == futures[1].result()
        for future in futures:
            receipt = future.result(0)
            assert receipt.status is msgsafe.Status.CONFIRMED and receipt.destination == TOPIC
            assert receipt == future.result(0) and receipt.message_id == future.message_id
            assert future.exception(0) is None and "returned Receipt" in repr(future)
            assert not any(isinstance(o, msgsafe.Receipt) for o in gc.get_referents(future))


def test_a_failure_leaves_the_lane_stores_in_send_order_and_it_comes_back(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """NOT_ENOUGH_REPLICAS on every produce: the fast path leaves, what it held and what was
    sent meanwhile is stored (the failed in send order, the parked behind them), then
    delivered in each key's order once healed; single sends take the fast path again once
    the outbox is empty."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(
        kafka_mock.url, outbox=tmp_path / "o.db", send_timeout=30, confirm_timeout=3
    ) as p:
        _settle(ledger, _send(p, ledger, 200))
        fast = _fast(p)
        assert not fast.resting

        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        during = _send(p, ledger, 800, start=200)
        _settle(ledger, during)
        assert fast.leaves >= 1 and (fast.resting and not fast.switching)
        assert ledger.statuses["stored"] > 0
        assert p.pending() == ledger.statuses["stored"]

        kafka_mock.heal_produce()
        assert p.drain(60) == 0
        # Back on the fast path: the settlement reopens it at a send once nothing is unsettled
        # and the outbox is empty (asked at most once a second).
        after: list[Future[msgsafe.Receipt]] = []

        def reopened() -> bool:
            after.extend(_send(p, ledger, KEYS, start=1000 + len(after)))
            return not fast.resting

        wait_until(reopened, 15, "the fast path to take sends again", interval=0.1)
        after += _send(p, ledger, 400, start=1000 + len(after))
        _settle(ledger, after)
    _check_arrivals(kafka_mock.url, ledger, f"fast path leaves and returns, leaves={fast.leaves}")


def test_a_keyed_batch_makes_the_lane_leave_unpurged_in_order(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """A keyed batch goes the safe way: the fast path leaves without a purge (what it holds is
    confirmed, nothing stored), the batch waits for that, and every key keeps its order
    across single sends, the batch and the sends after it."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    with msgsafe.Producer(kafka_mock.url, outbox=tmp_path / "o.db", confirm_timeout=10) as p:
        first = _send(p, ledger, 400)
        ids = [msgsafe.new_message_id() for _ in range(400)]
        keys = [f"k{i % KEYS}" for i in range(400, 800)]
        with ledger.lock:
            ledger.sent.update(ids)
            for i, message_id in enumerate(ids, start=400):
                ledger.positions[message_id] = (f"k{i % KEYS}", i // KEYS)
        batch = p.send_batch_async(TOPIC, [b"b"] * 400, keys=keys, message_ids=ids)
        last = _send(p, ledger, 400, start=800)
        _settle(ledger, first)
        receipt = batch.result(60)
        assert (receipt.confirmed, receipt.stored) == (400, 0)
        for message_id in receipt.message_ids:
            ledger.add_receipt(message_id)
        _settle(ledger, last)
        fast = _fast(p)
        assert fast.leaves == 1 and (fast.resting and not fast.switching)
        assert ledger.statuses["stored"] == 0, "a leave without a failure stores nothing"
    _check_arrivals(kafka_mock.url, ledger, "fast path leaves for a keyed batch")


def test_a_key_with_rows_in_the_outbox_queues_behind_them(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """Rows another process stored for a key (an outbox shared, a crashed run): a send of
    that key is stored behind them, not sent past them; other keys are confirmed."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    path = tmp_path / "o.db"
    earlier = Envelope.build(TOPIC, b"earlier", key="k1")
    store = SqliteOutbox(path)
    store.put([earlier])
    store.close()
    with msgsafe.Producer(kafka_mock.url, outbox=path, forward=False, confirm_timeout=10) as p:
        assert p.send(TOPIC, b"other", key="k2").status is msgsafe.Status.CONFIRMED
        held = p.send(TOPIC, b"later", key="k1")
        assert held.status is msgsafe.Status.STORED
        assert _fast(p).leaves == 1
        assert p.drain(30) == 0
    received = consume_until(
        kafka_mock.url, TOPIC, {earlier.message_id, held.message_id}, deadline_s=30
    )
    assert set(received) >= {earlier.message_id, held.message_id}


def test_closing_with_sends_unanswered_stores_them(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """Every broker down, sends in the fast path, close with a short timeout: each send is
    stored (none lost, none failed) and the next producer finds them in the outbox."""
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    ledger = Ledger()
    path = tmp_path / "o.db"
    p = msgsafe.Producer(kafka_mock.url, outbox=path, send_timeout=30, confirm_timeout=20)
    _settle(ledger, _send(p, ledger, 50))
    for broker in (1, 2, 3):
        kafka_mock.broker_down(broker)
    futures = _send(p, ledger, 300, start=50)
    p.close(timeout=0.5)
    _settle(ledger, futures)
    assert ledger.statuses["stored"] + ledger.statuses["confirmed"] == 350
    assert ledger.statuses["stored"] == 300, "sent with every broker down: all stored"
    # The fast path's own STORED receipts rate the outbox too (a file on this disk).
    answered = [f.result(0) for f in futures]
    assert {(r.status, r.store_guarantee) for r in answered} == {
        (msgsafe.Status.STORED, msgsafe.Guarantee.DURABLE)
    }
    store = SqliteOutbox(path)
    try:
        assert store.stats().depth == ledger.statuses["stored"]
    finally:
        store.close()


def test_what_a_full_outbox_refuses_from_the_fast_path_may_be_at_the_broker(
    kafka_mock: MockKafkaCluster, tmp_path: Path
) -> None:
    """Sends the fast path handed to librdkafka fail, and the outbox, at its bound,
    refuses them: each OutboxFull says the broker may hold the message, since librdkafka
    retries on its own and never says whether an earlier attempt was written
    (``msgsafe nemesis kafka`` seed 659090302 received one such message a second after
    its send had failed saying it was not stored)."""
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    store = SqliteOutbox(tmp_path / "o.db", max_rows=1)
    with msgsafe.Producer(kafka_mock.url, outbox=store, send_timeout=30, confirm_timeout=3) as p:
        _fast(p)
        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        futures = [p.send_async(TOPIC, b"%d" % i, key="k") for i in range(20)]
        fast = [f for f in futures if isinstance(f, FastSend)]
        errors = [f.exception(60) for f in fast]
        kafka_mock.heal_produce()
    refused = [e for e in errors if isinstance(e, OutboxFull)]
    assert refused, f"the full outbox refused none of the fast path's sends: {errors}"
    assert all(e.maybe_delivered for e in refused)


def test_without_an_outbox_a_failure_fails_the_send_and_the_lane_stays(
    kafka_mock: MockKafkaCluster,
) -> None:
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    with msgsafe.Producer(kafka_mock.url, outbox=False, confirm_timeout=2) as p:
        assert p.send(TOPIC, b"warm", key="k").status is msgsafe.Status.CONFIRMED
        kafka_mock.fail_produce(KafkaError.NOT_ENOUGH_REPLICAS)
        future = p.send_async(TOPIC, b"refused", key="k")
        error = future.exception(10)
        assert isinstance(error, TransientError), error
        assert error.message_id
        kafka_mock.heal_produce()
        assert p.send(TOPIC, b"again", key="k").status is msgsafe.Status.CONFIRMED
        fast = _fast(p)
        assert fast.leaves == 0 and not fast.resting


def test_the_lane_refuses_what_the_safe_way_refuses(kafka_mock: MockKafkaCluster) -> None:
    """Too large, closed: the same typed errors as the safe way, before anything is sent."""
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    p = msgsafe.Producer(kafka_mock.url, outbox=False, max_message_size=1000)
    assert p.send(TOPIC, b"ok").status is msgsafe.Status.CONFIRMED
    with pytest.raises(msgsafe.errors.MessageTooLarge):
        p.send(TOPIC, b"x" * 2000)
    with pytest.raises(msgsafe.errors.MessageTooLarge):
        p.send_async(TOPIC, b"x" * 990, headers={"h": "y" * 20}).result(5)
    p.close()
    with pytest.raises(msgsafe.errors.ClosedError):
        p.send_async(TOPIC, b"late")
