"""AsyncConsumer.run with a SQLite inbox on the real cluster's quorum queues, counted.

300 keyed messages (5% poison that always raises, 10% failing on their first attempt);
ten of them were committed by an earlier process that died before acknowledging them
(their effect rows and inbox records made beforehand through the inbox itself). The
async handler writes one effect row per message through ``tx``. Then: the ten are
acknowledged without the handler, every other message's effect is applied exactly once
with its attempt in the inbox's record, each key's effects are in send order, the
poison is on the dead-letter queue (sent through an AsyncProducer) with its headers and
no effect, and nothing is left on the queue.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from msgsafe import (
    AsyncConsumer,
    AsyncDelivery,
    AsyncProducer,
    Consumer,
    Producer,
    RetryPolicy,
)
from msgsafe.aio import AsyncTransaction
from msgsafe.consuming.dead_letter import (
    DLQ_ATTEMPTS,
    DLQ_ERROR_TYPE,
    DLQ_MESSAGE_ID,
    DLQ_SOURCE,
)
from msgsafe.inbox import open_inbox
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.rabbit_queues import declare_quorum
from tests.support.receiving import receive_exactly
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

COUNT = 300
KEYS = 12
MAX_ATTEMPTS = 3
INSERT = "INSERT INTO effects (message_id, key, body) VALUES (?, ?, ?)"


def _kind(i: int) -> str:
    return "poison" if i % 20 == 7 else "flaky" if i % 10 == 3 else "ok"


def test_async_inbox_run_applies_effects_once_and_dead_letters_the_poison(
    rabbit_urls: RabbitUrls, tmp_path: Path
) -> None:
    url = rabbit_urls.cluster
    queue = declare_quorum(rabbit_urls.amqp[0], f"ainbox-{uuid.uuid4().hex[:8]}")
    dlq = declare_quorum(rabbit_urls.amqp[0], f"ainbox-dlq-{uuid.uuid4().hex[:8]}")
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (message_id TEXT, key TEXT, body BLOB)")
    items = [(f"k{i % KEYS}", f"{_kind(i)}:{i}".encode()) for i in range(COUNT)]
    with Producer(url, outbox=False) as producer:
        ids = [producer.send(queue, body, key=key).message_id for key, body in items]
    kind_of = {m: _kind(i) for i, m in enumerate(ids)}
    poison = {m for m, k in kind_of.items() if k == "poison"}
    # Committed by a process that died before its acknowledgements: (ok) messages.
    earlier = [m for m in ids if kind_of[m] == "ok"][5:15]
    inbox = open_inbox(f"sqlite://{db}")
    try:
        for m in earlier:
            i = ids.index(m)
            inbox.process(m, lambda tx, i=i: tx.execute(INSERT, (ids[i], *items[i])), source=queue)
    finally:
        inbox.close()
    calls: Counter[str] = Counter()

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        calls[str(d.message_id)] += 1
        await tx.execute(INSERT, (d.message_id, (d.key or b"").decode(), d.body))
        if d.body.startswith(b"poison") or (d.body.startswith(b"flaky") and d.attempt == 1):
            raise RuntimeError(f"cannot handle {d.body!r} (attempt {d.attempt})")

    async def main() -> Any:
        consumer = AsyncConsumer(url)
        await consumer.subscribe(queue)
        done = (COUNT - len(poison) - len(earlier), len(earlier), len(poison))

        def settled() -> tuple[int, int, int]:
            s = consumer.stats()
            return s.handled, s.skipped, s.dead_lettered

        async with AsyncProducer(url, outbox=tmp_path / "dead.db") as dead_letters:
            running = asyncio.ensure_future(
                consumer.run(
                    handler,
                    inbox=f"sqlite://{db}",
                    concurrency=4,
                    retry=RetryPolicy(initial=0.01, maximum=0.05, max_attempts=MAX_ATTEMPTS),
                    dead_letter=dlq,
                    dead_letter_producer=dead_letters,
                )
            )
            try:
                await asyncio.to_thread(
                    wait_until,
                    lambda: settled() == done or running.done(),
                    120,
                    "every message handled, skipped or dead-lettered",
                    diagnose=lambda: repr(consumer.stats()),
                )
            finally:
                consumer.stop()
                await running
        return consumer.stats()

    stats = asyncio.run(main())
    assert (stats.handled, stats.skipped, stats.dead_lettered) == (
        COUNT - len(poison) - len(earlier),
        len(earlier),
        len(poison),
    )

    # Handler calls: none for the ten committed before, two for the flaky, the policy's
    # attempts for the poison, one for the rest.
    expected_calls = {
        m: 0 if m in earlier else {"ok": 1, "flaky": 2, "poison": MAX_ATTEMPTS}[kind_of[m]]
        for m in ids
    }
    assert {m: calls[m] for m in ids} == expected_calls
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT message_id, key FROM effects ORDER BY rowid").fetchall()
        records = dict(conn.execute("SELECT message_id, attempt FROM msgsafe_inbox").fetchall())
    # Effects: each message but the poison exactly once (lost == 0, duplicates == 0).
    applied = Counter(m for m, _ in rows)
    assert applied == Counter({m: 1 for m in ids if m not in poison})
    assert records == {
        m: 2 if kind_of[m] == "flaky" and m not in earlier else 1 for m in ids if m not in poison
    }
    # Each key's effects in send order (those committed beforehand came first).
    sent: dict[str, list[str]] = defaultdict(list)
    for m, (key, _) in zip(ids, items, strict=True):
        if m not in poison and m not in earlier:
            sent[key].append(m)
    committed: dict[str, list[str]] = defaultdict(list)
    for m, key in rows:
        if m not in earlier:
            committed[key].append(m)
    assert committed == sent

    with Consumer(url).subscribe(dlq) as dead:
        letters = receive_exactly(dead, len(poison), "dead letters")
        assert sorted(d.headers[DLQ_MESSAGE_ID] for d in letters) == sorted(poison)
        for d in letters:
            assert d.headers[DLQ_ATTEMPTS] == str(MAX_ATTEMPTS)
            assert d.headers[DLQ_ERROR_TYPE] == "RuntimeError"
            assert d.headers[DLQ_SOURCE] == queue
            assert d.body.startswith(b"poison:")
            d.ack()
    with Consumer(url).subscribe(queue) as after:
        assert after.poll(1.0, max_messages=10) == []
