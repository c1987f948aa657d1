"""Consumer.run on memory://: per-key order under concurrency, retries on an injected
clock, dead letters, on_exhausted, and stopping without losing or acking unhandled."""

from __future__ import annotations

import datetime
import itertools
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Delivery, Outcome, Producer, Receipt, RetryPolicy
from msgsafe.consuming.dead_letter import (
    DLQ_AT,
    DLQ_ATTEMPTS,
    DLQ_ERROR,
    DLQ_ERROR_TYPE,
    DLQ_MESSAGE_ID,
    DLQ_SOURCE,
    ERROR_TEXT_LIMIT,
)
from msgsafe.errors import ConfigurationError, Refused
from msgsafe.testing import MemoryBroker
from tests.support.clock import HandClock, LeapingClock
from tests.support.commands import signalled
from tests.support.waiting import wait_until


def url(b: MemoryBroker) -> str:
    return f"memory://{b.name}"


def send(b: MemoryBroker, items: list[tuple[str | None, bytes]], **headers: str) -> list[str]:
    with Producer(url(b), outbox=False) as p:
        return [p.send("q", body, key=key, headers=headers).message_id for key, body in items]


def run_until(
    consumer: Consumer,
    handler: Callable[[Delivery], object],
    done: Callable[[], object],
    *,
    within: float = 20.0,
    **options: Any,
) -> None:
    """``consumer.run(handler, **options)`` here; stopped from another thread once
    ``done()`` (failing the test when that takes longer than ``within`` seconds)."""
    failures: list[AssertionError] = []

    def watch() -> None:
        try:
            wait_until(done, within, "the run's work", interval=0.01)
        except AssertionError as exc:
            failures.append(exc)
        consumer.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    consumer.run(handler, **options)
    watcher.join()
    assert not failures, failures[0]


def leftover(b: MemoryBroker, destination: str = "q") -> list[Delivery]:
    """What a new consumer finds at ``destination`` (given back, or never settled)."""
    with Consumer(url(b)) as again:
        again.subscribe(destination)
        found: list[Delivery] = []
        while batch := again.poll(0.1, max_messages=100):
            found.extend(batch)
        return found


class DeadLetterSpy(Producer):
    """A producer that records, for each dead letter it sends, whether the original
    delivery (found by its id) was settled before the receipt existed."""

    def __init__(self, b: MemoryBroker, originals: Mapping[str, Delivery]) -> None:
        super().__init__(url(b), outbox=False)
        self.originals = originals
        self.settled_before_receipt: list[Outcome | None] = []

    def send(self, destination: str, body: bytes | None, **kw: Any) -> Receipt:
        original = self.originals[kw["headers"][DLQ_MESSAGE_ID]]
        self.settled_before_receipt.append(original.settled)
        receipt = super().send(destination, body, **kw)
        self.settled_before_receipt.append(original.settled)
        return receipt


# --- order ---------------------------------------------------------------------------------


def test_one_key_at_a_time_in_arrival_order_under_concurrency(
    memory_broker: MemoryBroker,
) -> None:
    rng = random.Random(20261206)
    keys = [f"k{n}" for n in range(12)]
    items: list[tuple[str | None, bytes]] = [(rng.choice(keys), b"%d" % i) for i in range(400)]
    ids = send(memory_broker, items)
    sent_order: dict[str, list[str]] = defaultdict(list)
    for (key, _), message_id in zip(items, ids, strict=True):
        sent_order[str(key)].append(message_id)
    ticks = itertools.count()
    lock = threading.Lock()
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    running = [0]
    most = [0]
    durations = {message_id: rng.random() * 0.003 for message_id in ids}

    def handler(d: Delivery) -> None:
        with lock:
            start = next(ticks)
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(durations[str(d.message_id)])  # the handler's work, of random length
        with lock:
            running[0] -= 1
            spans[(d.key or b"").decode()].append((start, next(ticks), str(d.message_id)))

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(consumer, handler, lambda: consumer.stats().handled == len(ids), concurrency=4)

    assert most[0] > 1, "the handlers never overlapped: the test proves nothing"
    for key, order in sent_order.items():
        handled = spans[key]
        assert [message_id for _, _, message_id in handled] == order, key
        for (_, end, _), (start, _, _) in itertools.pairwise(handled):
            assert end < start, f"two handlers of {key} overlapped"
    stats = consumer.stats()
    assert stats.handled == stats.acked == len(ids)
    assert (stats.requeued, stats.in_flight) == (0, 0)
    assert leftover(memory_broker) == []


