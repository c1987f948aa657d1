"""Many keys on one shared PostgreSQL outbox (the real primary + synchronous standby pair),
forwarded by three ``msgsafe outbox forward`` processes to a real RabbitMQ cluster,
counted: every id put, received, per-key order by first arrival.

The keys have one or two messages each; the second message of a key is put after every
key's first one, so a key's two rows lie far apart in the table and a claim's keys never
fill it from their own rows. Before the drain, the claim's queries are explained on the
full table: a claim reads a bounded number of pages, not the table.

The suite runs 15,000 keys (22,500 messages); ``MSGSAFE_MANY_KEYS=100000`` runs the
full size (its figures are in benchmarks/README.md, "PostgreSQL outbox at scale").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import pytest

from msgsafe import Status
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.message import Envelope
from msgsafe.message_ids import new_message_id
from msgsafe.outbox.postgres import PostgresOutbox
from tests.fixtures.rabbitmq import RabbitUrls
from tests.integration.outbox._fleet_producer import rows_waiting
from tests.support.commands import ROOT
from tests.support.ledger import Ledger, receive_receipted

pytestmark = pytest.mark.integration

KEYS = int(os.environ.get("MSGSAFE_MANY_KEYS", "15000"))
FORWARDERS = 3
#: Pages a claim may read on the full table (a table scan reads thousands).
CLAIM_PAGES = 1500


def _fill(store: PostgresOutbox, queue: str, ledger: Ledger) -> None:
    """Message 0 of every key, then message 1 of every other key, 1000 per put."""
    batch: list[Envelope] = []

    def flush() -> None:
        store.put(batch)
        for env in batch:
            ledger.add_receipt(env.message_id, Status.STORED)
        batch.clear()

    for n, keys in ((0, range(KEYS)), (1, range(0, KEYS, 2))):
        for k in keys:
            message_id = new_message_id()
            ledger.add_sent(message_id)
            with ledger.lock:
                ledger.positions[message_id] = (f"k{k}", n)
            batch.append(Envelope.build(queue, b"m", key=f"k{k}", message_id=message_id))
            if len(batch) == 1000:
                flush()
    if batch:
        flush()


def _pages(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> int:
    """Shared buffers ``sql`` touched, as EXPLAIN (ANALYZE, BUFFERS) counts them (rolled
    back: the claim's leases are not kept)."""
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
    conn.rollback()
    assert row is not None
    top = row[0][0]["Plan"]
    return sum(int(top.get(f"Shared {k} Blocks", 0)) for k in ("Hit", "Read"))


def test_many_keys_three_forwarders_keep_every_key_in_order(
    pg_pair: PostgresCluster, rabbit_urls: RabbitUrls
) -> None:
    table = f"keys_{uuid.uuid4().hex[:8]}"
    queue = f"many-keys-{uuid.uuid4().hex[:8]}"
    url = f"{pg_pair.url}&table={table}"
    ledger = Ledger()
    store = PostgresOutbox.from_url(url, target=rabbit_urls.cluster)
    started = time.monotonic()
    try:
        _fill(store, queue, ledger)
        sql, conninfo = store._sql, store._conninfo
    finally:
        store.close()
    put = len(ledger.receipted)
    assert put == KEYS + (KEYS + 1) // 2
    with psycopg.connect(conninfo) as conn:
        conn.execute(f"ANALYZE {table}")
        conn.commit()
        table_pages = int(
            (conn.execute(f"SELECT pg_relation_size('{table}') / 8192").fetchone() or (0,))[0]
        )
        now = time.time()
        keys = [
            bytes(r[0])
            for r in conn.execute(sql["keys"], {"now": now, "scan": 10_000, "keys": 16, "after": 0})
        ]
        conn.rollback()
        claim = {"now": now, "until": now + 10, "limit": 1000}
        read = {
            "keys": _pages(conn, sql["keys"], {"now": now, "scan": 10_000, "keys": 16, "after": 0}),
            "claim": _pages(conn, sql["claim_keys"], {**claim, "keys": keys, "per_key": 63}),
            "claim, no key": _pages(conn, sql["claim_keys"], {**claim, "keys": [], "per_key": 1}),
        }
    print(f"[many keys] {KEYS} keys, {put} messages, table {table_pages} pages; claim reads {read}")
    assert len(keys) == 16
    assert all(pages < CLAIM_PAGES for pages in read.values()), (read, table_pages)

    forward = [
        sys.executable,
        "-m",
        "msgsafe",
        "outbox",
        "forward",
        url,
        "--url",
        rabbit_urls.cluster,
        "-o",
        "declare=quorum",
        "--until-empty",
        "--json",
    ]
    drain_started = time.monotonic()
    procs = [
        subprocess.Popen(forward, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for _ in range(FORWARDERS)
    ]
    try:
        outputs = [p.communicate(timeout=60 + KEYS / 100)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    drained_s = time.monotonic() - drain_started
    assert [p.returncode for p in procs] == [0] * FORWARDERS, outputs
    delivered = [
        json.loads(line).get("delivered", 0)
        for out in outputs
        for line in out.splitlines()[-1:]
        if line.startswith("{")
    ]
    assert rows_waiting(pg_pair.url, table) == 0

    arrivals = receive_receipted(
        rabbit_urls.cluster, queue, ledger, prefetch=2000, deadline_s=60 + KEYS / 500
    )
    report = ledger.report("pg many keys")
    print(
        f"{report} forwarders={FORWARDERS} delivered_each={delivered} "
        f"drained_s={drained_s:.1f} rate={put / drained_s:,.0f}/s "
        f"total_s={time.monotonic() - started:.1f}"
    )
    assert not ledger.lost, report
    assert not ledger.unknown, report
    assert ledger.order_violations(arrivals) == []
    assert len(set(arrivals)) == put


def test_stats_count_up_to_100000_rows_and_estimate_beyond(pg_pair: PostgresCluster) -> None:
    table = f"big_{uuid.uuid4().hex[:8]}"
    store = PostgresOutbox.from_url(f"{pg_pair.url}&table={table}", target="amqp://h/")
    try:
        store.put([Envelope.build("q", b"first", key="k", message_id="first")])
        first = store.stats().bytes
        with psycopg.connect(store._conninfo, autocommit=True) as conn:

            def add(n: int, start: int) -> None:
                conn.execute(
                    f"INSERT INTO {table} (id, target, destination, key, body, created_at, size)"
                    " SELECT 'm' || i, 'amqp://h/', 'q', NULL, '\\x00'::bytea, 0, 1"
                    " FROM generate_series(%s, %s) AS i",
                    (start, start + n - 1),
                )

            add(99_999, 1)  # 100,000 rows with the first
            exact = store.stats()
            assert (exact.depth, exact.bytes, exact.estimated) == (100_000, first + 99_999, False)
            assert store.pending() == 100_000
            add(50_000, 100_000)
            conn.execute(f"ANALYZE {table}")
            big = store.stats()
            assert big.estimated
            # The server's estimate, at least the rows counted.
            assert 100_001 <= big.depth <= 200_000, big
            assert 100_001 <= store.pending() <= 200_000
            assert big.oldest_age_s is not None
    finally:
        store.close()
