"""A broker of the wrong kind is a permanent, typed error (ProtocolMismatch) naming what
the peer speaks and what to do, at once: never an outage retried forever into the
outbox. Every pair of the three protocols, and TLS against plain both ways, on real
brokers: a one-node RabbitMQ with its AMQP 1.0 plugin disabled (it answers an AMQP 1.0
header with its 0-9-1 header) and a TLS listener beside its plain one; the session's
Apache Kafka; an ActiveMQ Artemis pair (AMQP 1.0, no AMQP 0-9-1).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Consumer, Producer
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.cluster.base import TlsFiles
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.errors import ProtocolMismatch

pytestmark = pytest.mark.integration

#: A mismatch is known from the first reply: well under the connect timeout.
WITHIN_S = 2.0


@pytest.fixture(scope="module")
def rabbit_without_amqp10(amqp10_tls: TlsFiles) -> Iterator[RabbitCluster]:
    """One RabbitMQ node speaking AMQP 0-9-1 only (the AMQP 1.0 plugin disabled), on a
    plain port and a TLS port."""
    cluster = RabbitCluster(size=1, tls=amqp10_tls)
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


def test_amqp10_client_to_a_kafka_port(kafka_cluster: KafkaCluster) -> None:
    # NOTE: Kafka closes the connection on an AMQP header without a byte of its own.
    error, took = _first_send_error(f"amqp10://127.0.0.1:{kafka_cluster.ports[0]}")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "Kafka" in str(error) and "kafka://" in str(error)
    assert took < WITHIN_S, took


def test_amqp_client_to_an_amqp10_broker(artemis_pair: ArtemisCluster) -> None:
    error, took = _first_send_error(f"amqp://u:p@127.0.0.1:{artemis_pair.ports[0]}/")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "AMQP 1.0" in str(error) and "amqp10://" in str(error)
    assert took < WITHIN_S, took


def test_kafka_client_to_an_amqp10_broker(artemis_pair: ArtemisCluster) -> None:
    # NOTE: Artemis closes the connection on a Kafka request without a byte of its own.
    error, took = _first_send_error(f"kafka://127.0.0.1:{artemis_pair.ports[0]}")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert "AMQP 1.0" in str(error) and "amqp10://" in str(error)
    assert took < WITHIN_S, took


def _first_poll_error(url: str) -> tuple[BaseException, float]:
    """What a consumer raises first for ``url``: at construction, subscribe or poll."""
    start = time.monotonic()
    try:
        with Consumer(url, group="mismatch") as consumer:
            consumer.subscribe("orders")
            while time.monotonic() - start < 30.0:
                consumer.poll(0.2)
    except Exception as exc:  # the assertion names what was raised instead
        return exc, time.monotonic() - start
    raise AssertionError(f"a consumer of {url} polled for 30 s without an error")


def test_consumers_raise_the_mismatch_as_producers_do(
    rabbit_without_amqp10: RabbitCluster,
    kafka_cluster: KafkaCluster,
    artemis_pair: ArtemisCluster,
) -> None:
    """The producer's pairs, consumed: each raises ProtocolMismatch naming what to use,
    within the same bound, instead of polling nothing for ever."""
    rabbit, kafka = rabbit_without_amqp10.port(0), kafka_cluster.ports[0]
    artemis = artemis_pair.ports[0]
    pairs = [
        (rabbit_without_amqp10.amqp10_url(0), "amqp://"),
        (f"kafka://127.0.0.1:{rabbit}", "amqp://"),
        (f"amqp://127.0.0.1:{kafka}/", "kafka://"),
        (f"amqp10://127.0.0.1:{kafka}", "kafka://"),
        (f"amqp://u:p@127.0.0.1:{artemis}/", "amqp10://"),
        (f"kafka://127.0.0.1:{artemis}", "amqp10://"),
    ]
    for url, use in pairs:
        error, took = _first_poll_error(url)
        assert isinstance(error, ProtocolMismatch), (url, repr(error))
        assert use in str(error), (url, str(error))
        assert took < WITHIN_S * 2, (url, took)


def test_doctor_names_the_mismatch(
    rabbit_without_amqp10: RabbitCluster, kafka_cluster: KafkaCluster
) -> None:
    """``msgsafe doctor kafka://`` at an AMQP port says ProtocolMismatch and what to use,
    not a broker transport failure; likewise ``amqp://`` at a Kafka port."""
    from tests.support.commands import msgsafe

    rabbit, kafka = rabbit_without_amqp10.port(0), kafka_cluster.ports[0]
    for url, use in (
        (f"kafka://127.0.0.1:{rabbit}", "amqp://"),
        (f"amqp://127.0.0.1:{kafka}/", "kafka://"),
    ):
        run = msgsafe("doctor", url)
        assert run.code == 3, (url, run.stdout, run.stderr)
        assert "ProtocolMismatch" in run.stderr and use in run.stderr, (url, run.stderr)


#: (scheme, which port, what the error must name): a plain client on a TLS port, a TLS
#: client on a plain port, for each protocol.
TLS_PAIRS = [
    ("amqp", "tls", "TLS", "amqps://"),
    ("amqps", "plain", "plain TCP, not TLS", "amqp://"),
    ("amqp10", "tls", "TLS", "amqp10s://"),
    ("amqp10s", "plain", "plain TCP, not TLS", "amqp10://"),
    ("kafka", "tls", "TLS", "kafka+ssl://"),
    ("kafka+ssl", "kafka", "plain TCP, not TLS", "kafka://"),
]


@pytest.mark.parametrize(("scheme", "port_kind", "spoken", "advice"), TLS_PAIRS)
def test_tls_against_plain_both_ways(
    scheme: str,
    port_kind: str,
    spoken: str,
    advice: str,
    rabbit_without_amqp10: RabbitCluster,
    kafka_cluster: KafkaCluster,
    amqp10_tls: TlsFiles,
) -> None:
    port = {
        "tls": rabbit_without_amqp10.tls_port(0),
        "plain": rabbit_without_amqp10.port(0),
        "kafka": kafka_cluster.ports[0],
    }[port_kind]
    query = f"?tls_ca_file={amqp10_tls.ca}" if scheme.endswith(("s", "ssl")) else ""
    path = "/" if scheme.startswith("amqp") and not scheme.startswith("amqp10") else ""
    error, took = _first_send_error(f"{scheme}://guest:guest@127.0.0.1:{port}{path}{query}")
    assert isinstance(error, ProtocolMismatch), repr(error)
    assert spoken in str(error) and advice in str(error), str(error)
    assert took < WITHIN_S, took


def test_a_good_tls_connection_is_no_mismatch(
    rabbit_without_amqp10: RabbitCluster, amqp10_tls: TlsFiles
) -> None:
    """The control for the pairs above: the same TLS port with amqps:// confirms."""
    url = (
        f"amqps://guest:guest@127.0.0.1:{rabbit_without_amqp10.tls_port(0)}/"
        f"?tls_ca_file={amqp10_tls.ca}"
    )
    with Producer(url, outbox=False, declare="quorum") as producer:
        assert producer.send("tls-control", b"x").status.name == "CONFIRMED"
