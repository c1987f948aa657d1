"""TLS on Apache Kafka's own SSL listeners (the 3-node KRaft cluster) and on ActiveMQ
Artemis's TLS acceptors (the primary/backup pair), both started with ``tls=True`` as
``msgsafe cluster up KIND --tls`` does: mutual TLS works end to end (every id counted);
an untrusted CA, the wrong host name, an expired certificate (the listeners that present
one) and a missing client certificate each fail closed with a CertificateError within
2 s, nothing stored; and a real broker's fail-over advertisement that would move the TLS
session to plain TCP (Artemis lists its backup's plain acceptor), or to a host outside
``failover_allow=``, is refused and logged.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.cluster.kafka import KafkaCluster
from tests.support.tls_checks import WITHIN_S, assert_fails_closed, assert_refused_login, round_trip

pytestmark = pytest.mark.integration

TlsCluster = KafkaCluster | ArtemisCluster


@pytest.fixture(params=["kafka", "artemis"])
def tls_cluster(request: pytest.FixtureRequest) -> TlsCluster:
    fixture = "kafka_secure" if request.param == "kafka" else "artemis_tls"
    cluster: TlsCluster = request.getfixturevalue(fixture)
    return cluster


def _destination(cluster: TlsCluster) -> str:
    name = f"tls-{secrets.token_hex(3)}"
    if isinstance(cluster, KafkaCluster):
        cluster.create_topic(name, partitions=3)
    return name


def test_mutual_tls_end_to_end(tls_cluster: TlsCluster) -> None:
    sent, received = round_trip(tls_cluster.tls_url(), _destination(tls_cluster))
    assert (sent, received) == (50, 50)


def _faults(cluster: TlsCluster) -> dict[str, str]:
    assert cluster.tls is not None
    good = cluster.tls_url()
    return {
        "untrusted CA": good.replace(str(cluster.tls.ca), str(cluster.tls.other_ca)),
        "wrong host name": good.replace("localhost", "127.0.0.1"),
        "expired": cluster.tls_url(expired=True),
        "no client certificate": good.split("&tls_cert_file=")[0],
    }


@pytest.mark.parametrize(
    "fault", ["untrusted CA", "wrong host name", "expired", "no client certificate"]
)
def test_a_certificate_that_cannot_verify_fails_closed(
    tls_cluster: TlsCluster, tmp_path: Path, fault: str
) -> None:
    url = _faults(tls_cluster)[fault]
    text = assert_fails_closed(url, tmp_path / "outbox.db", secret="msgsafe:msgsafe")
    assert ("client certificate" if fault == "no client certificate" else "verif") in text


def test_a_plain_failover_candidate_is_refused_and_logged(
    artemis_tls: TlsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(artemis_tls, ArtemisCluster)
    primary_tls = artemis_tls.tls_url().replace(f",localhost:{artemis_tls.tls_ports[1]}", "")
    plain_backup = f"127.0.0.1:{artemis_tls.ports[1]}"
    caplog.set_level(logging.INFO, logger="msgsafe.adapters.amqp10")
    with msgsafe.Producer(primary_tls, outbox=False) as producer:
        assert producer.send(f"tls-{secrets.token_hex(3)}", b"x").status is msgsafe.Status.CONFIRMED
    logged = [r.getMessage() for r in caplog.records]
    refused = [m for m in logged if "downgrade" in m and plain_backup in m]
    assert refused, "the primary's plain candidate (its backup) must be refused and logged"
    followed = [m for m in logged if "fail-over candidates" in m and plain_backup in m]
    assert followed == [], followed


def test_a_candidate_outside_the_allow_list_is_refused_and_logged(
    artemis_tls: TlsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(artemis_tls, ArtemisCluster)
    primary = f"127.0.0.1:{artemis_tls.ports[0]}"
    backup = f"127.0.0.1:{artemis_tls.ports[1]}"
    url = f"{artemis_tls.node_url(0)}?failover_allow={primary}"
    caplog.set_level(logging.INFO, logger="msgsafe.adapters.amqp10")
    with msgsafe.Producer(url, outbox=False) as producer:
        status = producer.send(f"allow-{secrets.token_hex(3)}", b"x").status
        assert status is msgsafe.Status.CONFIRMED
    logged = [r.getMessage() for r in caplog.records]
    refused = [m for m in logged if "outside failover_allow" in m and backup in m]
    assert refused, "the backup the primary advertises is outside the allow-list"
    followed = [m for m in logged if "fail-over candidates" in m and backup in m]
    assert followed == [], followed


def test_a_wrong_password_fails_fast_over_tls(artemis_tls: TlsCluster, tmp_path: Path) -> None:
    url = artemis_tls.tls_url().replace("msgsafe:msgsafe@", "msgsafe:not-the-password@")
    took = assert_refused_login(url, tmp_path / "outbox.db", secret="not-the-password")
    assert took < WITHIN_S, took