def test_unkeyed_deliveries_run_concurrently(memory_broker: MemoryBroker) -> None:
    ids = send(memory_broker, [(None, b"x")] * 4)
    together = threading.Barrier(4, timeout=10)
    handled: list[str] = []

    def handler(d: Delivery) -> None:
        together.wait()  # returns only once four handlers run at the same time
        handled.append(str(d.message_id))

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(consumer, handler, lambda: len(handled) == 4, concurrency=4)
    assert sorted(handled) == sorted(ids)
    assert consumer.stats().retried == 0


# --- retries -------------------------------------------------------------------------------


def test_retry_schedule_follows_the_policy_exactly(memory_broker: MemoryBroker) -> None:
    [poison] = send(memory_broker, [("a", b"bad")])
    clock = LeapingClock()
    attempts: list[tuple[int, float]] = []

    def handler(d: Delivery) -> None:
        attempts.append((d.attempt, clock.now()))
        raise RuntimeError("always")

    policy = RetryPolicy(initial=0.1, multiplier=2.0, maximum=10.0, max_attempts=4, jitter=False)
    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: memory_broker.count("dlq") == 1,
        retry=policy,
        dead_letter="dlq",
        dead_letter_producer=Producer(url(memory_broker), outbox=False),
        clock=clock,
    )
    assert [a for a, _ in attempts] == [1, 2, 3, 4]
    assert [round(t, 9) for _, t in attempts] == [0.0, 0.1, 0.3, 0.7]
    [letter] = memory_broker.messages("dlq")
    assert letter.headers[DLQ_ATTEMPTS] == "4" and letter.headers[DLQ_MESSAGE_ID] == poison
    stats = consumer.stats()
    assert (stats.retried, stats.dead_lettered, stats.handled, stats.acked) == (3, 1, 0, 1)


def test_other_keys_go_on_while_one_key_waits_out_its_backoff(
    memory_broker: MemoryBroker,
) -> None:
    items: list[tuple[str | None, bytes]] = [("A", b"a1"), ("A", b"a2")]
    items += [("B", b"b%d" % i) for i in range(5)]
    send(memory_broker, items)
    clock = HandClock()
    seen: list[tuple[bytes, int, float]] = []

    def handler(d: Delivery) -> None:
        seen.append((d.body, d.attempt, clock.now()))
        if d.body == b"a1" and d.attempt == 1:
            raise RuntimeError("once")

    def bodies() -> list[bytes]:
        return [body for body, _, _ in seen]

    consumer = Consumer(url(memory_broker)).subscribe("q")
    done = threading.Event()

    def drive() -> None:
        wait_until(lambda: {b"b0", b"b1", b"b2", b"b3", b"b4"} <= set(bodies()), 10, "key B")
        # Key B is done while a1 waits for its retry at t=0.1 and a2 waits behind it.
        assert bodies().count(b"a1") == 1 and b"a2" not in bodies()
        assert clock.deadlines and min(clock.deadlines) == pytest.approx(0.1)
        clock.advance(0.1)
        wait_until(lambda: b"a2" in bodies(), 10, "key A after its retry")
        done.set()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    run_until(
        consumer,
        handler,
        done.is_set,
        concurrency=2,
        retry=RetryPolicy(initial=0.1, max_attempts=3, jitter=False),
        on_exhausted="reject",
        clock=clock,
    )
    driver.join()
    assert [(body, attempt) for body, attempt, _ in seen if body.startswith(b"a")] == [
        (b"a1", 1),
        (b"a1", 2),
        (b"a2", 1),
    ]
    assert [t for body, attempt, t in seen if body == b"a1" and attempt == 2] == [0.1]
    assert consumer.stats().handled == 7 and leftover(memory_broker) == []


