"""A fleet on one PostgreSQL outbox (the real primary + synchronous standby pair) and a
real RabbitMQ cluster, counted: every id sent, receipted (STORED) and received.

4 producer processes store while their broker is unreachable (one is SIGKILLed while
storing); then 3 ``msgsafe outbox forward`` processes drain the shared table to
RabbitMQ (one is SIGKILLed while forwarding, its key leases taken over), the others are
stopped with SIGTERM once the table is empty. Lost 0, every received id a known one,
per-key order by first arrival.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from msgsafe.cluster._process import free_ports
from msgsafe.cluster.postgres import PostgresCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.integration.outbox._fleet_producer import record_line, rows_waiting
from tests.support.commands import ROOT
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

PRODUCERS = 4
KEYS_EACH = 16  # 64 keys in all
COUNT = 1200


@dataclass
class Child:
    """A child process whose stdout lines are read by a thread into ``lines``."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read(self, on_line: object = None) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if callable(on_line):
                on_line(line.rstrip("\n"))


def _spawn(args: list[str], on_line: object = None) -> Child:
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    child = Child(proc)
    threading.Thread(target=child.read, args=(on_line,), daemon=True).start()
    return child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait(10)


def test_four_producers_three_forwarders_one_of_each_killed(
    pg_pair: PostgresCluster, rabbit_urls: RabbitUrls, children: list[Child]
) -> None:
    table = f"fleet_{uuid.uuid4().hex[:8]}"
    queue = f"fleet-{uuid.uuid4().hex[:8]}"
    store = f"{pg_pair.url}&table={table}"
    dead = f"amqp://127.0.0.1:{free_ports(1)[0]}/"
    ledger = Ledger()
    stored_by: dict[str, int] = {}

    def on_line(name: str) -> object:
        def record(line: str) -> None:
            if record_line(ledger, line):
                stored_by[name] = stored_by.get(name, 0) + 1

        return record

    producer_args = ["-m", "tests.integration.outbox._fleet_producer", store, dead, queue]
    for n in range(PRODUCERS):
        name = f"p{n}"
        children.append(_spawn([*producer_args, name, str(KEYS_EACH), str(COUNT)], on_line(name)))
    producers = list(children)
    victim = producers[-1]
    wait_until(lambda: stored_by.get("p3", 0) >= 200, 120, "p3 to store 200 messages")
    victim.proc.kill()
    victim.proc.wait(10)
    for child in producers[:-1]:
        assert child.proc.wait(300) == 0, child.lines[-3:]
    stored = len(ledger.receipted)
    print(f"[fleet] stored {stored} ({stored_by}); p3 killed at {stored_by.get('p3')}")
    assert rows_waiting(pg_pair.url, table) >= stored

    forward = [
        "-m",
        "msgsafe",
        "outbox",
        "forward",
        store,
        "--url",
        rabbit_urls.cluster,
        "-o",
        "declare=quorum",
        "--json",
        "--interval",
        "0.5",
    ]
    forwarders = [_spawn(forward) for _ in range(3)]
    children.extend(forwarders)
    before = rows_waiting(pg_pair.url, table)
    wait_until(
        lambda: rows_waiting(pg_pair.url, table) < before * 2 // 3,
        120,
        "a third of the table forwarded",
    )
    forwarders[0].proc.kill()
    killed_at = time.monotonic()
    forwarders[0].proc.wait(10)
    wait_until(
        lambda: rows_waiting(pg_pair.url, table) == 0,
        180,
        "the shared table to be drained by the two forwarders left",
        diagnose=lambda: "\n".join(forwarders[1].lines[-3:] + forwarders[2].lines[-3:]),
    )
    drained_s = time.monotonic() - killed_at
    for child in forwarders[1:]:
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(60) == 0
        assert '"stopped_by": "signal"' in "\n".join(child.lines), child.lines[-12:]

    arrivals = receive_receipted(rabbit_urls.cluster, queue, ledger)
    report = ledger.report("pg fleet")
    print(f"{report} drained_after_kill_s={drained_s:.1f}")
    assert not ledger.lost, report
    assert not ledger.unknown, report
    assert ledger.order_violations(arrivals) == []
    assert len(ledger.receipted) >= 3 * COUNT + 200
