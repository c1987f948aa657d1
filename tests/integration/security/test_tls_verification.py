"""TLS fails closed on a real RabbitMQ: a certificate that can never verify (untrusted
CA, wrong host name, expired) and a client certificate the listener requires but is not
given are a typed, permanent :class:`CertificateError` raised to the caller within 2 s,
never an outage to store and retry; a good certificate with a client certificate (mutual
TLS) works end to end (send, confirm, consume, every id counted).

A two-node RabbitMQ with a TLS listener per node, certificates from
:func:`msgsafe.cluster.tls.make` (trustme): node 0 presents a certificate for
``localhost`` only (so ``127.0.0.1`` is the wrong host name) and requires a client
certificate, node 1 one that expired yesterday; ``other-ca.pem`` stands for the untrusted
CA. ``kafka+ssl://`` meets the same listeners: its client fails the TLS handshake before
a Kafka byte is sent, so any real TLS listener shows what it does with a bad certificate
(Kafka's own SSL listeners: ``test_tls_clusters.py``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster import tls as cluster_tls
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.rabbitmq import RabbitCluster
from tests.support.tls_checks import assert_fails_closed, assert_refused_login, round_trip

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    certs = cluster_tls.make(tmp_path_factory.mktemp("tls-lab"))
    cluster = RabbitCluster(nodes=2, tls=[certs.server, certs.expired])
    cluster.tls = certs
    try:
        cluster.start()
    except (ClusterError, RuntimeError) as exc:
        pytest.fail(f"cannot start RabbitMQ (apt-get install rabbitmq-server): {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _url(
    scheme: str, lab: RabbitCluster, *, host: str, node: int, ca: str, client: bool = True
) -> str:
    assert lab.tls is not None
    port = lab.tls_port(node)
    path = "/" if scheme == "amqps" else ""
    trust = lab.tls.other_ca if ca == "untrusted" else lab.tls.ca
    query = lab.tls.query(ca=trust, client=client)
    return f"{scheme}://guest:guest@{host}:{port}{path}?{query}"


@pytest.mark.parametrize("scheme", ["amqps", "amqp10s"])
def test_mutual_tls_end_to_end(tls_lab: RabbitCluster, scheme: str) -> None:
    queue = f"tls-{scheme}-{secrets.token_hex(3)}"
    amqps = _url("amqps", tls_lab, host="localhost", node=0, ca="trusted")
    url = _url(scheme, tls_lab, host="localhost", node=0, ca="trusted")
    destination = queue if scheme == "amqps" else f"/amq/queue/{queue}"
    with msgsafe.Producer(amqps, outbox=False, declare="quorum") as first:
        first.send(queue, b"declare")  # the queue exists before any AMQP 1.0 send
    sent, received = round_trip(url, destination, ignore=lambda body: body == b"declare")
    assert (sent, received) == (50, 50)


#: (what is wrong, host, node, which CA the client trusts, client certificate given)
FAULTS = [
    ("untrusted CA", "localhost", 0, "untrusted", True),
    ("wrong host name", "127.0.0.1", 0, "trusted", True),
    ("expired", "localhost", 1, "trusted", True),
    ("no client certificate", "localhost", 0, "trusted", False),
]


@pytest.mark.parametrize("scheme", ["amqps", "amqp10s", "kafka+ssl"])
@pytest.mark.parametrize(("fault", "host", "node", "trust", "client"), FAULTS)
def test_a_certificate_that_cannot_verify_fails_closed(
    tls_lab: RabbitCluster,
    tmp_path: Path,
    scheme: str,
    fault: str,
    host: str,
    node: int,
    trust: str,
    client: bool,
) -> None:
    url = _url(scheme, tls_lab, host=host, node=node, ca=trust, client=client)
    text = assert_fails_closed(url, tmp_path / "outbox.db", secret="guest")
    said = "client certificate" if not client else "verif"
    assert said in text, (fault, text)


@pytest.mark.parametrize("scheme", ["amqps", "amqp10s"])
def test_a_wrong_password_fails_fast_and_stores_nothing(
    tls_lab: RabbitCluster, tmp_path: Path, scheme: str
) -> None:
    url = _url(scheme, tls_lab, host="localhost", node=0, ca="trusted").replace(
        "guest:guest@", "guest:not-the-password@"
    )
    # NOTE: RabbitMQ's AMQP 1.0 plugin answers a failed SASL login only after 3 s.
    limit = 2.0 if scheme == "amqps" else 4.0
    took = assert_refused_login(url, tmp_path / "outbox.db", secret="not-the-password")
    assert took < limit, took
