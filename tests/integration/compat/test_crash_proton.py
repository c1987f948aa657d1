"""msgsafe.compat.proton across the SIGKILL of an ActiveMQ Artemis primary, counted.

Legacy ``proton.utils`` code (one ``BlockingConnection`` given only the primary's URL,
``create_sender``, ``send`` per message) sends 2,000 durable messages; the primary is
killed with SIGKILL once a quarter were sent. The backup (learned from the primary's
``failover-server-list``) takes over. Every message whose ``send`` returned (accepted,
or stored in the outbox) is then on the backup or still in the outbox file: lost 0;
duplicates carry known ids. ``proton.utils.BlockingConnection`` itself never reconnects:
its sends fail from the kill on.
"""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path

import proton
import pytest

from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.compat import proton as compat
from msgsafe.consumer import Consumer
from msgsafe.outbox.sqlite import SqliteOutbox
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

N = 2_000
TIMEOUT_S = 5.0


def _proton_url(pair: ArtemisCluster, node: int) -> str:
    return f"amqp://{pair.user}:{pair.password}@127.0.0.1:{pair.ports[node]}"


def test_kill_the_primary_mid_run_loses_nothing_sent(
    artemis_pair: ArtemisCluster, tmp_path: Path
) -> None:
    address = f"proton-failover-{uuid.uuid4().hex[:8]}"
    outbox = tmp_path / "outbox.sqlite3"
    told: dict[str, str] = {}
    errors: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    conn = compat.BlockingConnection(
        _proton_url(artemis_pair, 0), timeout=TIMEOUT_S, outbox=outbox, lazy=True
    )
    try:
        sender = conn.create_sender(address)
        for i in range(N):
            message_id = f"fo-{i}"
            start = time.monotonic()
            try:
                sent = sender.send(proton.Message(id=message_id, body=b"%d" % i, durable=True))
            except proton.ProtonException as exc:
                errors[type(exc).__name__] += 1
                continue
            finally:
                slowest = max(slowest, time.monotonic() - start)
            assert sent.receipt is not None
            told[message_id] = sent.receipt.status.value
            if i == N // 4:
                artemis_pair.kill(0)
        # The outbox forwards to the backup once the producer failed over to it.
        drained = time.monotonic()
        left = conn.producer.drain(120)
        drained = time.monotonic() - drained
        fast = conn.fast_sends
    finally:
        conn.close()
    store = SqliteOutbox(outbox)
    try:
        stored = [e.envelope.message_id for e in store.list(limit=10 * N)]
        quarantined = store.quarantined(limit=10 * N)
    finally:
        store.close()
    wait_until(lambda: artemis_pair.nodes()[1].role == "live", 60, "the backup to serve")
    received: collections.Counter[str] = collections.Counter()
    want = set(told) - set(stored)
    with Consumer(artemis_pair.node_url(1), credit=500) as consumer:
        consumer.subscribe(address)
        last = [time.monotonic()]

        def settled() -> bool:
            for delivery in consumer.poll(0.2, max_messages=500):
                received[str(delivery.message_id)] += 1
                delivery.ack()
                last[0] = time.monotonic()
            return want <= set(received) and time.monotonic() - last[0] > 2.0

        wait_until(settled, 120, "every sent id on the backup")
    lost = set(told) - set(received) - set(stored)
    duplicates = sum(n - 1 for n in received.values())
    unknown = set(received) - {f"fo-{i}" for i in range(N)}
    statuses = collections.Counter(told.values())
    print(
        f"\nproton wrapper, Artemis primary SIGKILL: told={len(told)} ({dict(statuses)}) "
        f"fast={fast} errors={dict(errors)} received={len(received)} in_outbox={len(stored)} "
        f"quarantined={len(quarantined)} lost={len(lost)} duplicates={duplicates} "
        f"unknown={len(unknown)} slowest_send_s={slowest:.2f} "
        f"drained_s={drained:.1f} left_after_drain={left}"
    )
    assert not errors, errors
    assert len(told) == N
    # Before the kill, sends went over the fast path; after it, through msgsafe's.
    assert 0 < fast < N, fast
    assert lost == set(), sorted(lost)[:10]
    assert unknown == set()
    assert not quarantined
    assert left == 0, "the outbox was not forwarded to the backup"
    assert slowest <= TIMEOUT_S + 0.5, "a send took longer than its timeout"
