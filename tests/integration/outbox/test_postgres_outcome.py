"""Errors of the PostgreSQL outbox that never lie about what was stored, and that a
person can read, on the real primary + synchronous standby pair:

- a COMMIT the paused standby holds: the send raises ``StoreOutcomeUnknown`` within the
  store's ``write_timeout`` (not ``SendTimeout`` naming the broker after
  ``send_timeout``), naming the id; the row commits once the standby is back; a retry
  with that id stores no second row, and the consumer side receives it once (counted);
- an id put again with another body is refused (``MessageIdReused``), the stored row
  kept;
- a read-only login and a wrong password: one line naming the first cause.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import msgsafe
from msgsafe import Status
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.errors import (
    AuthenticationError,
    MessageIdReused,
    OutboxLoginReadOnly,
    OutboxLoginRefused,
    StoreOutcomeUnknown,
)
from msgsafe.message import Envelope
from msgsafe.outbox import PostgresOutbox
from msgsafe.testing import MemoryBroker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

WRITE_TIMEOUT_S = 8.0
#: What a loaded 2-core machine may add: the put's start, one question to the server
#: after the cut.
SLACK_S = 6.0


@pytest.fixture
def table() -> str:
    return f"oc_{uuid.uuid4().hex[:10]}"


def _rows(url: str, table: str, message_id: str) -> int:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE id = %s", (message_id,)).fetchone()
    return int(row[0]) if row else 0


def _superuser(pair: PostgresCluster) -> str:
    # The pair's superuser has the pair's password (msgsafe.cluster.postgres).
    return f"postgresql://postgres:{pair.password}@127.0.0.1:{pair.ports[0]}/postgres"


def test_a_commit_the_standby_holds_is_reported_unknown_and_its_retry_stored_once(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker, table: str
) -> None:
    memory_broker.refuse_writes("down for the test")  # every send goes to the store
    url = f"{pg_pair.url}&table={table}&write_timeout={WRITE_TIMEOUT_S:g}"
    producer = msgsafe.Producer(
        f"memory://{memory_broker.name}", outbox=url, send_timeout=30, forward=False
    )
    sent: list[str] = []
    try:
        pg_pair.pause(1)  # the primary's commits now wait for the standby's answer
        try:
            started = time.monotonic()
            with pytest.raises(StoreOutcomeUnknown) as raised:
                producer.send("orders", b"the order")
            took = time.monotonic() - started
        finally:
            pg_pair.resume(1)
        error = raised.value
        text = str(error)
        print(f"[unknown] raised after {took:.1f} s: {text}")
        assert WRITE_TIMEOUT_S - 0.5 <= took <= WRITE_TIMEOUT_S + SLACK_S, took
        assert error.message_id is not None and error.destination == "orders"
        sent.append(error.message_id)
        assert f"may have been stored; retry with message_id={error.message_id}" in text
        assert "\n" not in text
        # It names the store (without its password), not the broker.
        assert error.endpoint is not None and error.endpoint.startswith("postgresql://")
        assert f":{pg_pair.password}@" not in text and "memory://" not in text
        assert error.maybe_delivered

        # The held COMMIT completes once the standby answers: stored, once.
        wait_until(lambda: _rows(pg_pair.url, table, sent[0]) == 1, 60, "the held row")
        retried = producer.send("orders", b"the order", message_id=error.message_id)
        assert retried.status is Status.STORED and retried.message_id == sent[0]
        assert _rows(pg_pair.url, table, sent[0]) == 1
        assert producer.pending() == 1
        memory_broker.accept_writes()
        assert producer.drain(60) == 0
    finally:
        pg_pair.resume(1)
        producer.close(10)
    received = memory_broker.ids("orders")
    assert received == sent, received


def test_an_id_put_again_with_another_body_is_refused(pg_pair: PostgresCluster, table: str) -> None:
    store = PostgresOutbox.from_url(f"{pg_pair.url}&table={table}")
    try:
        first = Envelope.build("q", b"first", key="k")
        other = Envelope.build("q", b"second", key="k", message_id=first.message_id)
        fresh = Envelope.build("q", b"fresh")
        store.put([first])
        store.put([first])  # the same message again: no second row
        with pytest.raises(MessageIdReused) as raised:
            store.put([fresh, other])  # all or none: fresh is not stored either
        assert raised.value.message_id == first.message_id
        assert "\n" not in str(raised.value)
        assert store.pending() == 1
        with psycopg.connect(pg_pair.url) as conn:
            row = conn.execute(f"SELECT body FROM {table}").fetchone()
        assert row is not None and bytes(row[0]) == b"first"
    finally:
        store.close()


def test_producer_sends_in_one_put_fail_alone_on_a_reused_id(
    pg_pair: PostgresCluster, memory_broker: MemoryBroker, table: str
) -> None:
    """The store's check, behind the producer's: an id stored by another producer with
    another body fails that send only; the sends put with it are stored."""
    memory_broker.refuse_writes("down for the test")
    url = f"{pg_pair.url}&table={table}"
    taken = Envelope.build("orders", b"theirs")
    store = PostgresOutbox.from_url(url)
    try:
        store.put([taken])
    finally:
        store.close()
    producer = msgsafe.Producer(
        f"memory://{memory_broker.name}", outbox=url, send_timeout=30, forward=False
    )
    try:
        futures = [producer.send_async("orders", b"mine %d" % i) for i in range(20)]
        reused = producer.send_async("orders", b"mine", message_id=taken.message_id)
        futures += [producer.send_async("orders", b"mine %d" % i) for i in range(20, 40)]
        assert {f.result(30).status for f in futures} == {Status.STORED}
        with pytest.raises(MessageIdReused):
            reused.result(30)
        assert producer.pending() == 41
    finally:
        producer.close(10)


@pytest.fixture
def read_only_login(pg_pair: PostgresCluster) -> Iterator[tuple[str, str]]:
    """A role whose sessions are read-only (``default_transaction_read_only=on``)."""
    name = f"ro_{uuid.uuid4().hex[:8]}"
    password = secrets.token_hex(8)
    with psycopg.connect(_superuser(pg_pair), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        admin.execute(f"ALTER ROLE {name} SET default_transaction_read_only = on")
    try:
        yield name, password
    finally:
        with psycopg.connect(_superuser(pg_pair), autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {name}")


def _login_url(pair: PostgresCluster, user: str, password: str, table: str) -> str:
    hosts = ",".join(f"127.0.0.1:{p}" for p in pair.ports)
    return f"postgresql://{user}:{password}@{hosts}/{pair.database}?table={table}"


def test_a_read_only_login_is_named_in_one_line(
    pg_pair: PostgresCluster, read_only_login: tuple[str, str], table: str
) -> None:
    user, password = read_only_login
    started = time.monotonic()
    with pytest.raises(OutboxLoginReadOnly) as raised:
        PostgresOutbox.from_url(_login_url(pg_pair, user, password, table))
    took = time.monotonic() - started
    text = str(raised.value)
    print(f"[read-only] {took:.1f} s: {text}")
    assert "read-only" in text and "default_transaction_read_only=on" in text
    assert "\n" not in text and password not in text
    assert took < 15  # not the store's write_timeout of retries


def test_a_wrong_password_is_one_short_line(pg_pair: PostgresCluster, table: str) -> None:
    wrong = f"wrong{secrets.token_hex(6)}"
    with pytest.raises(OutboxLoginRefused) as raised:
        PostgresOutbox.from_url(_login_url(pg_pair, pg_pair.user, wrong, table))
    text = str(raised.value)
    print(f"[password] {text}")
    assert isinstance(raised.value, AuthenticationError)
    assert f'password authentication failed for user "{pg_pair.user}"' in text
    assert "\n" not in text and wrong not in text and len(text) < 300
