"""TLS fails closed on a real broker: a certificate that can never verify (untrusted CA,
wrong host name, expired) is a typed, permanent :class:`CertificateError` raised to the
caller within 2 s, never an outage to store and retry; a good certificate works end to
end (send, confirm, consume, every id counted).

A two-node RabbitMQ with a TLS listener per node, certificates made for the session:
node 0 presents a certificate for ``localhost`` only (so ``127.0.0.1`` is the wrong host
name), node 1 one that expired yesterday; a second CA stands for the untrusted one.
``kafka+ssl://`` meets the same listeners: its client fails the TLS handshake before a
Kafka byte is sent, so any real TLS listener shows what it does with a bad certificate.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import msgsafe
from msgsafe import Status
from msgsafe.cluster.base import ClusterError, TlsFiles
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.errors import CertificateError
from tests.support.certs import new_authority

pytestmark = pytest.mark.integration

#: Documented: a certificate that cannot verify is refused within 2 s.
WITHIN_S = 2.0


@dataclass(frozen=True)
class TlsLab:
    cluster: RabbitCluster
    trusted: Path  #: the CA that signed both servers' certificates
    untrusted: Path  #: another CA


@pytest.fixture(scope="module")
def tls_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsLab]:
    directory = tmp_path_factory.mktemp("tls-lab")
    authority = new_authority(directory)
    other = new_authority(directory, "another CA", stem="other-ca")
    node_files: list[TlsFiles] = [
        authority.issue(directory, "good", names=("localhost",)),
        authority.issue(directory, "expired", names=("localhost",), expired=True),
    ]
    cluster = RabbitCluster(nodes=2, tls=node_files)
    try:
        cluster.start()
    except (ClusterError, RuntimeError) as exc:
        pytest.fail(f"cannot start RabbitMQ (apt-get install rabbitmq-server): {exc}")
    try:
        yield TlsLab(cluster, authority.ca, other.ca)
    finally:
        cluster.stop()


def _url(scheme: str, lab: TlsLab, *, host: str, node: int, ca: Path) -> str:
    port = lab.cluster.tls_port(node)
    path = "/" if scheme == "amqps" else ""
    return f"{scheme}://guest:guest@{host}:{port}{path}?tls_ca_file={ca}"


@pytest.mark.parametrize("scheme", ["amqps", "amqp10s"])
def test_good_certificate_end_to_end(tls_lab: TlsLab, scheme: str) -> None:
    queue = f"tls-{scheme}-{secrets.token_hex(3)}"
    amqps = _url("amqps", tls_lab, host="localhost", node=0, ca=tls_lab.trusted)
    url = _url(scheme, tls_lab, host="localhost", node=0, ca=tls_lab.trusted)
    destination = queue if scheme == "amqps" else f"/amq/queue/{queue}"
    sent: set[str] = set()
    with msgsafe.Producer(amqps, outbox=False, declare="quorum") as first:
        first.send(queue, b"declare")  # the queue exists before any AMQP 1.0 send
    with msgsafe.Producer(url, outbox=False) as producer:
        for i in range(50):
            receipt = producer.send(destination, f"m{i}".encode())
            assert receipt.status is Status.CONFIRMED
            sent.add(receipt.message_id)
    received: set[str] = set()
    deadline = time.monotonic() + 30
    with msgsafe.Consumer(url) as consumer:
        consumer.subscribe(destination)
        while not sent <= received and time.monotonic() < deadline:
            for delivery in consumer.poll(max_messages=100, timeout=1.0):
                if delivery.body != b"declare":
                    received.add(delivery.message_id)
                delivery.ack()
    assert sent - received == set(), f"lost {len(sent - received)} of {len(sent)}"
    assert received <= sent


#: (what is wrong, host, node, which CA the client trusts)
FAULTS = [
    ("untrusted CA", "localhost", 0, "untrusted"),
    ("wrong host name", "127.0.0.1", 0, "trusted"),
    ("expired", "localhost", 1, "trusted"),
]


@pytest.mark.parametrize("scheme", ["amqps", "amqp10s", "kafka+ssl"])
@pytest.mark.parametrize(("fault", "host", "node", "trust"), FAULTS)
def test_a_certificate_that_cannot_verify_fails_closed(
    tls_lab: TlsLab, tmp_path: Path, scheme: str, fault: str, host: str, node: int, trust: str
) -> None:
    ca = tls_lab.trusted if trust == "trusted" else tls_lab.untrusted
    url = _url(scheme, tls_lab, host=host, node=node, ca=ca)
    # With an outbox: a certificate that can never verify is no outage to store.
    producer = msgsafe.Producer(url, outbox=tmp_path / "outbox.db")
    try:
        start = time.monotonic()
        with pytest.raises(CertificateError) as caught:
            producer.send("tls-faults", b"x")
        took = time.monotonic() - start
        assert producer.pending() == 0, "stored as if the broker were down"
        # The next send too: no plain-TCP fallback, no retry that could succeed.
        with pytest.raises(CertificateError):
            producer.send("tls-faults", b"y")
    finally:
        producer.close(timeout=1)
    assert took < WITHIN_S, (fault, took)
    assert "guest" not in str(caught.value), "credentials in an error"
    assert "verif" in str(caught.value), str(caught.value)
