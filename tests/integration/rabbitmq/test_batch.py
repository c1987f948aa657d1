"""``RabbitTransport.publish_batch`` on the real 3-node cluster, counted.

Every id sent, every report (``confirmed(k)`` / ``failed(i, error)``) and every id
consumed is recorded. A batch is finished when its reports add up to its length; the
confirmed ids are then the ids not reported failed. Passing means: exactly one report
per message, lost == 0 (every confirmed id consumed), duplicates only of known ids.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from msgsafe.adapters import open_receiver, open_transport
from msgsafe.adapters.rabbitmq import RabbitTransport
from msgsafe.adapters.rabbitmq import _confirms as rabbit_confirms
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import MessageTooLarge, MsgsafeError, TransientError, Unroutable
from msgsafe.message import Batch, Envelope
from msgsafe.ports import Transport
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BODY = b"x" * 100


class CountingReport:
    """A :class:`~msgsafe.ports.BatchReport` that counts, and fails the test on a second
    report for one message or on more reports than messages."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.confirmed_count = 0
        self.confirm_calls = 0
        self.failures: dict[int, MsgsafeError] = {}
        self.problems: list[str] = []
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def confirmed(self, count: int) -> None:
        with self.lock:
            if count <= 0:
                self.problems.append(f"confirmed({count})")
            self.confirmed_count += count
            self.confirm_calls += 1
            self._check()

    def failed(self, index: int, error: MsgsafeError) -> None:
        with self.lock:
            if index in self.failures:
                self.problems.append(f"message {index} reported failed twice")
            if error.message_id != self.batch.message_ids[index]:
                self.problems.append(f"message {index}: error names {error.message_id}")
            self.failures[index] = error
            self._check()

    def _check(self) -> None:
        reported = self.confirmed_count + len(self.failures)
        if reported > len(self.batch):
            self.problems.append(f"{reported} reports for {len(self.batch)} messages")
        if reported >= len(self.batch):
            self.finished.set()

    def wait(self, timeout: float) -> None:
        assert self.finished.wait(timeout), (
            f"reports incomplete after {timeout} s: confirmed {self.confirmed_count}, "
            f"failed {len(self.failures)} of {len(self.batch)}"
        )
        assert not self.problems, self.problems[:5]

    def confirmed_ids(self) -> set[str]:
        ids = self.batch.message_ids
        return {ids[i] for i in range(len(ids)) if i not in self.failures}


