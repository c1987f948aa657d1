"""The fault matrix for AMQP 1.0: a producer sending through fault proxies to the
session's 3-node RabbitMQ cluster (its AMQP 1.0 plugin, a quorum queue at
``/amq/queue/NAME``) while one fault is injected, held and healed; then drain, consume,
and check the ledger (lost = 0, duplicates only of known ids).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pika
import pytest

import msgsafe
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.testing.faultproxy import FaultProxies
from tests.chaos._matrix import (
    RETRY,
    Fault,
    consume_with,
    disk_full_fault,
    proxy_faults,
    run_cell,
    stored_during_fault,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEND_TIMEOUT = 5.0
OPTIONS: dict[str, object] = {
    "connect_timeout": 1.0,
    "confirm_timeout": 2.0,
    "heartbeat": 2.0,
    "reconnect_maximum": 1.0,
}


def _queue(rabbit: RabbitCluster) -> str:
    # NOTE: RabbitMQ 3.10's AMQP 1.0 plugin cannot declare queues: declare over 0-9-1.
    name = f"chaos10-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.node_url(1)))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    return f"/amq/queue/{name}"


def _cell(
    rabbit: RabbitCluster, proxies: FaultProxies, fault: Fault, outbox: Path, **kw: object
) -> None:
    address = _queue(rabbit)
    url = f"amqp10://{rabbit.username}:{rabbit.password}@{proxies.hosts}"
    direct = "amqp10://" + rabbit.cluster_url().removeprefix("amqp://")
    with msgsafe.Producer(
        url, outbox=outbox, send_timeout=SEND_TIMEOUT, retry=RETRY, **OPTIONS
    ) as producer:
        run_cell(
            "amqp10",
            fault,
            producer,
            address,
            consume_with(direct, address),
            send_timeout=SEND_TIMEOUT,
            **kw,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("name", ["black-hole", "reset", "latency 2 s", "bandwidth 10 KB/s"])
def test_proxy_fault(
    name: str,
    chaos_rep: int,
    rabbit: RabbitCluster,
    rabbit_proxies: FaultProxies,
    tmp_path: Path,
) -> None:
    fault = proxy_faults(list(rabbit_proxies))[name]
    _cell(rabbit, rabbit_proxies, fault, tmp_path / "outbox.db")


def test_kill9(
    chaos_rep: int, rabbit: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    fault = Fault("kill -9", lambda: rabbit.kill(0), rabbit.heal, 5.0)
    _cell(rabbit, rabbit_proxies, fault, tmp_path / "outbox.db")


def test_sigstop(
    chaos_rep: int, rabbit: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    fault = Fault("SIGSTOP", lambda: rabbit.pause(0), rabbit.heal, 12.0)
    _cell(rabbit, rabbit_proxies, fault, tmp_path / "outbox.db")


def test_all_brokers_down(
    chaos_rep: int, rabbit: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    fault = Fault("all brokers down", rabbit.kill_all, rabbit.heal, 6.0, expect=stored_during_fault)
    _cell(rabbit, rabbit_proxies, fault, tmp_path / "outbox.db")


def test_outbox_disk_full(
    chaos_rep: int,
    rabbit: RabbitCluster,
    rabbit_proxies: FaultProxies,
    small_disk: Path,
) -> None:
    # Every host refusing, sends are stored at once (fail fast), so the disk fills with
    # the same small bodies as in the other protocols' cells.
    fault = disk_full_fault(list(rabbit_proxies), small_disk, leave=150_000)
    _cell(rabbit, rabbit_proxies, fault, small_disk / "outbox.db", body_size=512)