def test_permanent_errors_skip_the_retries(memory_broker: MemoryBroker) -> None:
    send(memory_broker, [("k", b"bad")])
    calls: list[int] = []

    def handler(d: Delivery) -> None:
        calls.append(d.attempt)
        raise ValueError("cannot parse")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: memory_broker.count("dlq") == 1,
        retry=RetryPolicy(initial=0.0, max_attempts=5),
        permanent=(ValueError,),
        dead_letter="dlq",
        dead_letter_producer=Producer(url(memory_broker), outbox=False),
        clock=LeapingClock(),
    )
    assert calls == [1]
    [letter] = memory_broker.messages("dlq")
    assert letter.headers[DLQ_ATTEMPTS] == "1" and letter.headers[DLQ_ERROR_TYPE] == "ValueError"


# --- dead letters --------------------------------------------------------------------------


class Unreadable(Exception):
    pass


def test_dead_letter_headers_and_ack_only_after_its_receipt(memory_broker: MemoryBroker) -> None:
    [poison] = send(memory_broker, [("k1", b"payload")], origin="shop")
    originals: dict[str, Delivery] = {}

    def handler(d: Delivery) -> None:
        originals[str(d.message_id)] = d
        raise Unreadable("x" * (3 * ERROR_TEXT_LIMIT))

    spy = DeadLetterSpy(memory_broker, originals)
    consumer = Consumer(url(memory_broker)).subscribe("q")
    before = datetime.datetime.now(datetime.UTC)
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().dead_lettered == 1,
        retry=RetryPolicy(initial=0.0, max_attempts=2),
        dead_letter="dlq",
        dead_letter_producer=spy,
        clock=LeapingClock(),
    )
    assert spy.settled_before_receipt == [None, None]  # nothing acked before the receipt
    assert originals[poison].settled is Outcome.ACCEPT
    [letter] = memory_broker.messages("dlq")
    assert (letter.body, letter.key) == (b"payload", b"k1")
    assert letter.message_id != poison
    h = letter.headers
    assert h["origin"] == "shop" and h[DLQ_SOURCE] == "q" and h[DLQ_MESSAGE_ID] == poison
    assert h[DLQ_ATTEMPTS] == "2"
    assert h[DLQ_ERROR_TYPE] == f"{__name__}.Unreadable"
    assert len(h[DLQ_ERROR]) == ERROR_TEXT_LIMIT and h[DLQ_ERROR].startswith("xxx")
    at = datetime.datetime.fromisoformat(h[DLQ_AT])
    assert at.utcoffset() == datetime.timedelta(0)
    assert before <= at <= datetime.datetime.now(datetime.UTC)
    assert leftover(memory_broker) == []


def test_a_failed_dead_letter_send_gives_the_original_back(memory_broker: MemoryBroker) -> None:
    [poison] = send(memory_broker, [("k", b"bad")])
    seen: list[tuple[int, bool]] = []

    def handler(d: Delivery) -> None:
        seen.append((d.attempt, d.redelivered))
        if len(seen) == 2:
            memory_broker.accept_writes()  # the dead-letter destination is back
        raise RuntimeError("poison")

    memory_broker.refuse_writes()
    consumer = Consumer(url(memory_broker)).subscribe("q")
    producer = Producer(url(memory_broker), outbox=False)
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().dead_lettered == 1,
        on_exhausted=None,
        dead_letter="dlq",
        dead_letter_producer=producer,
    )
    # The first dead letter was refused: the original went back, came again, and only
    # the second dead letter's receipt let it be acknowledged.
    assert seen == [(1, False), (2, True)]
    stats = consumer.stats()
    assert (stats.requeued, stats.acked, stats.dead_lettered) == (1, 1, 1)
    assert memory_broker.ids("dlq") != [] and len(memory_broker.messages("dlq")) == 1
    assert memory_broker.messages("dlq")[0].headers[DLQ_MESSAGE_ID] == poison
    assert leftover(memory_broker) == []
    producer.close()


