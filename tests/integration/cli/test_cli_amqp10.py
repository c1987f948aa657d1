"""The ``msgsafe`` command against real AMQP 1.0 brokers (the session's ActiveMQ Artemis
pair and RabbitMQ's AMQP 1.0 plugin), as a subprocess."""

from __future__ import annotations

import uuid

import pytest

from msgsafe.cluster.artemis import ArtemisCluster
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import msgsafe

pytestmark = pytest.mark.integration


def test_doctor_reports_the_backup_the_artemis_live_advertises(
    artemis_pair: ArtemisCluster,
) -> None:
    result = msgsafe("doctor", artemis_pair.node_url(0), "--json")
    report = result.json()
    by_setting = {f["setting"]: f for f in report["findings"]}
    print(by_setting)
    assert by_setting["failover-server-list"]["severity"] == "ok"
    assert by_setting["failover-server-list"]["value"] == "1 peer(s)"
    backup = f"127.0.0.1:{artemis_pair.ports[1]}"
    assert backup in by_setting["client fail-over plan"]["value"]
    # Storage and replication are not advertised in AMQP 1.0: unknown, never assumed.
    assert by_setting["durability and replication"]["severity"] == "unknown"
    assert result.code == 4


def test_doctor_reads_rabbitmq_amqp10_open_frame(rabbit_urls: RabbitUrls) -> None:
    """RabbitMQ's plugin advertises no fail-over list: one host and nothing advertised is
    a warning, as are the unroutable messages it drops."""
    result = msgsafe("doctor", rabbit_urls.amqp10[0], "--json")
    report = result.json()
    by_setting = {f["setting"]: f for f in report["findings"]}
    assert "RabbitMQ" in by_setting["open frame"]["value"]
    assert by_setting["unroutable messages"]["severity"] == "warning"
    assert "not advertised" in by_setting["failover-server-list"]["value"]
    assert result.code == 5


def test_send_and_consume_through_artemis(artemis_pair: ArtemisCluster) -> None:
    url = artemis_pair.node_url(0)
    address = f"cli.{uuid.uuid4().hex[:8]}"
    sent = msgsafe("send", url, address, "--no-outbox", stdin="one\ntwo\n")
    assert sent.code == 0, sent.stderr
    got = msgsafe("consume", url, address, "--count", "2", "--timeout", "20")
    assert got.code == 0, got.stderr
    assert got.stdout.splitlines() == ["one", "two"]
