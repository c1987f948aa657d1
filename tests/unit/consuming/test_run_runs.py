"""Consumer.run hands a worker runs of a key's deliveries (up to 16 at once, no pool lock
between them): per-key order holds across runs, a failure inside a run is retried alone,
each delivery is acknowledged only after its handler returned, and a stop in the middle
of a run gives back exactly what was not settled."""

from __future__ import annotations

import sqlite3
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from msgsafe import Consumer, Delivery, Outcome, RetryPolicy
from msgsafe.testing import MemoryBroker
from tests.support.clock import LeapingClock
from tests.support.waiting import wait_until
from tests.unit.consuming.test_run import leftover, run_until, send, url


def test_each_key_keeps_its_order_over_many_runs(memory_broker: MemoryBroker) -> None:
    # 5 keys of 60 each, interleaved: every key spans several runs of 16.
    items: list[tuple[str | None, bytes]] = [(f"k{i % 5}", b"%d" % i) for i in range(300)]
    ids = send(memory_broker, items)
    expected: dict[str, list[str]] = defaultdict(list)
    for (key, _), message_id in zip(items, ids, strict=True):
        expected[str(key)].append(message_id)
    lock = threading.Lock()
    seen: dict[str, list[str]] = defaultdict(list)
    busy: set[str] = set()
    overlaps: list[str] = []

    def handler(d: Delivery) -> None:
        key = (d.key or b"").decode()
        with lock:
            if key in busy:
                overlaps.append(key)
            busy.add(key)
            seen[key].append(str(d.message_id))
        with lock:
            busy.discard(key)

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(consumer, handler, lambda: consumer.stats().acked == len(ids), concurrency=4)
    assert overlaps == []
    assert dict(seen) == dict(expected)
    assert consumer.stats().handled == len(ids) and leftover(memory_broker) == []


def test_a_failure_inside_a_run_is_retried_alone(memory_broker: MemoryBroker) -> None:
    ids = send(memory_broker, [("a", b"%d" % i) for i in range(40)])
    calls: list[tuple[bytes, int]] = []

    def handler(d: Delivery) -> None:
        calls.append((d.body, d.attempt))
        if d.body == b"20" and d.attempt == 1:
            raise RuntimeError("once")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().acked == len(ids),
        retry=RetryPolicy(initial=0.5, max_attempts=3, jitter=False),
        on_exhausted="reject",
        clock=LeapingClock(),
    )
    assert calls == [
        *((b"%d" % i, 1) for i in range(21)),
        (b"20", 2),
        *((b"%d" % i, 1) for i in range(21, 40)),
    ]
    stats = consumer.stats()
    assert (stats.handled, stats.retried, stats.requeued, stats.rejected) == (40, 1, 0, 0)
    assert leftover(memory_broker) == []


def test_no_delivery_of_a_run_is_acked_before_its_handler_returned(
    memory_broker: MemoryBroker,
) -> None:
    send(memory_broker, [("a", b"%d" % i) for i in range(40)])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    handed: list[Delivery] = []
    at_start: list[tuple[Outcome | None, int]] = []

    def handler(d: Delivery) -> None:
        if not handed:  # the whole key fetched first: later ones are in this run
            wait_until(lambda: consumer.stats().received == 40, 10, "the key fetched")
        # This one unsettled; how many of those handed before it are acknowledged.
        at_start.append((d.settled, sum(e.settled is Outcome.ACCEPT for e in handed)))
        handed.append(d)

    run_until(consumer, handler, lambda: consumer.stats().acked == 40)
    assert [settled for settled, _ in at_start] == [None] * 40
    # A run's deliveries (up to 16) are acknowledged together after it: by the last
    # delivery's start, those of every earlier run.
    acked_before = [count for _, count in at_start]
    assert acked_before == sorted(acked_before) and acked_before[-1] >= 24
    assert all(d.settled is Outcome.ACCEPT for d in handed)