def _queue(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def transport(rabbit_urls: RabbitUrls) -> Iterator[RabbitTransport]:
    t = open_transport(parse_url(rabbit_urls.cluster), {"declare": "quorum", "max_in_flight": 500})
    assert isinstance(t, RabbitTransport)
    try:
        yield t
    finally:
        t.close(5)


def test_batch_larger_than_the_window_confirmed_and_consumed_exactly(
    transport: RabbitTransport, rabbit_urls: RabbitUrls
) -> None:
    queue = _queue("batch")
    n = 3_000  # six windows of 500
    batch = Batch.build(
        queue, [b"%d" % i + BODY for i in range(n)], keys=[b"k%d" % (i % 7) for i in range(n)]
    )
    ledger = Ledger(sent=set(batch.message_ids))
    report = CountingReport(batch)
    transport.publish_batch(batch, report)
    report.wait(30)
    assert not report.failures, list(report.failures.items())[:3]
    assert report.confirmed_count == n
    # Confirms are counted per run of acks, not one call per message.
    assert report.confirm_calls < n // 10, report.confirm_calls
    ledger.receipted = report.confirmed_ids()
    receive_receipted(rabbit_urls.cluster, queue, ledger, prefetch=1000)
    print(ledger.report("batch 3000") + f" confirm_calls={report.confirm_calls}")
    assert not ledger.lost
    assert not ledger.unknown
    assert ledger.duplicates == 0
    assert set(ledger.received) == set(batch.message_ids)


@pytest.mark.parametrize("writes", ["frames", "basic_publish"])
def test_batch_and_single_publishes_interleave_in_order(
    writes: str, rabbit_urls: RabbitUrls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches and single messages on one transport: every report arrives, and a key's
    messages are consumed in the order they were handed over. ``basic_publish``: pika's
    internals as if they were not what the frame writer expects (another pika release),
    so every message goes through pika's own publish."""
    if writes == "basic_publish":
        monkeypatch.setattr(rabbit_confirms, "pika_emit", lambda conn: None)
    transport = open_transport(
        parse_url(rabbit_urls.cluster), {"declare": "quorum", "max_in_flight": 500}
    )
    try:
        _interleave_in_order(transport, rabbit_urls)
    finally:
        transport.close(5)


def _interleave_in_order(transport: Transport, rabbit_urls: RabbitUrls) -> None:
    assert isinstance(transport, RabbitTransport)
    queue = _queue("mixed")
    batches = [Batch.build(queue, [BODY] * 700, keys=[b"k"] * 700) for _ in range(3)]
    reports = [CountingReport(b) for b in batches]
    singles = []
    order: list[str] = []
    for batch, report in zip(batches, reports, strict=True):
        env = Envelope.build(queue, BODY, key=b"k")
        singles.append(transport.publish(env))
        order.append(env.message_id)
        transport.publish_batch(batch, report)
        order.extend(batch.message_ids)
    for report in reports:
        report.wait(30)
        assert not report.failures
    for fut in singles:
        assert fut.result(30) is None
    receiver = open_receiver(parse_url(rabbit_urls.cluster), {"prefetch": 1000})
    got: list[str] = []
    try:
        receiver.subscribe(queue)
        deadline = time.monotonic() + 60
        while len(got) < len(order) and time.monotonic() < deadline:
            for delivery in receiver.receive(max_messages=500, timeout=0.5):
                assert delivery.message_id is not None
                assert delivery.headers.get("msgsafe-id") == delivery.message_id
                got.append(delivery.message_id)
                delivery.ack()
    finally:
        receiver.close()
    assert got == order


def test_batch_to_an_unroutable_destination_confirms_none(transport: RabbitTransport) -> None:
    batch = Batch.build("amq.direct/nobody-listens", [BODY] * 300)
    report = CountingReport(batch)
    transport.publish_batch(batch, report)
    report.wait(30)
    assert report.confirmed_count == 0
    assert len(report.failures) == 300
    assert all(isinstance(e, Unroutable) for e in report.failures.values())
    # A missing exchange closes the channel: every message is Unroutable, none confirmed,
    # and the transport goes on.
    missing = Batch.build(f"no-such-exchange-{uuid.uuid4().hex}/k", [BODY] * 100)
    report = CountingReport(missing)
    transport.publish_batch(missing, report)
    report.wait(30)
    assert report.confirmed_count == 0
    assert all(isinstance(e, Unroutable) for e in report.failures.values()), report.failures[0]
    after = Batch.build(_queue("after"), [BODY] * 10)
    report = CountingReport(after)
    transport.publish_batch(after, report)
    report.wait(30)
    assert report.confirmed_count == 10


def test_batch_with_one_oversize_message(rabbit_urls: RabbitUrls) -> None:
    t = open_transport(
        parse_url(rabbit_urls.cluster), {"declare": "quorum", "max_message_size": 1000}
    )
    assert isinstance(t, RabbitTransport)
    queue = _queue("oversize")
    bodies = [BODY] * 400
    bodies[123] = b"y" * 1001
    batch = Batch.build(queue, bodies)
    ledger = Ledger(sent=set(batch.message_ids))
    report = CountingReport(batch)
    try:
        t.publish_batch(batch, report)
        report.wait(30)
    finally:
        t.close(5)
    assert list(report.failures) == [123]
    assert isinstance(report.failures[123], MessageTooLarge)
    assert report.confirmed_count == 399
    ledger.receipted = report.confirmed_ids()
    receive_receipted(rabbit_urls.cluster, queue, ledger, prefetch=1000)
    assert not ledger.lost
    assert ledger.duplicates == 0
    assert batch.message_ids[123] not in ledger.received


def test_closed_transport_fails_the_batch(rabbit_urls: RabbitUrls) -> None:
    t = open_transport(parse_url(rabbit_urls.cluster), {})
    assert isinstance(t, RabbitTransport)
    t.close(1)
    batch = Batch.build(_queue("closed"), [BODY] * 5)
    report = CountingReport(batch)
    t.publish_batch(batch, report)
    report.wait(5)
    assert len(report.failures) == 5


N_KILL = 30_000


def test_kill_connected_node_mid_batch(rabbit: RabbitCluster) -> None:
    """One batch of 30k while the node the transport is connected to (and that leads
    the queue) is killed -9: transient failures are sent again with the same ids, as
    the outbox would; lost == 0."""
    victim = 0
    order = [victim] + [i for i in range(rabbit.size) if i != victim]
    queue = _queue("batch-kill")
    t = open_transport(
        parse_url(rabbit.cluster_url(order)),
        {"declare": "quorum", "heartbeat": 2, "confirm_timeout": 20},
    )
    assert isinstance(t, RabbitTransport)
    batch = Batch.build(queue, [BODY] * N_KILL, keys=[b"k%d" % (i % 16) for i in range(N_KILL)])
    ledger = Ledger(sent=set(batch.message_ids))
    confirmed = collections.Counter[str]()
    progress = {"confirmed": 0}

    class Report(CountingReport):
        def confirmed(self, count: int) -> None:
            super().confirmed(count)
            progress["confirmed"] += count

    def fault() -> None:
        wait_until(lambda: progress["confirmed"] >= N_KILL // 4, 60, "a quarter confirmed")
        rabbit.kill(victim)
        wait_until(
            lambda: progress["confirmed"] >= N_KILL // 2, 60, "half confirmed after the kill"
        )
        rabbit.restart(victim)

    fault_thread = threading.Thread(target=fault, name="fault")
    started = time.monotonic()
    try:
        fault_thread.start()
        todo = batch
        deadline = time.monotonic() + 150
        rounds = 0
        while len(todo) and time.monotonic() < deadline:
            rounds += 1
            report = Report(todo)
            t.publish_batch(todo, report)
            report.wait(60)
            for index, error in report.failures.items():
                ledger.add_failure(todo.message_ids[index], error)
            for mid in report.confirmed_ids():
                confirmed[mid] += 1
            retry = sorted(i for i, e in report.failures.items() if isinstance(e, TransientError))
            todo = todo.select(retry)
    finally:
        t.close(10)
        fault_thread.join(120)
    published = time.monotonic() - started
    ledger.receipted = set(confirmed)
    others = [i for i in order if i != victim]
    receive_receipted(rabbit.cluster_url(others), queue, ledger, prefetch=1000, quiet_s=5.0)
    print(f"{ledger.report('batch kill -9')} rounds={rounds} publish_s={published:.1f}")
    assert not ledger.permanent, ledger.permanent[:3]
    assert len(ledger.receipted) == N_KILL, "every message should be confirmed after retries"
    assert not ledger.lost, f"{len(ledger.lost)} confirmed ids never consumed"
    assert not ledger.unknown