def test_refused_dead_letter_raises_no_error_out_of_run(memory_broker: MemoryBroker) -> None:
    send(memory_broker, [("k", b"bad")])
    memory_broker.refuse_writes()
    producer = Producer(url(memory_broker), outbox=False)
    with pytest.raises(Refused):
        producer.send("dlq", b"probe")  # the fault the run meets below
    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        lambda d: 1 / 0,
        lambda: consumer.stats().requeued >= 3,
        dead_letter="dlq",
        dead_letter_producer=producer,
    )
    stats = consumer.stats()
    assert stats.acked == 0 and stats.dead_lettered == 0
    [back] = leftover(memory_broker)
    assert back.redelivered
    producer.close()


# --- on_exhausted --------------------------------------------------------------------------


def test_on_exhausted_reject_drops_after_the_attempts(memory_broker: MemoryBroker) -> None:
    send(memory_broker, [("k", b"bad"), ("k", b"good")])
    calls: list[tuple[bytes, int]] = []

    def handler(d: Delivery) -> None:
        calls.append((d.body, d.attempt))
        if d.body == b"bad":
            raise RuntimeError("no")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().handled == 1,
        retry=RetryPolicy(initial=0.0, max_attempts=3),
        on_exhausted="reject",
        clock=LeapingClock(),
    )
    assert calls == [(b"bad", 1), (b"bad", 2), (b"bad", 3), (b"good", 1)]
    stats = consumer.stats()
    assert (stats.rejected, stats.acked, stats.retried) == (1, 1, 2)
    assert leftover(memory_broker) == []


def test_on_exhausted_stop_gives_back_and_raises(memory_broker: MemoryBroker) -> None:
    [bad] = send(memory_broker, [("k", b"bad")])

    def handler(d: Delivery) -> None:
        raise KeyError("missing")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    with pytest.raises(KeyError):
        consumer.run(
            handler,
            retry=RetryPolicy(initial=0.0, max_attempts=2),
            on_exhausted="stop",
            clock=LeapingClock(),
        )
    assert consumer.stats().acked == 0
    [back] = leftover(memory_broker)
    assert back.message_id == bad and back.redelivered


def test_without_a_final_choice_a_failure_is_given_back(memory_broker: MemoryBroker) -> None:
    send(memory_broker, [("k", b"once")])
    seen: list[tuple[int, bool]] = []

    def handler(d: Delivery) -> None:
        seen.append((d.attempt, d.redelivered))
        if len(seen) == 1:
            raise RuntimeError("transient")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(consumer, handler, lambda: consumer.stats().handled == 1)
    assert seen == [(1, False), (2, True)]
    assert leftover(memory_broker) == []


@pytest.mark.parametrize(
    "options",
    [
        {"retry": RetryPolicy(max_attempts=3)},
        {"permanent": (ValueError,)},
        {"retry": RetryPolicy(), "dead_letter": "dlq"},
        {"on_exhausted": "drop"},
        {"dead_letter": "dlq", "on_exhausted": "reject"},
        {"dead_letter_url": "memory://x"},
        {"concurrency": 0},
        {"prefetch": 0},
        {"stop_timeout": -1},
    ],
)
def test_run_refuses_unsafe_or_bad_options(
    memory_broker: MemoryBroker, options: dict[str, Any]
) -> None:
    with Consumer(url(memory_broker)) as consumer:
        consumer.subscribe("q")
        with pytest.raises(ConfigurationError):
            consumer.run(lambda d: None, **options)


