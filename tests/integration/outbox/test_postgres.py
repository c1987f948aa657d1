"""The transactional outbox on a real PostgreSQL server: rows written in the caller's
transaction are published if and only if that transaction commits."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from msgsafe.adapters import open_transport
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, PostgresOutbox
from msgsafe.ports import OutboxStore
from msgsafe.testing import MemoryBroker

pytestmark = pytest.mark.integration


@pytest.fixture
def table() -> str:
    return f"outbox_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(postgres_conninfo: str, table: str) -> Iterator[PostgresOutbox]:
    s = PostgresOutbox(postgres_conninfo, table=table, target="amqp://u:secret@h:5672/")
    yield s
    s.close()


def test_rollback_publishes_nothing_and_commit_publishes_exactly_its_messages(
    postgres_conninfo: str, store: PostgresOutbox, memory_broker: MemoryBroker
) -> None:
    from msgsafe import Producer

    # NOTE: a table of this test's own: the database is shared with the docs' and the
    # examples' blocks, whose "orders" tables have other columns.
    orders = f"orders_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_conninfo) as app:
        app.execute(f"CREATE TABLE {orders} (id serial PRIMARY KEY, item text)")
        app.commit()
    producer = Producer(f"memory://{memory_broker.name}", outbox=store)
    try:
        rolled_back: list[str] = []
        committed: list[str] = []
        with psycopg.connect(postgres_conninfo) as app:
            # A business transaction that fails: its messages must never be published.
            app.execute(f"INSERT INTO {orders} (item) VALUES ('lost')")
            for i in range(5):
                receipt = producer.send("orders", b"rb%d" % i, key="o1", transaction=app)
                rolled_back.append(receipt.message_id)
            app.rollback()
            # One that commits: exactly its messages are published, in order.
            app.execute(f"INSERT INTO {orders} (item) VALUES ('kept')")
            for i in range(7):
                receipt = producer.send("orders", b"ok%d" % i, key="o2", transaction=app)
                committed.append(receipt.message_id)
            app.commit()
        assert producer.drain(20) == 0
        got = memory_broker.ids("orders")
        print(
            f"rolled_back={len(rolled_back)} committed={len(committed)} "
            f"published={len(got)} lost={len(set(committed) - set(got))}"
        )
        assert got == committed
        assert not set(rolled_back) & set(got)
        assert store.stats().depth == 0
    finally:
        producer.close(10)
        with psycopg.connect(postgres_conninfo, autocommit=True) as app:
            app.execute(f"DROP TABLE IF EXISTS {orders}")


def test_transactional_sends_leave_no_key_barrier_behind(
    postgres_conninfo: str, store: PostgresOutbox, memory_broker: MemoryBroker
) -> None:
    """A transactional send of a key that already waits in the outbox must not hold that
    key's ordering barrier after the outbox drained: later sends go to the broker."""
    from msgsafe import Producer, Status

    memory_broker.refuse_writes()  # keep the committed rows in the outbox while we send more
    producer = Producer(f"memory://{memory_broker.name}", outbox=store)
    try:
        with psycopg.connect(postgres_conninfo) as app:
            first = producer.send("orders", b"t1", key="k", transaction=app)
            app.commit()
            assert store.has_key(b"k")
            second = producer.send("orders", b"t2", key="k", transaction=app)
            app.commit()
        memory_broker.accept_writes()
        assert producer.drain(20) == 0
        after = producer.send("orders", b"plain", key="k")
        assert after.status is Status.CONFIRMED
        assert memory_broker.ids("orders") == [
            first.message_id,
            second.message_id,
            after.message_id,
        ]
    finally:
        producer.close(10)


