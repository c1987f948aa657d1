"""Whole-cluster outage through ``msgsafe.Producer``: with every node down for 20 s,
``send()`` returns STORED within its timeout; when the nodes return the outbox drains
and every receipted id is consumed."""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.retry import RetryPolicy
from tests.support.ledger import Ledger, receive_receipted
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

OUTAGE_S = 20.0
SEND_TIMEOUT_S = 5.0
#: Sends per second during the outage. NOTE: unpaced, 20 s of sends stored ~40k messages
#: whose drain and consumption alone took ~40 s of the suite; 10k prove the same.
OUTAGE_RATE = 500.0


def _diagnosis(producer: msgsafe.Producer, rabbit: RabbitCluster) -> str:
    """What a reader of a drain that never ended needs: the producer's counts, the
    cluster's view, and where each msgsafe thread stands."""
    lines = [f"stats: {producer.stats()}"]
    for node in range(rabbit.size):
        try:
            lines.append(f"node {node}: running {rabbit.status(node).get('running_nodes')}")
        except Exception as exc:  # a diagnosis reports, it does not fail
            lines.append(f"node {node}: {exc}")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread.name.startswith("msgsafe") and frame is not None:
            stack = "".join(traceback.format_stack(frame)[-6:])
            lines.append(f"--- thread {thread.name}\n{stack}")
    return "\n".join(lines)


def test_all_nodes_down_sends_are_stored_then_drained(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"outage-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    statuses: dict[str, int] = {}
    slowest = 0.0
    producer = msgsafe.Producer(
        rabbit.cluster_url(),
        outbox=tmp_path / "outbox.db",
        send_timeout=SEND_TIMEOUT_S,
        declare="quorum",
        connect_timeout=1.0,
        confirm_timeout=3.0,
        heartbeat=2,
        # The forwarder's backoff caps at 2 s (30 s by default) so the drain starts
        # soon after the nodes return rather than at the next default probe.
        retry=RetryPolicy(initial=0.2, maximum=2.0),
    )

    def send(i: int) -> None:
        nonlocal slowest
        started = time.monotonic()
        receipt = producer.send(queue, f"m{i}".encode(), key=f"k{i % 4}")
        slowest = max(slowest, time.monotonic() - started)
        ledger.sent.add(receipt.message_id)
        ledger.receipted.add(receipt.message_id)
        statuses[receipt.status.value] = statuses.get(receipt.status.value, 0) + 1

    try:
        for i in range(200):
            send(i)
        assert statuses == {"confirmed": 200}
        rabbit.kill_all()
        outage_started = time.monotonic()
        i = 200
        while time.monotonic() - outage_started < OUTAGE_S:
            send(i)
            i += 1
            # Pacing (a send rate), not synchronisation.
            ahead = outage_started + (i - 200) / OUTAGE_RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        stored = statuses.get("stored", 0)
        assert stored > 0, statuses
        assert slowest <= SEND_TIMEOUT_S, f"a send blocked {slowest:.1f} s"
        rabbit.heal()
        healed = time.monotonic()
        wait_until(
            lambda: producer.pending() == 0,
            120,
            "the outbox to drain",
            diagnose=lambda: _diagnosis(producer, rabbit),
        )
        drained_s = time.monotonic() - healed
    finally:
        producer.close(10)
    receive_receipted(rabbit.cluster_url(), queue, ledger, deadline_s=60)
    print(
        f"{ledger.report('all nodes down 20 s')} statuses={statuses} "
        f"slowest_send_s={slowest:.2f} drain_s={drained_s:.1f}"
    )
    assert not ledger.lost
    assert not ledger.unknown
