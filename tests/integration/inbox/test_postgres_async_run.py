"""AsyncConsumer.run with the PostgreSQL inbox of the real primary + standby pair (the
messages on memory://): the async handlers' statements go through psycopg on the worker
threads that hold their transactions, the handlers overlap (PostgreSQL takes concurrent
writers, where SQLite's write lock makes them take turns), each key's effects keep
their order, and each message's effect is applied once, its id recorded.

Why memory://: what is under test is the database side; the same run on a real broker is
tests/integration/rabbitmq/test_aio_consumer_inbox.py."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import pytest

from msgsafe import AsyncDelivery
from msgsafe.aio import AsyncTransaction
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.inbox import open_inbox
from msgsafe.testing import MemoryBroker
from tests.unit.consuming.test_run import leftover, send
from tests.unit.inbox.test_aio_consumer import run_until

pytestmark = pytest.mark.integration


def test_async_handlers_overlap_and_apply_each_effect_once(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    effects = f"effects_{suffix}"
    inbox_url = f"{pg_pair.url}&table=inbox_{suffix}"
    with psycopg.connect(pg_pair.url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {effects} (n bigserial PRIMARY KEY, message_id text NOT NULL,"
            " key text NOT NULL, backend integer NOT NULL)"
        )
    items: list[tuple[str | None, bytes]] = [(f"k{i % 6}", b"%d" % i) for i in range(120)]
    ids = send(memory_broker, items)
    running = [0, 0]  # now, most at once

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        running[0] += 1
        running[1] = max(running)
        [(backend,)] = await tx.execute("SELECT pg_backend_pid()")
        await tx.execute(
            f"INSERT INTO {effects} (message_id, key, backend) VALUES (%s, %s, %s)",
            (d.message_id, (d.key or b"").decode(), backend),
        )
        # The rest of the handler's work, its transaction open: others run meanwhile.
        await tx.execute("SELECT pg_sleep(0.01)")
        running[0] -= 1

    stats = run_until(
        memory_broker,
        handler,
        lambda stats: stats.handled == len(ids),
        within=60,
        inbox=inbox_url,
        concurrency=4,
    )
    assert (stats.acked, stats.skipped, stats.retried, stats.in_flight) == (120, 0, 0, 0)
    assert running[1] > 1, "the handlers never overlapped: the test proves nothing"
    with psycopg.connect(pg_pair.url) as conn:
        rows = conn.execute(f"SELECT message_id, key, backend FROM {effects} ORDER BY n").fetchall()
    assert Counter(m for m, _, _ in rows) == Counter({m: 1 for m in ids})
    assert len({backend for _, _, backend in rows}) > 1  # a connection per worker thread
    sent: dict[str, list[str]] = defaultdict(list)
    for (key, _), m in zip(items, ids, strict=True):
        sent[str(key)].append(m)
    committed: dict[str, list[str]] = defaultdict(list)
    for m, key, _ in rows:
        committed[key].append(m)
    assert committed == sent
    inbox = open_inbox(inbox_url)
    try:
        assert inbox.handled(ids) == set(ids)
    finally:
        inbox.close()
    assert leftover(memory_broker) == []
