"""The legacy pika script, unchanged and with only its import line changed, against a
3-node RabbitMQ cluster while the node it is connected to is killed mid-run."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

import msgsafe
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat._pika_config import connection_url
from tests.integration.compat.legacy import (
    HERE,
    Run,
    connected_ports,
    event_id,
    run_script,
    script_env,
    wrap,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRIPT = HERE / "legacy_pika_producer.py"
COUNT = 1500
OLD_IMPORT = "import pika"
NEW_IMPORT = "from msgsafe.compat import pika"


def _hosts(cluster: RabbitCluster) -> str:
    return ",".join(f"127.0.0.1:{cluster.port(i)}" for i in range(cluster.size))


def _kill_connected(cluster: RabbitCluster, killed: list[int]) -> Callable[[int], str]:
    def kill(pid: int) -> str:
        ports = {cluster.port(i): i for i in range(cluster.size)}
        connected = connected_ports(pid, ports)
        index = ports[connected[0]] if connected else 0
        cluster.kill(index)
        killed.append(index)
        return f"node{index}"

    return kill


def _received(cluster: RabbitCluster, node: int, queue: str, limit_s: float = 60.0) -> Counter[int]:
    """Every event in ``queue`` (taken off it), read through ``node``."""
    connection = pika.BlockingConnection(pika.URLParameters(cluster.node_url(node)))
    try:
        channel = connection.channel()
        received: Counter[int] = Counter()
        deadline = time.monotonic() + limit_s
        while True:
            depth = channel.queue_declare(queue, passive=True).method.message_count
            if depth == 0:
                return received
            if time.monotonic() > deadline:
                raise AssertionError(f"{queue} still holds {depth} messages after {limit_s}s")
            for _ in range(depth):
                method, _props, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                received[event_id(body)] += 1
    finally:
        connection.close()


def _forward_leftovers(data_dir: Path, cluster: RabbitCluster) -> int:
    """Forward what the wrapped script left in its outbox (the next producer's job)."""
    params = [pika.ConnectionParameters("127.0.0.1", cluster.port(i)) for i in range(cluster.size)]
    url, _ = connection_url(params)
    left = 0
    for path in data_dir.glob("**/outbox/*.sqlite3"):
        with msgsafe.Producer(url, outbox=str(path)) as p:
            left += p.pending()
            assert p.drain(30) == 0, "the outbox could not forward its messages"
    return left


def test_legacy_pika_producer_loses_nothing_once_wrapped(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    runs = []
    killed: list[int] = []
    for label, script in (
        ("unmodified", SCRIPT),
        ("wrapped", wrap(SCRIPT, OLD_IMPORT, NEW_IMPORT, tmp_path / "wrapped_pika_producer.py")),
    ):
        for index in killed:
            rabbit.restart(index)
        killed.clear()
        queue = f"legacy-{label}-{uuid.uuid4().hex[:8]}"
        data_dir = tmp_path / f"data-{label}"
        run = run_script(
            Run(label, COUNT),
            script,
            [_hosts(rabbit), queue, str(COUNT)],
            env=script_env(data_dir),
            log=tmp_path / f"{label}.stderr",
            kill=_kill_connected(rabbit, killed),
        )
        if label == "wrapped":
            run.left_in_outbox = _forward_leftovers(data_dir, rabbit)
        alive = next(i for i in range(rabbit.size) if i not in killed)
        run.received = _received(rabbit, alive, queue)
        print(run.summary())
        runs.append(run)

    wrapped = runs[-1]
    assert wrapped.killed, "no node was killed during the wrapped run"
    assert wrapped.returncode == 0, wrapped.stderr_tail
    assert not wrapped.lost, f"lost {len(wrapped.lost)}: {sorted(wrapped.lost)[:20]}"
    assert not wrapped.silently_lost and not wrapped.failed
    assert not wrapped.unknown  # duplicates, if any, carry known ids
