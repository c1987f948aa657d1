"""Consumer.run on the real cluster's quorum queues: 500 keyed messages, 5% poison and
some failing once; counted per id, the poison counted on the dead-letter queue, and
attempts read from the queue's x-delivery-count after a redelivery."""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from msgsafe.consuming.dead_letter import DLQ_ATTEMPTS, DLQ_MESSAGE_ID
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.rabbit_queues import declare_quorum
from tests.support.receiving import receive_exactly
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MAX_ATTEMPTS = 3


def test_run_handles_each_once_and_dead_letters_the_poison(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    queue = declare_quorum(rabbit_urls.amqp[0], f"run-{uuid.uuid4().hex[:8]}")
    dlq = declare_quorum(rabbit_urls.amqp[0], f"run-dlq-{uuid.uuid4().hex[:8]}")
    kinds = ["poison" if i % 20 == 7 else "flaky" if i % 10 == 3 else "ok" for i in range(500)]
    with Producer(rabbit_urls.cluster, outbox=False) as producer:
        ids = [
            producer.send(queue, kind.encode(), key=f"k{i % 25}").message_id
            for i, kind in enumerate(kinds)
        ]
    kind_of = dict(zip(ids, kinds, strict=True))
    poison = {i for i, k in kind_of.items() if k == "poison"}
    assert len(poison) == 25

    # A first consumer takes some and goes away unsettled: they come back with the
    # quorum queue's x-delivery-count, which is then their attempt.
    with Consumer(rabbit_urls.cluster).subscribe(queue) as first:
        given_back: list[Delivery] = []
        wait_until(
            lambda: given_back.extend(first.poll(0.5, max_messages=10)) or len(given_back) >= 10,
            30,
            "ten deliveries for the first consumer",
        )
    returned = {str(d.message_id) for d in given_back}

    lock = threading.Lock()
    succeeded: Counter[str] = Counter()
    attempts: dict[str, list[tuple[int, bool]]] = defaultdict(list)

    def handler(d: Delivery) -> None:
        message_id = str(d.message_id)
        with lock:
            attempts[message_id].append((d.attempt, d.attempt_from_broker))
            tries = len(attempts[message_id])
        if d.body == b"poison" or (d.body == b"flaky" and tries == 1):
            raise RuntimeError(f"{d.body.decode()} {message_id}")
        with lock:
            succeeded[message_id] += 1

    consumer = Consumer(rabbit_urls.cluster).subscribe(queue)

    def stop_when_done() -> None:
        try:
            wait_until(
                lambda: (consumer.stats().handled, consumer.stats().dead_lettered) == (475, 25),
                120,
                "every message handled or dead-lettered",
                diagnose=lambda: repr(consumer.stats()),
            )
        finally:
            consumer.stop()

    stopper = threading.Thread(target=stop_when_done, daemon=True)
    stopper.start()
    with Producer(rabbit_urls.cluster, outbox=tmp_path / "dead.db") as dead_letters:
        consumer.run(
            handler,
            concurrency=4,
            retry=RetryPolicy(initial=0.01, maximum=0.05, max_attempts=MAX_ATTEMPTS, jitter=False),
            dead_letter=dlq,
            dead_letter_producer=dead_letters,
        )
    stopper.join()

    # Every message that could succeed did, exactly once; no poison ever "succeeded".
    assert {i for i in ids if i not in poison} == set(succeeded)
    assert set(succeeded.values()) == {1}
    for message_id in returned:
        first_attempt, from_broker = attempts[message_id][0]
        assert (first_attempt, from_broker) == (2, True), message_id
    for message_id in poison:
        assert attempts[message_id][-1][0] == MAX_ATTEMPTS, attempts[message_id]

    with Consumer(rabbit_urls.cluster).subscribe(dlq) as dead:
        letters = receive_exactly(dead, 25, "dead letters")
        assert sorted(d.headers[DLQ_MESSAGE_ID] for d in letters) == sorted(poison)
        assert {d.headers[DLQ_ATTEMPTS] for d in letters} == {str(MAX_ATTEMPTS)}
        for d in letters:
            d.ack()
    with Consumer(rabbit_urls.cluster).subscribe(queue) as after:
        assert after.poll(1.0, max_messages=10) == []
