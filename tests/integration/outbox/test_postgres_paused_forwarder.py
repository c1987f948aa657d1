"""A forwarder paused past its lease, on the real PostgreSQL pair and a real RabbitMQ
cluster (quorum queue), counted: every id sent, receipted (STORED) and received.

3 producer processes store 3,000 keyed messages while their broker is unreachable; one
``msgsafe outbox forward`` process (A) forwards the shared table, with a 2 s lease, and
is SIGSTOPped while it holds a claim. Two more forwarders start and take A's keys over
once its lease has run out (polled: a row A held carries a newer claim's epoch); then A
gets SIGCONT. A must learn that its claim was lost before it sends or settles more of it
(one WARNING, "lease lost"), and go on forwarding with the others until the table is
empty.

Order, as a consumer sees it: for each key, the first copies of its messages arrive in
the order they were stored (:meth:`Ledger.order_violations`). Duplicates carry known ids
(``unknown`` is empty); they are counted, and those of A's stale claim told apart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg.rows import TupleRow

from msgsafe.cluster._process import free_ports
from msgsafe.cluster.postgres import PostgresCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.integration.outbox._fleet_producer import record_line, rows_waiting
from tests.support.commands import ROOT
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

PRODUCERS = 3
KEYS_EACH = 8  # 24 keys in all
COUNT = 1000
LEASE_S = 2.0
LOST = "outbox lease lost"


@dataclass
class Child:
    """A child process whose stdout and stderr lines are read by threads."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _spawn(args: list[str], on_line: object = None) -> Child:
    env = dict(os.environ, MSGSAFE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = Child(proc)

    def read(stream: object, into: list[str], call: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))
            if callable(call):
                call(line.rstrip("\n"))

    threading.Thread(target=read, args=(proc.stdout, child.lines, on_line), daemon=True).start()
    threading.Thread(target=read, args=(proc.stderr, child.errors, None), daemon=True).start()
    return child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGCONT)
            child.proc.kill()
        child.proc.wait(10)


