"""What every adapter promises, checked the same way for each (see msgsafe/ports.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from msgsafe import Consumer, Delivery, Producer, Status
from msgsafe.errors import ClosedError, MessageTooLarge
from tests.contract.conftest import BrokerCase


def _consumer(case: BrokerCase, destination: str) -> Consumer:
    group = f"g-{uuid.uuid4().hex[:8]}" if case.needs_group else None
    return Consumer(case.url, group=group, **case.consumer_options).subscribe(destination)


def _collect(consumer: Consumer, n: int, patience: float, *, ack: bool = False) -> list[Delivery]:
    """Poll until ``n`` deliveries arrived or ``patience`` seconds passed; ``ack`` settles
    each as it comes (brokers stop sending at the prefetch window until acks arrive)."""
    got: list[Delivery] = []
    deadline = time.monotonic() + patience
    while len(got) < n and time.monotonic() < deadline:
        batch = consumer.poll(max_messages=n - len(got), timeout=0.5)
        if ack:
            for d in batch:
                d.ack()
        got += batch
    return got


def test_confirmed_message_round_trips_with_id_key_headers(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        r = p.send(dest, b"\x00body\xff", key="k-1", headers={"trace": "t-1"})
    assert r.status is Status.CONFIRMED
    with _consumer(case, dest) as c:
        [d] = _collect(c, 1, case.patience)
        assert d.body == b"\x00body\xff"
        assert d.message_id == r.message_id
        assert d.key == b"k-1"
        assert d.headers.get("trace") == "t-1"
        d.ack()


def test_pipelined_sends_all_confirmed_and_per_key_order_kept(case: BrokerCase) -> None:
    dest = case.new_destination()
    n = 500
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        futures = [p.send_async(dest, str(i).encode(), key=f"k{i % 5}") for i in range(n)]
        receipts = [f.result(timeout=case.patience) for f in futures]
    assert all(r.status is Status.CONFIRMED for r in receipts)
    with _consumer(case, dest) as c:
        got = _collect(c, n, case.patience * 2, ack=True)
    assert {d.message_id for d in got} == {r.message_id for r in receipts}
    for k in range(5):
        seq = [int(d.body) for d in got if d.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"


def test_unacked_messages_come_back_after_consumer_closes(case: BrokerCase) -> None:
    dest = case.new_destination()
    group = f"g-{uuid.uuid4().hex[:8]}" if case.needs_group else None
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        ids = {p.send(dest, b"x").message_id for _ in range(3)}
    first = Consumer(case.url, group=group, **case.consumer_options).subscribe(dest)
    assert {d.message_id for d in _collect(first, 3, case.patience)} == ids
    first.close()  # nothing acked
    with Consumer(case.url, group=group, **case.consumer_options).subscribe(dest) as second:
        again = _collect(second, 3, case.patience)
        assert {d.message_id for d in again} == ids
        if "redelivered" in case.features:
            assert all(d.redelivered for d in again)
        for d in again:
            d.ack()


def test_nack_requeue_and_reject(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        mid = p.send(dest, b"x").message_id
    with _consumer(case, dest) as c:
        [d] = _collect(c, 1, case.patience)
        d.nack(requeue=True)
        [again] = _collect(c, 1, case.patience)
        assert again.message_id == mid
        again.nack(requeue=False)
        assert c.poll(max_messages=1, timeout=0.5) == []


def test_oversize_is_refused_before_sending(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, max_message_size=1024, **case.producer_options) as p:
        with pytest.raises(MessageTooLarge):
            p.send(dest, b"x" * 1025)
        assert p.send(dest, b"x" * 1024).status is Status.CONFIRMED


def test_closed_producer_raises_closed_error(case: BrokerCase) -> None:
    p = Producer(case.url, outbox=False, **case.producer_options)
    p.close()
    with pytest.raises(ClosedError):
        p.send(case.new_destination(), b"x")
