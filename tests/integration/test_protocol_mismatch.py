"""A broker of the wrong kind is a permanent, typed error (ProtocolMismatch) naming what
the peer speaks and what to do, at once: never an outage retried forever into the
outbox. Real brokers: a one-node RabbitMQ with its AMQP 1.0 plugin disabled (it answers
an AMQP 1.0 header with its 0-9-1 header); its port for the Kafka client; a one-node
tansu (Kafka protocol) for the AMQP 0-9-1 client.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Producer
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.errors import ProtocolMismatch

pytestmark = pytest.mark.integration

#: A mismatch is known from the first reply: well under the connect timeout.
WITHIN_S = 2.0


@pytest.fixture(scope="module")
def rabbit_without_amqp10() -> Iterator[RabbitCluster]:
    """One RabbitMQ node speaking AMQP 0-9-1 only (the AMQP 1.0 plugin disabled)."""
    cluster = RabbitCluster(size=1)
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start RabbitMQ (apt-get install rabbitmq-server): {exc}")
    try:
        tool = shutil.which("rabbitmq-plugins") or "/usr/lib/rabbitmq/bin/rabbitmq-plugins"
        subprocess.run(
            [tool, "disable", "rabbitmq_amqp1_0"],
            env=cluster.env(0),
            check=True,
            capture_output=True,
            timeout=120,
        )
        # NOTE: RabbitMQ 3.10 keeps answering AMQP 1.0 headers on a node whose plugin
        # was disabled online; a node started without it answers with its 0-9-1 header.
        cluster.restart(0)
        yield cluster
    finally:
        cluster.stop()


def _first_send_error(url: str) -> tuple[BaseException, float]:
    producer = Producer(url, outbox=False)
    start = time.monotonic()
    try:
        producer.send("orders", b"x")
    except Exception as exc:  # the assertion names what was raised instead
        return exc, time.monotonic() - start
    finally:
        producer.close()
    raise AssertionError(f"a send to {url} was confirmed")


def test_amqp10_client_to_a_rabbitmq_without_the_plugin(
    rabbit_without_amqp10: RabbitCluster,
) -> None:
    error, took = _first_send_error(rabbit_without_amqp10.amqp10_url(0))
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "AMQP 0-9-1" in str(error) and "amqp://" in str(error)
    assert "rabbitmq_amqp1_0" in str(error)
    assert took < WITHIN_S, took


def test_kafka_client_to_a_rabbitmq_port(rabbit_without_amqp10: RabbitCluster) -> None:
    port = rabbit_without_amqp10.port(0)
    error, took = _first_send_error(f"kafka://127.0.0.1:{port}")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "AMQP" in str(error) and "amqp://" in str(error)
    assert took < WITHIN_S, took


def test_forwarder_quarantines_instead_of_retrying(
    rabbit_without_amqp10: RabbitCluster, tmp_path: Path
) -> None:
    producer = Producer(rabbit_without_amqp10.amqp10_url(0), outbox=tmp_path / "o.db")
    try:
        with pytest.raises(ProtocolMismatch):
            producer.send("orders", b"x")
        assert producer.pending() == 0  # nothing stored to be retried forever
    finally:
        producer.close()


def test_amqp_client_to_a_kafka_port(kafka_cluster: KafkaCluster) -> None:
    port = kafka_cluster.ports[0]
    error, took = _first_send_error(f"amqp://127.0.0.1:{port}/")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "Kafka" in str(error) and "kafka://" in str(error)
    assert took < WITHIN_S * 2, took
