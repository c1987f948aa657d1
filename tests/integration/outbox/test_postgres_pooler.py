"""The shared PostgreSQL outbox and inbox behind PgBouncer in transaction pooling mode
(Debian's ``pgbouncer``, started by ``msgsafe cluster up postgres --nodes 2 --pooler``,
stopped by ``msgsafe cluster down``), counted.

Three producer processes store 3,000 keyed messages each through the pooler while
their broker is unreachable; ``msgsafe outbox status`` reads the table through it; two
``msgsafe outbox forward`` processes drain it through it to RabbitMQ. Stored == sent,
lost 0, per-key order kept, and no process met a prepared statement error (psycopg
prepares a query after its fifth run; the pooler hands the next transaction another
server connection: before the store prepared nothing, two of three producers died after
about a thousand sends). The doctor reports the pooling it found; the inbox takes each
id once from four threads through the pooler.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from msgsafe.cluster import load
from msgsafe.cluster._process import free_ports, pid_alive
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.inbox import open_inbox
from msgsafe.message import Envelope
from msgsafe.outbox.postgres import PostgresOutbox
from tests.fixtures.rabbitmq import RabbitUrls
from tests.integration.outbox._fleet_producer import record_line, rows_waiting
from tests.support.commands import ROOT, msgsafe
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

PRODUCERS = 3
KEYS_EACH = 16  # 48 keys in all
COUNT = 3000
FORWARDERS = 2


@dataclass(frozen=True)
class Pooled:
    """The cluster ``cluster up --pooler`` started: its direct and its pooler URL."""

    dir: Path
    url: str
    pooler_url: str
    pooler_pid: int


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pooled]:
    """A primary, its synchronous standby and PgBouncer in front, through the CLI users
    get; ``cluster down`` afterwards must leave no PgBouncer running."""
    dir = tmp_path_factory.mktemp("pooled")
    up = msgsafe(
        *("cluster", "up", "postgres", "--nodes", "2", "--pooler"), "--dir", str(dir), "--json"
    )
    try:
        assert up.code == 0, up.stderr[-3000:]
        described = up.json()
        pooler = described["pooler"]
        assert pooler["mode"] == "transaction" and pooler["running"], pooler
        yield Pooled(dir, described["url"], pooler["url"], int(pooler["pid"]))
    finally:
        # --delete: the data too, wherever the cluster kept it (a temp dir's path comes
        # back in the next run; its data must not).
        found = load(dir) if (dir / "cluster.json").exists() else None
        data = found.data_root if isinstance(found, PostgresCluster) else None
        down = msgsafe("cluster", "down", "--delete", "--dir", str(dir))
    assert down.code == 0, down.stderr[-3000:]
    assert not dir.exists() and (data is None or not data.exists()), "down --delete kept data"
    if up.code == 0:
        assert not pid_alive(int(up.json()["pooler"]["pid"])), "pgbouncer outlived down"


@dataclass
class Child:
    """A child process: stdout lines read by a thread into ``lines``, stderr in a file."""

    proc: subprocess.Popen[str]
    errors: Path
    lines: list[str] = field(default_factory=list)

    def read(self, on_line: Callable[[str], None] | None) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            if on_line is not None:
                on_line(line)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    made: list[Child] = []

    def spawn(args: list[str], on_line: Callable[[str], None] | None = None) -> Child:
        errors = tmp_path / f"child-{len(made)}.err"
        with open(errors, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True
            )
        child = Child(proc, errors)
        threading.Thread(target=child.read, args=(on_line,), daemon=True).start()
        made.append(child)
        return child

    yield spawn
    for child in made:
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait(10)


def test_a_fleet_stores_and_drains_through_transaction_pooling(
    pooled: Pooled, rabbit_urls: RabbitUrls, children: Callable[..., Child]
) -> None:
    table = f"pooled_{uuid.uuid4().hex[:8]}"
    queue = f"pooled-{uuid.uuid4().hex[:8]}"
    store = f"{pooled.pooler_url}?table={table}"
    dead = f"amqp://127.0.0.1:{free_ports(1)[0]}/"
    ledger = Ledger()

    def record(line: str) -> None:
        record_line(ledger, line)

    producer = ["-m", "tests.integration.outbox._fleet_producer", store, dead, queue]
    producers = [
        children([*producer, f"p{n}", str(KEYS_EACH), str(COUNT)], record) for n in range(PRODUCERS)
    ]
    for child in producers:
        code = child.proc.wait(600)
        assert code == 0, child.errors.read_text()[-2000:]
    stored = len(ledger.receipted)
    print(f"[pooler] sent {len(ledger.sent)} stored {stored} through {pooled.pooler_url}")
    assert len(ledger.sent) == stored == PRODUCERS * COUNT
    assert rows_waiting(pooled.url, table) == stored

    # The outbox commands through the pooler; the store found the pooling.
    status = msgsafe("outbox", "status", store, "--json")
    assert status.code == 0, status.stderr[-2000:]
    assert status.json()["waiting"] == stored
    opened = PostgresOutbox.from_url(store)
    try:
        assert opened.pooling == "transaction"
        assert not opened.capabilities.notify  # LISTEN cannot work: forwarders poll
    finally:
        opened.close()

    forward = [
        *("-m", "msgsafe", "outbox", "forward", store, "--url", rabbit_urls.cluster),
        *("-o", "declare=quorum", "--json", "--interval", "0.5"),
    ]
    forwarders = [children(forward) for _ in range(FORWARDERS)]
    wait_until(
        lambda: rows_waiting(pooled.url, table) == 0,
        300,
        "the forwarders to drain the table through the pooler",
        diagnose=lambda: "\n".join(f.errors.read_text()[-500:] for f in forwarders),
    )
    for child in forwarders:
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(60) == 0, child.errors.read_text()[-2000:]
        assert '"stopped_by": "signal"' in "\n".join(child.lines), child.lines[-12:]

    arrivals = receive_receipted(rabbit_urls.cluster, queue, ledger)
    report = ledger.report("pg fleet through pgbouncer")
    print(report)
    for child in [*producers, *forwarders]:
        assert "prepared statement" not in child.errors.read_text()
        assert "prepared statement" not in "\n".join(child.lines)
    assert not ledger.lost, report
    assert not ledger.unknown, report
    assert ledger.order_violations(arrivals) == []


def test_doctor_reports_the_pooling_it_found(pooled: Pooled) -> None:
    found: dict[str, Any] = {}
    for name, url in (("pooler", pooled.pooler_url), ("direct", pooled.url)):
        # Why memory://: doctor needs a broker URL; only the outbox's findings are read.
        run = msgsafe("doctor", "memory://doctor", "--outbox", url, "--json")
        findings = run.json()["findings"]
        found[name] = [f["value"] for f in findings if f["setting"] == "pooling (heuristic)"]
        assert ":msgsafe@" not in run.stdout  # the password is never shown
    assert found == {"pooler": ["transaction"], "direct": ["direct"]}


def test_the_inbox_takes_each_id_once_through_the_pooler(pooled: Pooled) -> None:
    table = f"inbox_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pooled.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_effects (message_id text NOT NULL)")
    ids = [f"m{i}" for i in range(400)]
    failures: list[BaseException] = []

    def worker() -> None:
        inbox = open_inbox(f"{pooled.pooler_url}?table={table}")
        try:
            for message_id in ids:  # every thread offers every id: each runs once

                def work(tx: Any, message_id: str = message_id) -> None:
                    tx.execute(
                        f"INSERT INTO {table}_effects (message_id) VALUES (%s)", (message_id,)
                    )

                inbox.process(message_id, work, source="orders")
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)
        finally:
            inbox.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    with psycopg.connect(pooled.url) as conn:
        rows = [r[0] for r in conn.execute(f"SELECT message_id FROM {table}_effects").fetchall()]
    assert sorted(rows) == sorted(ids)


def test_the_pooler_follows_a_promoted_standby() -> None:
    """``promote`` re-points PgBouncer: a store that kept the pooler's URL writes to the
    new primary once the old one is dead."""
    with PostgresCluster(nodes=2, pooler=True) as pair:
        store = PostgresOutbox.from_url(f"{pair.pooler_url}?table=promoted", write_timeout=60)
        try:
            before = [Envelope.build("orders", b"b%d" % i, key="k") for i in range(10)]
            store.put(before)
            pair.kill(0)
            pair.promote(1)
            after = [Envelope.build("orders", b"a%d" % i, key="k") for i in range(10)]
            store.put(after)
            assert store.pooling == "transaction"
        finally:
            store.close()
        with psycopg.connect(pair.node_url(1)) as conn:
            rows = conn.execute("SELECT id FROM promoted ORDER BY seq").fetchall()
        assert [r[0] for r in rows] == [e.message_id for e in before + after]