# --- stopping ------------------------------------------------------------------------------


def test_stop_finishes_running_handlers_and_gives_back_the_rest(
    memory_broker: MemoryBroker,
) -> None:
    ids = send(memory_broker, [(f"k{i}", b"%d" % i) for i in range(10)])
    release = threading.Event()
    started: list[str] = []

    def handler(d: Delivery) -> None:
        started.append(str(d.message_id))
        assert release.wait(10)

    consumer = Consumer(url(memory_broker)).subscribe("q")

    def stop_then_release() -> None:
        wait_until(lambda: consumer.stats().in_flight == 2, 10, "two handlers running")
        wait_until(lambda: consumer.stats().received == 10, 10, "all ten prefetched")
        consumer.stop()
        release.set()

    helper = threading.Thread(target=stop_then_release, daemon=True)
    helper.start()
    consumer.run(handler, concurrency=2, prefetch=10, stop_timeout=10)
    helper.join()
    stats = consumer.stats()
    assert len(started) == 2
    # Every delivery was either acknowledged after its handler returned, or given back
    # untried: released, not requeued (a broker that counts would count no attempt).
    assert (stats.handled, stats.acked, stats.in_flight) == (2, 2, 0)
    assert (stats.released, stats.requeued) == (8, 0)
    back = leftover(memory_broker)
    assert sorted(str(d.message_id) for d in back) == sorted(set(ids) - set(started))
    assert all(d.redelivered and d.attempt == 2 for d in back)


def test_stop_timeout_gives_back_a_handler_that_does_not_end(
    memory_broker: MemoryBroker,
) -> None:
    [stuck] = send(memory_broker, [("k", b"slow")])
    release = threading.Event()
    returned = threading.Event()

    def handler(d: Delivery) -> None:
        release.wait(10)
        returned.set()

    consumer = Consumer(url(memory_broker)).subscribe("q")

    def stop_soon() -> None:
        wait_until(lambda: consumer.stats().in_flight == 1, 10, "the handler running")
        consumer.stop()

    threading.Thread(target=stop_soon, daemon=True).start()
    began = time.monotonic()
    consumer.run(handler, stop_timeout=0.3)
    assert time.monotonic() - began < 5
    [back] = leftover(memory_broker)
    assert back.message_id == stuck and back.redelivered
    release.set()
    wait_until(returned.is_set, 10, "the late handler to return")
    assert consumer.stats().acked == 0  # its late return acknowledged nothing
    # Its handler ran: given back counted (nack), not released.
    assert (consumer.stats().requeued, consumer.stats().released) == (1, 0)


def test_a_failure_at_a_stop_gives_back_the_head_counted_and_its_key_released(
    memory_broker: MemoryBroker,
) -> None:
    send(memory_broker, [("k", b"a"), ("k", b"b"), ("k", b"c")])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    seen: list[bytes] = []

    def handler(d: Delivery) -> None:
        seen.append(d.body)
        wait_until(lambda: consumer.stats().received == 3, 10, "the key's three fetched")
        consumer.stop()
        raise RuntimeError("fails while stopping")

    consumer.run(handler, prefetch=10)
    stats = consumer.stats()
    assert seen == [b"a"]
    # The head was tried (and failed): counted; the two behind it never ran (nor did
    # what the last fetch may have brought back meanwhile): released.
    assert (stats.requeued, stats.acked) == (1, 0)
    assert stats.released == stats.received - 1 >= 2
    assert sorted(d.body for d in leftover(memory_broker)) == [b"a", b"b", b"c"]