def _leased(conn: psycopg.Connection[TupleRow], table: str) -> dict[str, int]:
    """Rows whose lease runs (ready_at ahead of the server's clock): id -> epoch."""
    rows = conn.execute(
        f"SELECT id, lease_epoch FROM {table} WHERE ready_at > extract(epoch from now())"
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def rows_waiting_on(conn: psycopg.Connection[TupleRow], table: str) -> int:
    """The rows in ``table`` (waiting or leased), asked on an open connection."""
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row is not None else 0


def _epochs(url: str, table: str, ids: list[str]) -> dict[str, int]:
    """The epoch of each row of ``ids`` still in the table."""
    with psycopg.connect(url, connect_timeout=5) as conn:
        rows = conn.execute(
            f"SELECT id, lease_epoch FROM {table} WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def test_a_forwarder_paused_past_its_lease_learns_it_lost_its_claim(
    pg_pair: PostgresCluster, rabbit_urls: RabbitUrls, children: list[Child]
) -> None:
    table = f"paused_{uuid.uuid4().hex[:8]}"
    queue = f"paused-{uuid.uuid4().hex[:8]}"
    store = f"{pg_pair.url}&table={table}&lease={LEASE_S:g}"
    dead = f"amqp://127.0.0.1:{free_ports(1)[0]}/"
    ledger = Ledger()
    started = time.monotonic()

    producer_args = ["-m", "tests.integration.outbox._fleet_producer", store, dead, queue]
    producers = [
        _spawn(
            [*producer_args, f"p{n}", str(KEYS_EACH), str(COUNT)],
            lambda line: record_line(ledger, line),
        )
        for n in range(PRODUCERS)
    ]
    children.extend(producers)
    for child in producers:
        assert child.proc.wait(120) == 0, child.lines[-3:] + child.errors[-3:]
    stored = len(ledger.receipted)
    assert stored == PRODUCERS * COUNT
    assert rows_waiting(pg_pair.url, table) == stored
    stored_s = time.monotonic() - started

    forward = [
        "-m", "msgsafe", "outbox", "forward", store, "--url", rabbit_urls.cluster,
        "-o", "declare=quorum", "--json", "--interval", "0.5",
    ]  # fmt: skip
    a = _spawn(forward)
    children.append(a)

    # A forwards alone until it is stopped holding a claim: the test watches (on one
    # open connection, a poll a millisecond) for a running lease, stops A at once, and
    # looks again; a lease that ended in between holds nothing, so A goes on.
    # NOTE: watching, not stepping: stopping A after every 50 rows it forwarded (polls
    # of a new connection each) caught it between claims four times running under a
    # load of 10, by which time it had forwarded all 3,000 rows.
    stale: dict[str, int] = {}
    attempts = 0
    with psycopg.connect(pg_pair.url, connect_timeout=5, autocommit=True) as watch:

        def a_holds_a_lease() -> bool:
            waiting = rows_waiting_on(watch, table)
            assert waiting, (
                f"forwarder A forwarded every row before a stop caught a claim ({attempts} tries)"
            )
            return bool(_leased(watch, table))

        while not stale and attempts < 50:
            wait_until(
                a_holds_a_lease,
                60,
                "forwarder A to hold a claim",
                interval=0.001,
                diagnose=lambda: "\n".join(a.lines[-3:] + a.errors[-5:]),
            )
            a.proc.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            attempts += 1
            stale = _leased(watch, table)
            if not stale:
                a.proc.send_signal(signal.SIGCONT)
    assert stale, "forwarder A was never stopped while holding a claim"
    newest = max(stale.values())
    waiting_at_stop = rows_waiting(pg_pair.url, table)

    others = [_spawn(forward) for _ in range(2)]
    children.extend(others)

    def taken_over() -> bool:
        # A row of A's claim under a newer epoch, or gone: only a forwarder that claimed
        # it can have deleted it (a delete is fenced by the deleter's own epoch).
        epochs = _epochs(pg_pair.url, table, list(stale))
        return len(epochs) < len(stale) or any(epoch > newest for epoch in epochs.values())

    wait_until(
        taken_over,
        LEASE_S + 60,
        "another forwarder to claim a row of A's claim after A's lease ran out",
        diagnose=lambda: "\n".join(others[0].lines[-3:] + others[0].errors[-5:]),
    )
    # The fault's length, not a wait for anything: the pause outlasts the lease whole.
    wait_until(lambda: time.monotonic() - stopped_at > LEASE_S + 0.2, LEASE_S + 1, "the pause")
    paused_s = time.monotonic() - stopped_at
    a.proc.send_signal(signal.SIGCONT)

    wait_until(
        lambda: any(LOST in line for line in a.errors),
        30,
        "forwarder A to log that it lost its lease",
        diagnose=lambda: "\n".join(a.lines[-3:] + a.errors[-5:]),
    )
    wait_until(
        lambda: rows_waiting(pg_pair.url, table) == 0,
        60,
        "the shared table to be drained by the three forwarders",
        diagnose=lambda: "\n".join(a.lines[-2:] + others[0].lines[-2:] + a.errors[-5:]),
    )
    for child in (a, *others):
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(60) == 0, child.errors[-5:]
    warnings = [line for line in a.errors if line.startswith("WARNING")]
    a_done = [line for line in a.lines if '"event": "done"' in line]

    arrivals = receive_receipted(rabbit_urls.cluster, queue, ledger)
    report = ledger.report("paused forwarder")
    copies = {mid: n for mid, n in ledger.received.items() if n > 1}
    of_stale = sum(n - 1 for mid, n in copies.items() if mid in stale)
    print(
        f"{report} stored_s={stored_s:.1f} stop_attempts={attempts} "
        f"stale_claim={len(stale)} waiting_at_stop={waiting_at_stop} paused_s={paused_s:.1f} "
        f"duplicates_of_stale_claim={of_stale} other_duplicates={ledger.duplicates - of_stale} "
        f"test_s={time.monotonic() - started:.1f}"
    )
    print("A:", *warnings, *a_done, sep="\n  ")
    assert not ledger.lost, report
    assert not ledger.unknown, report
    assert ledger.order_violations(arrivals) == []
    # A said it once, for the claim it held when it was stopped, and nothing else went
    # wrong for it.
    assert len(warnings) == 1 and LOST in warnings[0], warnings