def test_store_protocol_on_postgres(
    postgres_conninfo: str, store: PostgresOutbox, memory_broker: MemoryBroker
) -> None:
    assert isinstance(store, OutboxStore)
    a = [Envelope.build("q", b"a%d" % i, key="a", headers={"h": "v"}) for i in range(4)]
    n = [Envelope.build("q", b"n%d" % i) for i in range(3)]
    store.put(a[:2] + n + a[2:])
    assert store.has_key(b"a") and not store.has_key(b"zz")
    [entry, *_] = store.list()
    assert entry.envelope == a[0] and entry.target == "amqp://h:5672"
    first = store.claim(limit=2, lease_s=30)
    assert first == a[:2]
    # a[2:] wait behind the leased head; keyless ones do not.
    assert store.claim(limit=10, lease_s=30) == n
    store.failed(a[0].message_id, error="Rejected: poison", retry_at=None)
    store.delivered([a[1].message_id] + [e.message_id for e in n])
    assert store.claim(limit=10, lease_s=30) == a[2:]
    stats = store.stats()
    assert (stats.depth, stats.quarantined) == (2, 1)
    [q] = store.quarantined()
    assert q.envelope == a[0] and "poison" in q.error
    store.release([(e.message_id, "later") for e in a[2:]], retry_at=0)
    assert store.replay("all") == 1
    transport = open_transport(parse_url(f"memory://{memory_broker.name}"), {})
    fwd = Forwarder(store, transport)
    assert fwd.drain(10) == 0
    assert memory_broker.ids("q") == [e.message_id for e in a[2:]] + [a[0].message_id]
    transport.close()


def test_a_tombstone_stays_a_tombstone_on_postgres(store: PostgresOutbox) -> None:
    sent = [
        Envelope.build("t", None, key="gone", headers={"h": "v"}),
        Envelope.build("t", None),
        Envelope.build("t", b"", key="empty"),
    ]
    store.put(sent)
    assert [e.envelope for e in store.list()] == sent
    got = store.claim(limit=10, lease_s=30)
    assert got == sent and [e.tombstone for e in got] == [True, True, False]


def test_two_stores_share_the_table_without_double_claims(
    postgres_conninfo: str, store: PostgresOutbox, table: str
) -> None:
    other = PostgresOutbox(postgres_conninfo, table=table)
    try:
        store.put([Envelope.build("q", b"%d" % i) for i in range(100)])
        mine = store.claim(limit=60, lease_s=30)
        theirs = other.claim(limit=60, lease_s=30)
        assert len(mine) == 60 and len(theirs) == 40
        assert not {e.message_id for e in mine} & {e.message_id for e in theirs}
    finally:
        other.close()


def test_claims_find_rows_made_ready_below_where_the_last_claim_looked(
    postgres_conninfo: str, table: str
) -> None:
    """Claims look for keys from the head the last claim found (below it lay only
    rows not ready then): a row released, or committed late with a lower seq, below
    that head is still claimed, and in its key's order."""
    now = [1000.0]
    store = PostgresOutbox(postgres_conninfo, table=table, max_keys=1, clock=lambda: now[0])
    a0, b0, c0, d0, x1 = (Envelope.build("q", b"%d" % i, key=k) for i, k in enumerate("abcdx"))
    x0, y0 = Envelope.build("q", b"x0", key="x"), Envelope.build("q", b"y0", key="y")
    try:
        with psycopg.connect(postgres_conninfo) as app:
            # x0 and y0 get their seqs first and commit after the others were claimed.
            store.put_in(app, [x0, y0])
            store.put([a0, b0, x1, c0, d0])
            assert store.claim(limit=10, lease_s=30) == [a0]
            assert store.claim(limit=10, lease_s=30) == [b0]
            # Released below the head the last claim found (b0): found again at once.
            store.release([(a0.message_id, "later")], retry_at=now[0])
            assert store.claim(limit=10, lease_s=30) == [a0]
            app.commit()
        # x is found above the head (x1) and claimed from its first row, x0.
        assert store.claim(limit=10, lease_s=30) == [x0, x1]
        # y0 has no row above the head: found once the cursor went back, within every_s.
        assert store.claim(limit=10, lease_s=30) == [c0]
        now[0] += 5.0
        assert store.claim(limit=10, lease_s=30) == [y0]
        assert store.claim(limit=10, lease_s=30) == [d0]
    finally:
        store.close()
