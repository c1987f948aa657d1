"""Fail-overs of a PostgreSQL outbox under traffic, on the real primary + synchronous
standby pair, counted: every id sent, receipted and received (lost 0, duplicates only of
known ids, per-key order by first arrival).

- the primary SIGKILLed while producers store, the standby promoted: sends keep going,
  STORED only for commits known to have happened;
- the primary SIGKILLed and restarted while producers store;
- a ``msgsafe outbox forward`` SIGKILLed while it holds key leases (its broker slowed by
  a fault proxy, so that its rounds are in flight when it dies): another forwarder takes
  its keys over once their leases run out, within the bound docs/fleet.md states
  (``lease_s`` plus its 1 s poll), measured.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from msgsafe import Producer, Status
from msgsafe.cluster._process import tail
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.message import Envelope
from msgsafe.message_ids import new_message_id
from msgsafe.outbox import PostgresOutbox
from msgsafe.testing import MemoryBroker
from msgsafe.testing.faultproxy import FaultProxy
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import ROOT
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SENDERS = 4
#: The store's lease (its default; docs/fleet.md's bound is this plus the 1 s poll).
LEASE_S = 10.0
#: What a loaded 2-core machine may add to that bound (a claim's own transaction, the
#: poll's phase, the test's polling).
SLACK_S = 5.0


def _ids(url: str, table: str) -> set[str]:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return {r[0] for r in conn.execute(f"SELECT id FROM {table}").fetchall()}


class Senders:
    """``SENDERS`` threads sending through ``producer`` until :meth:`stop`, each on keys
    of its own (``s<n>-<k>``), every id recorded in ``ledger`` before its send."""

    def __init__(self, producer: Producer, ledger: Ledger, queue: str) -> None:
        self.producer = producer
        self.ledger = ledger
        self.queue = queue
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(SENDERS)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, n: int) -> None:
        positions = [0] * 4
        i = 0
        while not self.stopping.is_set():
            k = i % 4
            key = f"s{n}-{k}"
            message_id = new_message_id()
            self.ledger.add_sent(message_id)
            with self.ledger.lock:
                self.ledger.positions[message_id] = (key, positions[k])
            positions[k] += 1
            i += 1
            try:
                receipt = self.producer.send(self.queue, b"x", key=key, message_id=message_id)
            except Exception as exc:  # counted: a send that raised promised nothing
                self.ledger.add_failure(message_id, exc)
                self.errors.append(exc)
                continue
            self.ledger.add_receipt(message_id, receipt.status)

    def stored(self) -> int:
        with self.ledger.lock:
            return len(self.ledger.receipted)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(120)
            assert not thread.is_alive(), "a sender is stuck"


def _print_logs(pair: PostgresCluster) -> None:
    """Each node's last log lines, for a failed test's report (the pair's directory goes
    with the session)."""
    for node, name in enumerate(pair.names):
        print(f"--- {name}'s log, last lines\n{tail(pair.log_path(node), 60)}")


def _store_under_fault(
    pair: PostgresCluster, memory_broker: MemoryBroker, fault: Callable[[], None], name: str
) -> None:
    """Senders store (the broker refuses) while ``fault`` runs; then the broker is back and
    the outbox drained: the ledger counted."""
    memory_broker.refuse_writes("down for the test")
    table = f"fo_{uuid.uuid4().hex[:10]}"
    # A put keeps trying through the fault for as long as a send may wait: a restart
    # on a loaded machine can take longer than the store's default (30 s).
    url = f"{pair.url}&table={table}&write_timeout=110"
    queue = "orders"
    ledger = Ledger()
    producer = Producer(
        f"memory://{memory_broker.name}", outbox=url, send_timeout=120, forward=False
    )
    try:
        senders = Senders(producer, ledger, queue)
        try:
            wait_until(lambda: senders.stored() >= 200, 120, "200 messages stored")
            before = senders.stored()
            started = time.monotonic()
            fault()
            fault_s = time.monotonic() - started
            after = senders.stored()
            wait_until(
                lambda: senders.stored() >= after + 200,
                120,
                "200 more messages stored after the fault",
            )
        finally:
            senders.stop()
        if senders.errors:
            _print_logs(pair)
        assert senders.errors == [], senders.errors[:3]
        print(f"[{name}] stored {before} before, {after} by the end of the fault ({fault_s:.1f} s)")
        # STORED only for a known commit: every one is on the server now primary.
        missing = ledger.receipted - _ids(pair.url, table)
        assert not missing, f"{len(missing)} STORED ids are not in the table"
        memory_broker.accept_writes()
        assert producer.drain(180) == 0
    finally:
        producer.close(10)
    for message_id in memory_broker.ids(queue):
        ledger.add_received(message_id)
    report = ledger.report(name)
    print(report)
    assert ledger.statuses[Status.STORED.value] == len(ledger.receipted) == len(ledger.sent)
    assert not ledger.lost and not ledger.unknown, report
    assert ledger.order_violations(memory_broker.ids(queue)) == []


def test_the_primary_killed_under_sends_and_the_standby_promoted(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker
) -> None:
    def fail_over() -> None:
        pg_pair.kill(0)
        pg_pair.promote(1)

    _store_under_fault(pg_pair, memory_broker, fail_over, "pg promote")
    assert [n.role for n in pg_pair.nodes()][1] == "primary"


def test_the_primary_restarted_under_sends(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker
) -> None:
    def crash_and_restart() -> None:
        pg_pair.kill(0)
        pg_pair.restart(0)

    _store_under_fault(pg_pair, memory_broker, crash_and_restart, "pg restart")


def test_what_a_send_asks_the_store_waits_through_a_restart(pg_pair: PostgresCluster) -> None:
    """The per-key barrier's ``has_key``, the ``max_rows`` count and ``stats`` asked
    while the primary is down: answered once it is back, not an error (they raised
    ``OutboxError`` at once, and a keyed send with them, while puts rode it out)."""
    table = f"ask_{uuid.uuid4().hex[:10]}"
    store = PostgresOutbox.from_url(f"{pg_pair.url}&table={table}&write_timeout=110")
    answers: dict[str, object] = {}
    try:
        store.put([Envelope.build("q", b"x", key="k")])
        pg_pair.kill(0)

        def ask() -> None:
            try:
                answers["has_key"] = store.has_key(b"k")
                answers["pending"] = store.pending()
                answers["depth"] = store.stats().depth
            except Exception as exc:  # counted: the test fails with it
                answers["error"] = exc

        asking = threading.Thread(target=ask)
        asking.start()
        pg_pair.restart(0)
        asking.join(120)
        assert not asking.is_alive()
    finally:
        store.close()
    assert answers == {"has_key": True, "pending": 1, "depth": 1}


# --- a forwarder killed while it holds key leases -----------------------------------------


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for child in made:
        if child.poll() is None:
            child.kill()
        child.wait(10)


def _forwarder(store: str, broker: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "msgsafe",
            "outbox",
            "forward",
            store,
            "--url",
            broker,
            "-o",
            "declare=quorum",
            "--json",
            "--interval",
            "0.5",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _leases(url: str, table: str) -> dict[str, tuple[bytes, int, float]]:
    """Rows leased now: id -> (key, attempts, ready_at)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        rows = conn.execute(
            f"SELECT id, key, attempts, ready_at FROM {table} WHERE ready_at > %s",
            (time.time(),),
        ).fetchall()
    return {r[0]: (bytes(r[1]), int(r[2]), float(r[3])) for r in rows}


