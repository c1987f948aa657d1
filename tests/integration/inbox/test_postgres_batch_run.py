"""Consumer.run(batch=...) with the PostgreSQL inbox of the real primary + standby pair
and the real RabbitMQ cluster's quorum queues, counted.

300 keyed messages (one in twenty poison, always raising; one in ten failing on its
first attempt); ten were committed by an earlier process that died before
acknowledging them. The batch handler writes one effect row per delivery through
``tx``. Then: the ten are acknowledged without the handler, every other message's
effect is applied exactly once, each key's effects are in send order, every poison
message is on the dead-letter queue after the policy's attempts with no effect, batches
were committed and split, and nothing is left on the queue.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from msgsafe import BatchPolicy, Consumer, Delivery, Producer, RetryPolicy
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.consuming.dead_letter import DLQ_ATTEMPTS, DLQ_MESSAGE_ID
from msgsafe.inbox import open_inbox
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.rabbit_queues import declare_quorum
from tests.support.receiving import receive_exactly
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

COUNT = 300
KEYS = 12
MAX_ATTEMPTS = 3


def _kind(i: int) -> str:
    return "poison" if i % 20 == 7 else "flaky" if i % 10 == 3 else "ok"


def test_batches_commit_once_and_dead_letter_the_poison_alone(
    rabbit_urls: RabbitUrls, pg_pair: PostgresCluster, tmp_path: Path
) -> None:
    url = rabbit_urls.cluster
    queue = declare_quorum(rabbit_urls.amqp[0], f"binbox-{uuid.uuid4().hex[:8]}")
    dlq = declare_quorum(rabbit_urls.amqp[0], f"binbox-dlq-{uuid.uuid4().hex[:8]}")
    suffix = uuid.uuid4().hex[:10]
    effects = f"effects_{suffix}"
    inbox_url = f"{pg_pair.url}&table=inbox_{suffix}"
    insert = f"INSERT INTO {effects} (message_id, key) VALUES (%s, %s)"
    with psycopg.connect(pg_pair.url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {effects} (n bigserial PRIMARY KEY, message_id text NOT NULL,"
            " key text NOT NULL)"
        )
    items = [(f"k{i % KEYS}", f"{_kind(i)}:{i}".encode()) for i in range(COUNT)]
    with Producer(url, outbox=False) as producer:
        ids = [producer.send(queue, body, key=key).message_id for key, body in items]
    kind_of = {m: _kind(i) for i, m in enumerate(ids)}
    key_of = {m: key for m, (key, _) in zip(ids, items, strict=True)}
    poison = {m for m, k in kind_of.items() if k == "poison"}
    earlier = [m for m in ids if kind_of[m] == "ok"][5:15]
    inbox = open_inbox(inbox_url)
    try:
        for m in earlier:
            inbox.process(m, lambda tx, m=m: tx.execute(insert, (m, key_of[m])), source=queue)
    finally:
        inbox.close()
    failed_once: set[str] = set()
    lock = threading.Lock()

    def handler(deliveries: list[Delivery], tx: Any) -> None:
        with tx.cursor() as cursor:
            cursor.executemany(
                insert, [(d.message_id, key_of[str(d.message_id)]) for d in deliveries]
            )
        with lock:
            for d in deliveries:
                m = str(d.message_id)
                if kind_of[m] == "poison":
                    raise RuntimeError(f"cannot handle {m}")
                if kind_of[m] == "flaky" and m not in failed_once:
                    failed_once.add(m)
                    raise RuntimeError(f"{m} fails once")

    consumer = Consumer(url).subscribe(queue)
    done = (COUNT - len(poison) - len(earlier), len(earlier), len(poison))

    def settled() -> tuple[int, int, int]:
        s = consumer.stats()
        return s.handled, s.skipped, s.dead_lettered

    with Producer(url, outbox=tmp_path / "dead.db") as dead_letters:
        failures: list[BaseException] = []

        def watch() -> None:
            try:
                wait_until(
                    lambda: settled() == done,
                    45,
                    "every message handled, skipped or dead-lettered",
                    diagnose=lambda: repr(consumer.stats()),
                )
            except AssertionError as exc:
                failures.append(exc)
            consumer.stop()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        consumer.run(
            handler,
            inbox=inbox_url,
            batch=BatchPolicy(max_messages=64),
            concurrency=2,
            retry=RetryPolicy(initial=0.01, maximum=0.05, max_attempts=MAX_ATTEMPTS),
            dead_letter=dlq,
            dead_letter_producer=dead_letters,
            handle_signals=False,
        )
        watcher.join()
    assert not failures, failures[0]
    stats = consumer.stats()
    assert settled() == done
    assert stats.batches >= 1 and stats.batches_split >= 1
    assert stats.batches < COUNT - len(earlier)  # some batch held more than one message
    with psycopg.connect(pg_pair.url) as conn:
        rows = conn.execute(f"SELECT message_id, key FROM {effects} ORDER BY n").fetchall()
    applied = Counter(m for m, _ in rows)
    assert applied == Counter({m: 1 for m in ids if m not in poison})  # lost 0, once each
    sent: dict[str, list[str]] = defaultdict(list)
    for m in ids:
        if m not in poison and m not in earlier:
            sent[key_of[m]].append(m)
    committed: dict[str, list[str]] = defaultdict(list)
    for m, key in rows:
        if m not in earlier:
            committed[key].append(m)
    assert committed == sent
    inbox = open_inbox(inbox_url)
    try:
        assert inbox.handled(ids) == set(ids) - poison
    finally:
        inbox.close()
    with Consumer(url).subscribe(dlq) as dead:
        letters = receive_exactly(dead, len(poison), "dead letters")
        assert sorted(d.headers[DLQ_MESSAGE_ID] for d in letters) == sorted(poison)
        for d in letters:
            assert d.headers[DLQ_ATTEMPTS] == str(MAX_ATTEMPTS)
            d.ack()
    with Consumer(url).subscribe(queue) as after:
        assert after.poll(1.0, max_messages=10) == []
