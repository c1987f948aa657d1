"""Fail-over on the real 3-node cluster: 20k messages to a quorum queue while the node
the producer is connected to (and which leads the queue) is killed or frozen.

Every id sent, receipted (future resolved OK) and received is recorded; the run passes
when every receipted id was consumed (lost == 0) and every duplicate carries a known id.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from msgsafe.adapters import open_transport
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from tests.support.ledger import Ledger, publish_all, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

N = 20_000
BODY = b"x" * 100


def _queue(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _run(
    rabbit: RabbitCluster,
    name: str,
    fault: threading.Thread,
    ledger: Ledger,
    queue: str,
    *,
    victim: int,
    options: dict[str, object],
) -> None:
    # The victim is listed first: the transport connects to it and declares the queue
    # there, so it also holds the quorum queue's leader.
    order = [victim] + [i for i in range(rabbit.size) if i != victim]
    url = parse_url(rabbit.cluster_url(order))
    transport = open_transport(url, {"declare": "quorum", **options})
    started = time.monotonic()
    try:
        envelopes = [Envelope.build(queue, BODY, key=f"k{i % 16}") for i in range(N)]
        fault.start()
        publish_all(transport, envelopes, ledger, deadline_s=150)
    finally:
        transport.close(10)
        fault.join(120)
    published = time.monotonic() - started
    # Consume through the nodes that stayed up (the victim may still be rejoining).
    others = [i for i in order if i != victim]
    receive_receipted(rabbit.cluster_url(others), queue, ledger, prefetch=1000, deadline_s=120)
    print(f"{ledger.report(name)} publish_s={published:.1f}")


def _check(ledger: Ledger) -> None:
    assert not ledger.permanent, ledger.permanent[:3]
    assert len(ledger.receipted) == N, "every message should be confirmed after retries"
    assert not ledger.lost, f"{len(ledger.lost)} receipted ids never consumed"
    assert not ledger.unknown, "received ids that were never sent"


def test_kill_connected_node_mid_stream(rabbit: RabbitCluster) -> None:
    ledger = Ledger()
    victim = 0

    def fault() -> None:
        wait_until(lambda: len(ledger.receipted) >= N // 4, 60, "a quarter receipted")
        rabbit.kill(victim)
        wait_until(lambda: len(ledger.receipted) >= N // 2, 60, "half receipted after the kill")
        rabbit.restart(victim)

    _run(
        rabbit,
        "kill -9",
        threading.Thread(target=fault, name="fault"),
        ledger,
        _queue("kill"),
        victim=victim,
        options={"heartbeat": 2, "confirm_timeout": 20},
    )
    _check(ledger)


def test_sigstop_connected_node_30s(rabbit: RabbitCluster) -> None:
    ledger = Ledger()
    victim = 1
    frozen = threading.Event()

    def fault() -> None:
        wait_until(lambda: len(ledger.receipted) >= N // 4, 60, "a quarter receipted")
        rabbit.pause(victim)
        frozen.set()
        # The fault itself lasts 30 s (what the issue asks for), not a synchronisation.
        time.sleep(30)
        rabbit.resume(victim)

    _run(
        rabbit,
        "SIGSTOP 30 s",
        threading.Thread(target=fault, name="fault"),
        ledger,
        _queue("stop"),
        victim=victim,
        options={"heartbeat": 2, "confirm_timeout": 20},
    )
    assert frozen.is_set()
    _check(ledger)