def test_a_stop_during_a_backoff_gives_back_the_tried_head_counted(
    memory_broker: MemoryBroker,
) -> None:
    send(memory_broker, [("k", b"a"), ("k", b"b")])
    consumer = Consumer(url(memory_broker)).subscribe("q")

    def handler(d: Delivery) -> None:
        raise RuntimeError("always")

    run_until(
        consumer,
        handler,
        lambda: consumer.stats().retried == 1 and consumer.stats().received == 2,
        retry=RetryPolicy(initial=30.0, maximum=30.0, max_attempts=5),
        on_exhausted="reject",
    )
    stats = consumer.stats()
    # "a" waits out its backoff (tried once); "b" waits behind it (never tried).
    assert (stats.requeued, stats.released, stats.acked) == (1, 1, 0)
    assert sorted(d.body for d in leftover(memory_broker)) == [b"a", b"b"]


def test_poll_counts_attempts_across_redeliveries(memory_broker: MemoryBroker) -> None:
    [only] = send(memory_broker, [(None, b"x")])
    with Consumer(url(memory_broker)) as consumer:
        consumer.subscribe("q")
        for expected in (1, 2, 3):
            [d] = consumer.poll(2)
            assert (d.message_id, d.attempt, d.attempt_from_broker) == (only, expected, False)
            d.nack()
        [d] = consumer.poll(2)
        assert d.attempt == 4
        d.ack()


_SIGNALLED_RUN = """
import json, signal, sys, threading, time
from msgsafe import Consumer, Producer
from msgsafe.testing import MemoryBroker

MemoryBroker.install(MemoryBroker("signalled"))
with Producer("memory://signalled", outbox=False) as p:
    ids = [p.send("q", b"%d" % i, key="k%d" % (i % 3)).message_id for i in range(30)]
previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
handled = []
printing = threading.Lock()

def handler(d):
    with printing:  # one line per call: two workers print at once
        print("handling", flush=True)
    time.sleep(0.2)  # the handler's work
    handled.append(d.message_id)

consumer = Consumer("memory://signalled").subscribe("q")
consumer.run(handler, concurrency=2, prefetch=10, stop_timeout=10)
restored = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous
back = []
with Consumer("memory://signalled") as again:
    again.subscribe("q")
    while batch := again.poll(0.1, max_messages=100):
        back.extend(batch)
stats = consumer.stats()
print(json.dumps({
    "ids": ids, "handled": handled, "acked": stats.acked, "requeued": stats.requeued,
    "released": stats.released,
    "back": [d.message_id for d in back], "redelivered": sum(d.redelivered for d in back),
    "restored": restored,
}))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_cleanly(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "run.py"
    script.write_text(_SIGNALLED_RUN)
    report = signalled(script, signum=signum)
    handled, back = report["handled"], report["back"]
    assert 0 < len(handled) < 30 and report["acked"] == len(handled)
    # None lost, none acknowledged unhandled: each was handled then acked, or is back.
    assert sorted(handled + back) == sorted(report["ids"])
    # Every handler ended within stop_timeout: what is back was never tried, so released.
    assert report["requeued"] == 0
    assert report["released"] == report["redelivered"] > 0
    assert report["restored"]


def test_a_key_waits_behind_a_busy_key_for_a_bounded_run(memory_broker: MemoryBroker) -> None:
    # One worker, 40 deliveries of "a" then one of "b", all fetched at once: the worker
    # goes on with "a"'s lane while it has deliveries, but no more than 16 in a row after
    # the first while "b" waits for a worker.
    items: list[tuple[str | None, bytes]] = [("a", b"%d" % i) for i in range(40)]
    ids = send(memory_broker, [*items, ("b", b"b")])
    handled: list[str] = []

    def handler(d: Delivery) -> None:
        handled.append(str(d.message_id))

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(consumer, handler, lambda: len(handled) == len(ids), concurrency=1)
    assert [i for i in handled if i != ids[-1]] == ids[:-1]  # "a" in its order
    assert 1 <= handled.index(ids[-1]) <= 17
    assert consumer.stats().handled == len(ids)