def _taken_over(url: str, table: str, held: dict[str, tuple[bytes, int, float]]) -> int:
    """How many of ``held`` rows another forwarder has claimed again (or delivered)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        rows = conn.execute(
            f"SELECT id, attempts FROM {table} WHERE id = ANY(%s)", (list(held),)
        ).fetchall()
    now = {r[0]: int(r[1]) for r in rows}
    return sum(1 for i, (_, attempts, _) in held.items() if now.get(i, attempts + 1) > attempts)


def test_a_forwarder_killed_holding_leases_is_taken_over_within_the_bound(
    pg_pair: PostgresCluster,
    rabbit_urls: RabbitUrls,
    children: list[subprocess.Popen[str]],
) -> None:
    table = f"fo_{uuid.uuid4().hex[:10]}"
    queue = f"takeover-{uuid.uuid4().hex[:8]}"
    store_url = f"{pg_pair.url}&table={table}&lease={LEASE_S:g}"
    ledger = Ledger()
    store = PostgresOutbox.from_url(store_url, target=rabbit_urls.amqp[0])
    try:
        envelopes = [Envelope.build(queue, b"x" * 200, key=f"k{i % 64}") for i in range(64 * 40)]
        for start in range(0, len(envelopes), 500):
            store.put(envelopes[start : start + 500])
    finally:
        store.close()
    for i, env in enumerate(envelopes):
        ledger.add_sent(env.message_id)
        ledger.add_receipt(env.message_id, Status.STORED)
        ledger.positions[env.message_id] = (f"k{i % 64}", i // 64)

    node = urlsplit(rabbit_urls.amqp[0])
    assert node.hostname is not None and node.port is not None
    with FaultProxy(node.hostname, node.port) as proxy:
        # Every chunk each way 0.3 s late: a round waits seconds for its confirms.
        proxy.latency(0.3)
        slowed = rabbit_urls.amqp[0].replace(f":{node.port}", f":{proxy.port}", 1)
        first = _forwarder(store_url, slowed)
        children.append(first)
        held: dict[str, tuple[bytes, int, float]] = {}

        def holding() -> bool:
            held.update(_leases(pg_pair.url, table))
            return bool(held) and first.poll() is None

        wait_until(holding, 120, "the slowed forwarder to hold key leases")
        first.kill()
        first.wait(10)
        killed_at = time.time()
        # Only what it held at its death: rows it held and delivered earlier are gone.
        held = {i: v for i, v in _leases(pg_pair.url, table).items() if i in held}
        assert held, "the forwarder died between two rounds: nothing to take over"
        keys = {key for key, _, _ in held.values()}
        expires = [until for _, _, until in held.values()]
        print(
            f"[takeover] killed holding {len(held)} rows of {len(keys)} keys, leases "
            f"{min(expires) - killed_at:.1f}-{max(expires) - killed_at:.1f} s from expiry"
        )
        second = _forwarder(store_url, rabbit_urls.amqp[1])
        children.append(second)
        first_taken = wait_until(
            lambda: _taken_over(pg_pair.url, table, held) > 0, 120, "a held key taken over"
        )
        first_at = time.time()
        wait_until(
            lambda: _taken_over(pg_pair.url, table, held) == len(held),
            120,
            "every held key taken over",
        )
        all_at = time.time()
        print(
            f"[takeover] first held row taken over {first_at - killed_at:.1f} s after the "
            f"kill ({first_taken:.1f} s of polling), all {all_at - killed_at:.1f} s after; "
            f"last lease ran out {max(expires) - killed_at:.1f} s after the kill"
        )
        # The lease held: nobody took a key before its lease ran out ...
        assert first_at >= min(expires) - 0.5
        # ... and it was taken over within the bound: lease_s plus the 1 s poll.
        assert all_at - max(expires) <= 1.0 + SLACK_S
        assert all_at - killed_at <= LEASE_S + 1.0 + SLACK_S
        wait_until(lambda: not _ids(pg_pair.url, table), 180, "the table drained")
        second.terminate()
        assert second.wait(60) == 0
        out = second.stdout.read() if second.stdout is not None else ""
        assert '"stopped_by": "signal"' in out, out[-2000:]

    arrivals = receive_receipted(rabbit_urls.amqp[0], queue, ledger)
    report = ledger.report("takeover")
    print(report)
    assert not ledger.lost and not ledger.unknown, report
    assert ledger.order_violations(arrivals) == []
