"""The PostgreSQL outbox never stores connection credentials: a broker URL with a
password (the producer's, and the store's ``target=``) and a PostgreSQL conninfo with a
password leave no trace of either in any row of the outbox or quarantine table, in the
store's repr and stats, or in the error of a store that cannot connect — through stored
sends (broker unreachable), a transactional send, retries and a quarantine."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import msgsafe
from msgsafe import Status
from msgsafe.adapters import open_transport
from msgsafe.cluster._process import free_ports
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, PostgresOutbox
from msgsafe.retry import RetryPolicy

pytestmark = pytest.mark.integration

BROKER_SECRET = f"brokerpw{secrets.token_hex(6)}"
PG_SECRET = f"pgpw{secrets.token_hex(6)}"


@pytest.fixture
def table(postgres_conninfo: str) -> Iterator[str]:
    name = f"creds_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(postgres_conninfo) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_quarantine")


def _everything_stored(conninfo: str, table: str) -> str:
    with psycopg.connect(conninfo) as conn:
        rows = []
        for name in (table, f"{table}_quarantine"):
            rows += [r[0] for r in conn.execute(f"SELECT t::text FROM {name} AS t").fetchall()]
    return "\n".join(rows)


def test_no_credentials_in_the_postgres_outbox(postgres_conninfo: str, table: str) -> None:
    dead = free_ports(1)[0]
    url = f"amqp://app:{BROKER_SECRET}@127.0.0.1:{dead}/"
    # NOTE: the session's server trusts local connections; the password is planted, not used.
    conninfo = f"{postgres_conninfo} password={PG_SECRET}"
    store = PostgresOutbox(conninfo, table=table, target=url)
    producer = msgsafe.Producer(url, outbox=store)
    try:
        ids = [producer.send("q", f"s{i}".encode()).message_id for i in range(10)]
        assert producer.pending() >= 10
        with psycopg.connect(postgres_conninfo) as app:
            receipt = producer.send("q", b"in a transaction", transaction=app)
            app.commit()
        assert receipt.status is Status.STORED
        ids.append(receipt.message_id)
        shown = f"{store!r} {store.stats()!r} {producer!r}"
    finally:
        producer.close(timeout=2)
    # Retries and a quarantine: the forwarder records what went wrong in the rows.
    store = PostgresOutbox(conninfo, table=table, target=url)  # the producer closed its own
    tiny = open_transport(parse_url(url), {"max_message_size": 2, "connect_timeout": 0.5})
    try:
        forwarder = Forwarder(store, tiny, policy=RetryPolicy(initial=0.05, maximum=0.2))
        forwarder.step()
        forwarder.step()
        stats = forwarder.stats()
    finally:
        tiny.close(1)
    store.put([Envelope.build("q", b"x" * 100)])
    dump = _everything_stored(postgres_conninfo, table)
    store.close()
    assert stats.quarantined > 0 or stats.last_error, stats
    assert len(dump.splitlines()) >= len(ids) + 1
    assert "127.0.0.1" in dump  # the target is stored, without its credentials

    unreachable = f"host=127.0.0.1 port={dead} user=app password={PG_SECRET} connect_timeout=1"
    with pytest.raises(MsgsafeError) as caught:
        PostgresOutbox(unreachable, table=table).put([Envelope.build("q", b"x")])
    errors = f"{caught.value} {caught.value!r} {caught.value.__cause__!r}"
    for secret in (BROKER_SECRET, PG_SECRET):
        assert secret not in dump, f"{secret} stored in the outbox"
        assert secret not in shown and secret not in errors and secret not in str(stats)
