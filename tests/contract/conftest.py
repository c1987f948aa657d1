"""The conformance suite runs against every adapter: one ``BrokerCase`` per adapter,
built from the session's broker fixtures, with feature flags where protocols differ; and
against every outbox store: one ``StoreCase`` per store.

What an adapter or a store offers beyond the required methods is not listed here: each
declares it (``capabilities``, see msgsafe/ports.py), and the suite holds it to that."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from msgsafe.adapters import open_transport
from msgsafe.endpoints import parse_url
from msgsafe.outbox import SqliteOutbox
from msgsafe.ports import OutboxStore, Transport
from msgsafe.testing import MemoryBroker


@dataclass
class BrokerCase:
    """How the contract suite talks to one adapter."""

    name: str
    url: str
    #: Makes a fresh destination (declaring it where the protocol needs that).
    new_destination: Callable[[], str]
    producer_options: dict[str, object] = field(default_factory=dict)
    consumer_options: dict[str, object] = field(default_factory=dict)
    #: A consumer group name is needed to consume (Kafka) rather than optional.
    needs_group: bool = False
    #: Features: "redelivered" (the flag is set on a redelivery; Kafka cannot know).
    features: frozenset[str] = frozenset({"redelivered"})
    #: Seconds to wait for a message that should arrive.
    patience: float = 10.0
    #: The first ``n`` bodies of a destination as the wire holds them, None for a null
    #: body: where the adapter declares tombstones (its own consumer reads one as b"").
    read_bodies: Callable[[str, int], list[bytes | None]] | None = None


def _memory_case() -> Iterator[BrokerCase]:
    broker = MemoryBroker.install(MemoryBroker(f"contract-{uuid.uuid4().hex[:8]}"))
    yield BrokerCase(
        name="memory",
        url=f"memory://{broker.name}",
        new_destination=lambda: f"q-{uuid.uuid4().hex[:8]}",
        patience=2.0,
    )
    MemoryBroker.forget(broker.name)


def _rabbitmq_case(request: pytest.FixtureRequest) -> Iterator[BrokerCase]:
    urls = request.getfixturevalue("rabbit_urls")
    yield BrokerCase(
        name="rabbitmq",
        url=urls.cluster,
        new_destination=lambda: f"contract-{uuid.uuid4().hex[:8]}",
        # Declaring is explicit: the producer declares the quorum queue on first use.
        producer_options={"declare": "quorum"},
    )


def _kafka_case(request: pytest.FixtureRequest) -> Iterator[BrokerCase]:
    cluster = request.getfixturevalue("kafka_cluster")

    def topic() -> str:
        name = f"contract-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(name, partitions=3)
        return name

    def read_bodies(topic: str, count: int) -> list[bytes | None]:
        from tests.support.kafka_ledger import earliest_consumer

        consumer = earliest_consumer(cluster.bootstrap, "contract")
        consumer.subscribe([topic])
        bodies: list[bytes | None] = []
        deadline = time.monotonic() + 60
        try:
            while len(bodies) < count:
                assert time.monotonic() < deadline, f"only {len(bodies)} of {count} read"
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    bodies.append(msg.value())
        finally:
            consumer.close()
        return bodies

    yield BrokerCase(
        name="kafka",
        url=cluster.url,
        new_destination=topic,
        needs_group=True,
        # Kafka has no per-message redelivery flag: it re-reads from the committed offset.
        features=frozenset(),
        patience=20.0,
        read_bodies=read_bodies,
    )


def _amqp10_case(request: pytest.FixtureRequest) -> Iterator[BrokerCase]:
    urls = request.getfixturevalue("rabbit_urls")

    def queue() -> str:
        # RabbitMQ's AMQP 1.0 plugin addresses existing queues as /amq/queue/NAME.
        name = f"contract10-{uuid.uuid4().hex[:8]}"
        _declare_quorum(urls.amqp[0], name)
        return f"/amq/queue/{name}"

    yield BrokerCase(
        name="amqp10",
        # The same cluster, every node listed: AMQP 1.0 listens on the 0-9-1 ports.
        url="amqp10://" + urls.cluster.removeprefix("amqp://"),
        new_destination=queue,
    )


def _declare_quorum(url: str, name: str) -> None:
    # the AMQP 1.0 plugin of RabbitMQ 3.10 cannot declare queues: pika does it
    from tests.support.rabbit_queues import declare_quorum

    declare_quorum(url, name)


#: adapter name -> factory taking the pytest request (to reach session fixtures).
CASES: dict[str, Callable[[pytest.FixtureRequest], Iterator[BrokerCase]]] = {
    "memory": lambda request: _memory_case(),
    "rabbitmq": _rabbitmq_case,
    "kafka": _kafka_case,
    "amqp10": _amqp10_case,
}


#: The memory adapter runs in the fast tier; the real brokers' runs are integration tests
#: (``make test-fast`` deselects them: it starts no broker).
_PARAMS = [
    pytest.param(name, marks=() if name == "memory" else (pytest.mark.integration,))
    for name in sorted(CASES)
]


@pytest.fixture(params=_PARAMS)
def case(request: pytest.FixtureRequest) -> Iterator[BrokerCase]:
    yield from CASES[request.param](request)


#: The size limit of the transports the capability tests open (an oversized message
#: shows how each seam reports a message's own failure).
SIZE_LIMIT = 1024


@pytest.fixture
def transport(case: BrokerCase) -> Iterator[Transport]:
    """The case's adapter transport itself (no producer in front), at SIZE_LIMIT."""
    opened = open_transport(
        parse_url(case.url), {**case.producer_options, "max_message_size": SIZE_LIMIT}
    )
    try:
        yield opened
    finally:
        opened.close(case.patience)


@dataclass
class StoreCase:
    """How the contract suite opens one outbox store."""

    name: str
    #: A fresh, empty store (the test closes it).
    open: Callable[[], OutboxStore]
    #: A new connection of the application's, for send(transaction=...), where the
    #: store writes inside one (PostgreSQL): its transaction is open until commit().
    connect: Callable[[], Any] | None = None
    #: Another store on the same data as the given one (another process of a fleet),
    #: where the store declares ``notify``.
    same: Callable[[Any], OutboxStore] | None = None


def _sqlite_case(tmp_path: Path) -> Iterator[StoreCase]:
    yield StoreCase(name="sqlite", open=lambda: SqliteOutbox(tmp_path / f"{uuid.uuid4().hex}.db"))


def _postgres_case(request: pytest.FixtureRequest) -> Iterator[StoreCase]:
    import psycopg

    from msgsafe.outbox import PostgresOutbox

    conninfo = request.getfixturevalue("postgres_conninfo")
    yield StoreCase(
        name="postgres",
        open=lambda: PostgresOutbox(conninfo, table=f"contract_{uuid.uuid4().hex[:10]}"),
        connect=lambda: psycopg.connect(conninfo),
        same=lambda store: PostgresOutbox(conninfo, table=store.table),
    )


STORES: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[StoreCase]]] = {
    "sqlite": lambda request, tmp_path: _sqlite_case(tmp_path),
    "postgres": lambda request, tmp_path: _postgres_case(request),
}


@pytest.fixture(
    params=[
        pytest.param(name, marks=() if name == "sqlite" else (pytest.mark.integration,))
        for name in sorted(STORES)
    ]
)
def store_case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCase]:
    yield from STORES[request.param](request, tmp_path)


@pytest.fixture
def store(store_case: StoreCase) -> Iterator[OutboxStore]:
    opened = store_case.open()
    try:
        yield opened
    finally:
        opened.close()