def test_a_failure_inside_a_run_gives_back_it_and_the_rest_only(
    memory_broker: MemoryBroker,
) -> None:
    ids = send(memory_broker, [("a", b"%d" % i) for i in range(12)])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    seen: list[bytes] = []

    def handler(d: Delivery) -> None:
        if not seen:
            wait_until(lambda: consumer.stats().received == 12, 10, "the key fetched")
        seen.append(d.body)
        if d.body == b"5":
            consumer.stop()
            raise RuntimeError("fails, no retry")

    consumer.run(handler, prefetch=20)
    stats = consumer.stats()
    # 0..4 acknowledged, 5 given back counted (its handler ran), 6..11 released.
    assert seen == [b"%d" % i for i in range(6)]
    # (What the last fetch brought back meanwhile is released too.)
    assert (stats.acked, stats.requeued) == (5, 1)
    assert stats.released == stats.received - 6 >= 6
    assert sorted(str(d.message_id) for d in leftover(memory_broker)) == sorted(ids[5:])


def test_a_stop_timeout_inside_a_run_gives_back_only_what_was_not_settled(
    memory_broker: MemoryBroker,
) -> None:
    ids = send(memory_broker, [("a", b"%d" % i) for i in range(12)])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    release = threading.Event()
    seen: list[bytes] = []

    def handler(d: Delivery) -> None:
        if not seen:
            wait_until(lambda: consumer.stats().received == 12, 10, "the key fetched")
        seen.append(d.body)
        if d.body == b"4":
            consumer.stop()
            release.wait(10)

    consumer.run(handler, prefetch=20, stop_timeout=0.2)
    stats = consumer.stats()
    # 0..3 settled in this run and not taken off the lane yet: not given back; 4 was
    # still running (given back counted), 5..11 never started (released).
    assert (stats.acked, stats.requeued, stats.released) == (4, 1, 7)
    assert sorted(str(d.message_id) for d in leftover(memory_broker)) == sorted(ids[4:])
    release.set()
    wait_until(lambda: consumer.stats().in_flight == 0, 10, "the late handler to return")
    assert consumer.stats().acked == 4
    assert seen == [b"%d" % i for i in range(5)]


def test_with_an_inbox_no_delivery_of_a_run_is_acked_before_its_commit(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (message_id TEXT NOT NULL)")
    send(memory_broker, [("a", b"%d" % i) for i in range(40)])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    handed: list[Delivery] = []
    acked_uncommitted: list[str] = []
    failed_once: list[str] = []

    def handler(d: Delivery, tx: Any) -> None:
        if not handed:
            wait_until(lambda: consumer.stats().received == 40, 10, "the key fetched")
        with sqlite3.connect(db) as look:  # what is committed, seen from outside
            committed = {row[0] for row in look.execute("SELECT message_id FROM effects")}
        acked_uncommitted.extend(
            str(e.message_id)
            for e in handed
            if e.settled is Outcome.ACCEPT and e.message_id not in committed
        )
        if d.body == b"20" and not failed_once:
            failed_once.append(str(d.message_id))
            raise RuntimeError("once")
        tx.execute("INSERT INTO effects VALUES (?)", (d.message_id,))
        if d not in handed:
            handed.append(d)

    run_until(
        consumer,
        handler,
        lambda: consumer.stats().acked == 40,
        inbox=f"sqlite:///{db}",
        retry=RetryPolicy(initial=0.5, max_attempts=3, jitter=False),
        on_exhausted="reject",
        clock=LeapingClock(),
    )
    assert acked_uncommitted == []
    assert [d.body for d in handed] == [b"%d" % i for i in range(40)]
    assert all(d.settled is Outcome.ACCEPT for d in handed)
    stats = consumer.stats()
    assert (stats.handled, stats.retried, stats.skipped) == (40, 1, 0)
    with sqlite3.connect(db) as look:
        assert look.execute("SELECT count(*) FROM effects").fetchone() == (40,)
