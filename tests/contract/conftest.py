"""The conformance suite runs against every adapter: one ``BrokerCase`` per adapter,
built from the session's broker fixtures, with feature flags where protocols differ."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

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

    yield BrokerCase(
        name="kafka",
        url=cluster.url,
        new_destination=topic,
        needs_group=True,
        # Kafka has no per-message redelivery flag: it re-reads from the committed offset.
        features=frozenset(),
        patience=20.0,
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
    import pika  # the AMQP 1.0 plugin of RabbitMQ 3.10 cannot declare queues

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()


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
