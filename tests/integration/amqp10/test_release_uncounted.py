"""What a give-back costs in the broker's delivery count, on ActiveMQ Artemis (the
session's pair) and Qpid Broker-J (one node for the module), counted per id.

Artemis and Broker-J count every ``modified`` with delivery-failed as a failed delivery
(``Delivery.attempt`` one higher next time), and ``released`` as none. A delivery that
was never tried goes back released: the unread prefetch at ``close()``, the unstarted
work of a stopped ``Consumer.run()``, the dead letters ``msgsafe deadletter`` reads. A
handler that raises still gives its delivery back counted. Each test would see
``attempt`` above 1 where it asserts 1 if the untried ones went back counted.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Delivery, Producer
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.cluster.qpid import QpidCluster
from tests.integration.amqp10._open import receiver_for
from tests.support.commands import msgsafe
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Messages per test: all within one credit window (500), so all prefetched at once.
COUNT = 20


@pytest.fixture(params=["artemis", "brokerj"])
def url(request: pytest.FixtureRequest) -> str:
    """A URL of the broker under test (Artemis: its live node only)."""
    if request.param == "artemis":
        pair: ArtemisCluster = request.getfixturevalue("artemis_pair")
        return pair.node_url(0)
    node: QpidCluster = request.getfixturevalue("brokerj")
    return node.url


def _address(what: str) -> str:
    return f"release.{what}.{uuid.uuid4().hex[:8]}"


def _send(url: str, address: str, count: int) -> list[str]:
    with Producer(url, outbox=False) as producer:
        return [producer.send(address, b"%d" % n).message_id for n in range(count)]


def _read(url: str, address: str, count: int) -> list[Delivery]:
    """``count`` deliveries of ``address``, each acknowledged, then none more."""
    got: list[Delivery] = []
    with Consumer(url).subscribe(address) as consumer:
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            for delivery in consumer.poll(1, max_messages=100):
                delivery.ack()
                got.append(delivery)
        assert len(got) == count, f"read {len(got)} of {count}"
        assert consumer.poll(0.5, max_messages=100) == []
    return got


def _run(consumer: Consumer, handler: Callable[[Delivery], object], **options: Any) -> None:
    """``consumer.run(handler)`` here; stopped after 60 s at the latest."""
    timer = threading.Timer(60, consumer.stop)
    timer.start()
    try:
        consumer.run(handler, handle_signals=False, **options)
    finally:
        timer.cancel()


def test_close_releases_the_unread_prefetch_uncounted(url: str) -> None:
    address = _address("close")
    ids = _send(url, address, COUNT)
    receiver = receiver_for(url, credit=500)
    try:
        receiver.subscribe(address)
        (first,) = receiver.receive(max_messages=1, timeout=30)
        first.ack()
        wait_until(lambda: receiver.waiting == COUNT - 1, 30, "the rest prefetched")
    finally:
        receiver.close()
    rest = _read(url, address, COUNT - 1)
    assert sorted(str(d.message_id) for d in [first, *rest]) == sorted(ids)
    assert first.attempt == 1
    assert [d.attempt for d in rest] == [1] * (COUNT - 1)
    assert not any(d.redelivered for d in rest)


def test_a_stopped_run_releases_its_unstarted_work_uncounted(url: str) -> None:
    address = _address("run")
    ids = _send(url, address, COUNT)
    consumer = Consumer(url, credit=500).subscribe(address)
    gate = threading.Event()
    started: list[Delivery] = []

    def handler(delivery: Delivery) -> None:
        started.append(delivery)
        assert gate.wait(30)

    def stop_once_all_fetched() -> None:
        try:
            wait_until(lambda: consumer.stats().received == COUNT, 30, "all fetched by run()")
        finally:
            consumer.stop()
            gate.set()

    stopper = threading.Thread(target=stop_once_all_fetched, daemon=True)
    stopper.start()
    _run(consumer, handler, concurrency=1, prefetch=COUNT, stop_timeout=10)
    stopper.join(30)
    stats = consumer.stats()
    assert (len(started), stats.acked, stats.released, stats.requeued) == (1, 1, COUNT - 1, 0)
    rest = _read(url, address, COUNT - 1)
    assert sorted(str(d.message_id) for d in [started[0], *rest]) == sorted(ids)
    assert [d.attempt for d in rest] == [1] * (COUNT - 1)


def test_a_handler_that_raises_still_counts_its_attempt(url: str) -> None:
    address = _address("fails")
    (sent,) = _send(url, address, 1)
    consumer = Consumer(url).subscribe(address)
    seen: list[int] = []

    def handler(delivery: Delivery) -> None:
        seen.append(delivery.attempt)
        if len(seen) == 3:
            consumer.stop()
        raise ValueError("the handler fails")

    # No retry policy: each failure goes back to the broker (counted) and comes again.
    _run(consumer, handler)
    assert seen == [1, 2, 3]
    (last,) = _read(url, address, 1)
    assert (last.message_id, last.attempt, last.redelivered) == (sent, 4, True)


def test_reading_dead_letters_twelve_times_leaves_their_count(
    artemis_pair: ArtemisCluster, tmp_path: Path
) -> None:
    # NOTE: counted, twelve reads would be attempt 13; with Artemis's usual
    # max-delivery-attempts of 10 the tenth would have moved the message to Artemis's
    # own DLQ (the session's pair allows 100).
    url = artemis_pair.node_url(0)
    dlq = _address("dlq")
    (dead,) = _send(url, dlq, 1)
    env = {
        "MSGSAFE_DL_URL": url,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    common = ["--url", "env:MSGSAFE_DL_URL", "--wait", "0.5", "--json"]
    for n in range(12):
        args = ["list", dlq] if n % 2 == 0 else ["show", dlq, dead]
        run = msgsafe("deadletter", *args, *common, env=env)
        assert run.code == 0 and dead in run.stdout, run.stderr[-3000:]
    (left,) = _read(url, dlq, 1)
    assert (left.message_id, left.attempt, left.redelivered) == (dead, 1, False)
