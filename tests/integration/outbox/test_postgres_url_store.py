"""The PostgreSQL outbox by URL on a real primary + synchronous standby
(``msgsafe cluster``'s postgres pair): libpq's host list with
``target_session_attrs=read-write``, credentials never shown or stored, idempotent puts,
and a COMMIT whose answer is lost on the wire, or whose wait for the paused standby an
operator stopped, reported STORED only once the standby holds it, and never stored
twice."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

import msgsafe
from msgsafe import Status
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.message import Envelope
from msgsafe.outbox import PostgresOutbox
from msgsafe.testing import MemoryBroker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def table() -> str:
    return f"fleet_{uuid.uuid4().hex[:10]}"


def _ids(url: str, table: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY seq").fetchall()]


def test_a_producer_stores_through_the_url_on_the_primary_whatever_the_host_order(
    pg_pair: PostgresCluster, table: str, memory_broker: MemoryBroker
) -> None:
    memory_broker.refuse_writes("down for the test")
    # The standby first: libpq passes over it (read-only) to the primary.
    hosts = ",".join(f"127.0.0.1:{p}" for p in reversed(pg_pair.ports))
    url = f"postgresql://msgsafe:{pg_pair.password}@{hosts}/msgsafe?table={table}"
    producer = msgsafe.Producer(
        f"memory://{memory_broker.name}", outbox=url, send_timeout=10, forward=False
    )
    try:
        receipts = [producer.send("q", b"m%d" % i, key=f"k{i % 3}") for i in range(20)]
        assert {r.status for r in receipts} == {Status.STORED}
        store = producer.outbox
        assert isinstance(store, PostgresOutbox)
        shown = f"{store!r} {store.redacted} {producer!r}"
        # The pair's password is "msgsafe", as its user and database: look for it as one.
        assert f":{pg_pair.password}@" not in shown and "password" not in shown
        assert store.redacted.startswith("postgresql://msgsafe@127.0.0.1:"), store.redacted
        assert store.table == table and store.pending() == 20
    finally:
        producer.close(5)
    assert _ids(pg_pair.url, table) == [r.message_id for r in receipts]
    with psycopg.connect(pg_pair.url) as conn:
        stored = conn.execute(f"SELECT string_agg(t::text, ' ') FROM {table} AS t").fetchone()
    assert stored is not None and "msgsafe:msgsafe" not in str(stored[0])


def test_a_put_of_the_same_ids_again_stores_each_once(pg_pair: PostgresCluster, table: str) -> None:
    store = PostgresOutbox.from_url(f"{pg_pair.url}&table={table}")
    try:
        envelopes = [Envelope.build("q", b"%d" % i, key="k") for i in range(50)]
        store.put(envelopes)
        store.put(envelopes[10:30])
        assert store.pending() == 50
        assert _ids(pg_pair.url, table) == [e.message_id for e in envelopes]
    finally:
        store.close()


class _LostCommit(PostgresOutbox):
    """The first COMMIT never reaches the server: the socket is shut before it is sent."""

    lost = 0

    def _commit(self, conn: psycopg.Connection[object]) -> None:  # type: ignore[override]
        import socket

        if self.lost == 0:
            self.lost += 1
            socket.socket(fileno=conn.pgconn.socket).shutdown(socket.SHUT_RDWR)
        conn.execute("COMMIT")


def test_a_commit_that_never_arrived_is_put_again_once(
    pg_pair: PostgresCluster, table: str
) -> None:
    store = _LostCommit(pg_pair.url, table=table)
    try:
        envelopes = [Envelope.build("q", b"%d" % i, key="k") for i in range(10)]
        store.put(envelopes[:5])  # its COMMIT is lost: aborted, so put again
        store.put(envelopes[5:])
        assert store.lost == 1
    finally:
        store.close()
    assert _ids(pg_pair.url, table) == [e.message_id for e in envelopes]


@pytest.mark.parametrize("stop_the_wait", ["pg_terminate_backend", "pg_cancel_backend"])
def test_a_commit_whose_standby_wait_is_stopped_is_not_stored_until_the_standby_has_it(
    pg_pair: PostgresCluster, table: str, stop_the_wait: str
) -> None:
    """The standby is paused: the primary commits locally and waits for it. An operator
    stops that wait (terminate: the client loses COMMIT's answer; cancel: COMMIT answers
    success with a WARNING): the rows are on the primary alone, and a fail-over now would
    lose them. The put must not return: it puts the rows again (no row twice) and that
    COMMIT waits for the standby; once the standby is back the put returns, and the
    standby holds every row."""
    store = PostgresOutbox.from_url(f"{pg_pair.url}&table={table}&write_timeout=60")
    envelopes = [Envelope.build("q", b"%d" % i, key="k") for i in range(5)]
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def put() -> None:
        outcome.append(_put(store, envelopes))
        done.set()

    pg_pair.pause(1)
    try:
        worker = threading.Thread(target=put)
        worker.start()
        admin = psycopg.connect(pg_pair.node_url(0), autocommit=True)
        try:
            # A transaction, not a backend: after a cancel the same backend commits again.
            stopped: set[tuple[int, str]] = set()

            def waiting_for_the_standby() -> list[tuple[int, str]]:
                rows = admin.execute(
                    "SELECT pid, backend_xid::text FROM pg_stat_activity"
                    " WHERE wait_event = 'SyncRep'"
                ).fetchall()
                return [(r[0], r[1]) for r in rows if (r[0], r[1]) not in stopped]

            wait_until(
                lambda: bool(waiting_for_the_standby()),
                20,
                "the put's COMMIT to wait for the paused standby",
            )
            first = waiting_for_the_standby()
            for pid, xid in first:
                admin.execute(f"SELECT {stop_the_wait}(%s)", (pid,))
                stopped.add((pid, xid))
            # The put commits again, and that COMMIT waits for the standby too.
            wait_until(
                lambda: bool(waiting_for_the_standby()) or done.is_set(),
                20,
                "the put's second COMMIT to wait for the paused standby",
            )
            assert not done.is_set(), (
                f"the put returned {outcome} while only the primary held its rows"
            )
        finally:
            admin.close()
        pg_pair.resume(1)
        worker.join(60)
        assert outcome == [None], outcome
    finally:
        pg_pair.resume(1)
        store.close()
    assert _ids(pg_pair.url, table) == [e.message_id for e in envelopes]
    standby = pg_pair.node_url(1)
    wait_until(
        lambda: _ids(standby, table) == [e.message_id for e in envelopes],
        20,
        "the standby to show every row (replayed after its flush)",
    )


def _put(store: PostgresOutbox, envelopes: list[Envelope]) -> BaseException | None:
    try:
        store.put(envelopes)
    except BaseException as exc:  # reported to the test thread
        return exc
    return None
