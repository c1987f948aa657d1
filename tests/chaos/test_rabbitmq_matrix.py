"""The fault matrix for RabbitMQ (AMQP 0-9-1): a producer sending through fault proxies
to the session's 3-node cluster (quorum queue, pause_minority) while one fault is
injected, held and healed; then drain, consume, and check the ledger (lost = 0,
duplicates only of known ids). The partition cell runs on a cluster whose nodes live
in separate network namespaces.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

import msgsafe
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.testing.faultproxy import FaultProxies
from tests.chaos._matrix import (
    RETRY,
    BackgroundConsumer,
    Fault,
    consume_with,
    disk_full_fault,
    proxy_faults,
    run_cell,
    stored_during_fault,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEND_TIMEOUT = 5.0
#: Low timeouts so that faults are noticed within seconds (heartbeat 2 s: a frozen or
#: black-holed node is given up after about 2 missed beats).
OPTIONS: dict[str, object] = {
    "declare": "quorum",
    "connect_timeout": 1.0,
    "confirm_timeout": 2.0,
    "heartbeat": 2,
}


def _producer(url: str, outbox: Path, require: str = "durable") -> msgsafe.Producer:
    return msgsafe.Producer(
        url, outbox=outbox, send_timeout=SEND_TIMEOUT, retry=RETRY, require=require, **OPTIONS
    )


def _proxied_url(rabbit: RabbitCluster, proxies: FaultProxies) -> str:
    return f"amqp://{rabbit.username}:{rabbit.password}@{proxies.hosts}"


def _cell(
    rabbit: RabbitCluster,
    proxies: FaultProxies,
    fault: Fault,
    outbox: Path,
    require: str = "durable",
    **kw: object,
) -> None:
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    with _producer(_proxied_url(rabbit, proxies), outbox, require) as producer:
        run_cell(
            "rabbitmq",
            fault,
            producer,
            queue,
            consume_with(rabbit.cluster_url(), queue),
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


def _node_fault(
    rabbit: RabbitCluster, name: str, inject: Callable[[], None], hold_s: float
) -> Fault:
    return Fault(name, inject, rabbit.heal, hold_s)


def test_kill9(
    chaos_rep: int, rabbit: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    # Node 0 is first in the URL's host list: the node the producer is connected to.
    fault = _node_fault(rabbit, "kill -9", lambda: rabbit.kill(0), 5.0)
    _cell(rabbit, rabbit_proxies, fault, tmp_path / "outbox.db")


def test_sigstop(
    chaos_rep: int, rabbit: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    # NOTE: heal() resumes the node and restarts it if RabbitMQ 3.10 left it as an island
    # (the asymmetric partition a long SIGSTOP causes under pause_minority).
    fault = _node_fault(rabbit, "SIGSTOP", lambda: rabbit.pause(0), 12.0)
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
    fault = disk_full_fault(list(rabbit_proxies), small_disk, leave=150_000)
    # The outbox is on a small tmpfs (a real full disk): memory, which the default
    # require= refuses; accepted here on purpose.
    _cell(rabbit, rabbit_proxies, fault, small_disk / "outbox.db", "any", body_size=512)


def test_partition(chaos_rep: int, net_rabbit: object, tmp_path: Path) -> None:
    """Node 0 — the producer's and the consumer's node — is cut off from the other two
    while clients still reach it. Under pause_minority it pauses and closes its client
    connections; the producer moves to the majority and loses nothing, the consumer
    resumes there."""
    from tests.support.rabbit_lab import AMQP_PORT, NetRabbitCluster

    assert isinstance(net_rabbit, NetRabbitCluster)
    cluster = net_rabbit
    lab = cluster.lab
    doors = [lab.proxy(i, AMQP_PORT) for i in range(lab.n)]
    queue = f"chaos-part-{uuid.uuid4().hex[:8]}"
    url = "amqp://guest:guest@" + ",".join(f"127.0.0.1:{d.port}" for d in doors)
    expected_nodes = {cluster.node(i) for i in range(lab.n)}

    def partitions(i: int) -> object:
        try:
            return cluster.cluster_status(i).get("partitions")
        except (RuntimeError, ValueError):
            return None  # not running (paused): it records nothing

    def whole() -> bool:
        if not cluster.is_running(0):
            return False
        try:
            running = cluster.cluster_status(0).get("running_nodes", [])
        except (RuntimeError, ValueError):
            return False
        return (
            isinstance(running, list)
            and {str(n) for n in running} == expected_nodes
            and not any(partitions(i) for i in range(lab.n))
        )

    healed_at: list[float] = []
    restarted: list[int] = []

    def recovered() -> bool:
        if whole():
            return True
        # NOTE: RabbitMQ 3.10 may leave a recorded partition behind (an island that does
        # not pause); its documented recovery is restarting the app on that node.
        if not restarted and healed_at and time.monotonic() - healed_at[0] > 30:
            for i in range(lab.n):
                if partitions(i):
                    cluster.ctl(i, "stop_app")
                    cluster.ctl(i, "start_app")
                    restarted.append(i)
        return False

    def heal() -> None:
        lab.heal(0)
        healed_at.append(time.monotonic())

    def paused_minority(ledger: object) -> str | None:
        return None if cut_paused else "node 0 never paused while cut off (pause_minority)"

    cut_paused = False

    def hold_until_paused() -> None:
        nonlocal cut_paused
        lab.cut(0)
        try:
            wait_until(lambda: not cluster.is_running(0), 60, "node 0 to pause (pause_minority)")
            cut_paused = True
        except AssertionError:
            pass

    fault = Fault("partition", hold_until_paused, heal, 10.0, recovered, paused_minority)
    consumer_options: dict[str, object] = {"heartbeat": 2, "connect_timeout": 1.0}
    try:
        # The queue exists before the consumer subscribes.
        _declare_quorum(doors[1].port, queue)
        consumer = BackgroundConsumer(url, queue, options=consumer_options).start()
        try:
            with _producer(url, tmp_path / "outbox.db") as producer:
                run_cell(
                    "rabbitmq",
                    fault,
                    producer,
                    queue,
                    consumer.consume,
                    send_timeout=SEND_TIMEOUT,
                    recover_timeout=150.0,
                )
        finally:
            consumer.close()
        if restarted:
            print(f"recovery needed restart_app on nodes {restarted}")
    finally:
        lab.heal_all()
        for door in doors:
            door.close()


def _declare_quorum(port: int, queue: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
