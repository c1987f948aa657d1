"""The ``msgsafe`` command against AMQP 1.0 peers (the proton test peer and RabbitMQ's
AMQP 1.0 plugin), as a subprocess."""

from __future__ import annotations

import pytest

from tests.fixtures.amqp10 import PeerFactory
from tests.fixtures.rabbitmq import RabbitUrls
from tests.integration.cli._run import msgsafe

pytestmark = pytest.mark.integration


def test_doctor_reports_what_the_peer_advertises(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start(advertise=["amqp://127.0.0.1:5999", "amqp://127.0.0.1:6000"])
    result = msgsafe("doctor", f"amqp10://127.0.0.1:{peer.port}", "--json")
    report = result.json()
    by_setting = {f["setting"]: f for f in report["findings"]}
    print(by_setting)
    assert by_setting["failover-server-list"]["severity"] == "ok"
    assert by_setting["failover-server-list"]["value"] == "2 peer(s)"
    # Storage and replication are not advertised in AMQP 1.0: unknown, never assumed.
    assert by_setting["durability and replication"]["severity"] == "unknown"
    assert result.code == 4


def test_doctor_warns_about_a_single_peer_without_failover(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    result = msgsafe("doctor", f"amqp10://127.0.0.1:{peer.port}")
    assert result.code == 5
    assert "failover-server-list" in result.stdout and "not advertised" in result.stdout


def test_doctor_reads_rabbitmq_amqp10_open_frame(rabbit_urls: RabbitUrls) -> None:
    result = msgsafe("doctor", rabbit_urls.amqp10[0], "--json")
    report = result.json()
    frame = next(f for f in report["findings"] if f["setting"] == "open frame")
    assert "RabbitMQ" in frame["value"]
    dropped = next(f for f in report["findings"] if f["setting"] == "unroutable messages")
    assert dropped["severity"] == "warning"
    assert result.code == 5  # one host, nothing advertised; unroutable messages dropped


def test_send_and_consume_through_an_amqp10_peer(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{peer.port}"
    sent = msgsafe("send", url, "q1", "--no-outbox", stdin="one\ntwo\n")
    assert sent.code == 0, sent.stderr
    got = msgsafe("consume", url, "q1", "--count", "2", "--timeout", "20")
    assert got.code == 0, got.stderr
    assert got.stdout.splitlines() == ["one", "two"]
