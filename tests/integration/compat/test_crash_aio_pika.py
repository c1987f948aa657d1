"""msgsafe.compat.aio_pika across a RabbitMQ node's SIGKILL, counted.

An application written for aio-pika (``connect_robust``, ``default_exchange.publish``
with a deadline, many publishes in flight) publishes 4,000 messages to a quorum queue
led by the node it is connected to; that node is killed with SIGKILL once a quarter
were acknowledged. Every message whose ``publish`` returned (confirmed by the broker, or
stored in the outbox) is counted: after the run each is in the queue (read through the
surviving nodes) or still in the outbox file: lost 0. Duplicates (a confirm lost with the
node) must carry known ids. No publish may take longer than its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from pathlib import Path

import pika
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import aio_pika
from msgsafe.outbox.sqlite import SqliteOutbox
from tests.integration.compat.differential import rabbit_params
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

N = 4_000
#: Publishes in flight at once (asyncio tasks), and each one's deadline in seconds.
CONCURRENCY = 50
DEADLINE_S = 3.0


def _declare(rabbit: RabbitCluster, queue: str, node: int) -> None:
    conn = pika.BlockingConnection(rabbit_params(rabbit)[node])
    conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()


def _consume_all(rabbit: RabbitCluster, queue: str, nodes: list[int], expect: int) -> list[str]:
    """Every copy's message id in ``queue`` (read through ``nodes``), polled until
    ``expect`` distinct ids arrived and the queue is empty, or 120 s passed.

    NOTE: distinct ids: a duplicate counted towards ``expect`` once ended the read
    with as many messages still queued (a run reported them lost)."""
    params = [rabbit_params(rabbit)[i] for i in nodes]
    ids: list[str] = []
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    try:
        while time.monotonic() < deadline:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                if len(seen) >= expect:
                    break  # every expected id arrived and nothing else is queued
                conn.sleep(0.1)  # the polling period of this wait
                continue
            ids.append(props.message_id)
            seen.add(props.message_id)
        ch.queue_delete(queue)
    finally:
        conn.close()
    return ids


def test_kill_the_connected_node_mid_run_loses_nothing_acknowledged(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    victim = 0
    queue = f"aiocrash-{uuid.uuid4().hex[:8]}"
    _declare(rabbit, queue, victim)
    outbox = tmp_path / "outbox.sqlite3"
    told: dict[str, str] = {}  # id -> receipt status
    errors: collections.Counter[str] = collections.Counter()
    slowest = [0.0]
    killed = [False]
    direct = [0]

    async def main() -> None:
        others = [f"127.0.0.1:{rabbit.port(i)}" for i in range(rabbit.size) if i != victim]
        connection = await aio_pika.connect_robust(
            f"{rabbit.node_url(victim)}/?heartbeat=2",
            failover=others,
            outbox=outbox,
            publish_timeout=DEADLINE_S,
        )
        channel = await connection.channel()
        todo = asyncio.Queue[int]()
        for i in range(N):
            todo.put_nowait(i)

        async def worker() -> None:
            loop = asyncio.get_running_loop()
            while not todo.empty():
                i = todo.get_nowait()
                message_id = f"crash-{i}"
                start = loop.time()
                try:
                    ack = await channel.default_exchange.publish(
                        aio_pika.Message(b"%d" % i, message_id=message_id), queue
                    )
                except Exception as exc:  # counted: the caller still owns the message
                    errors[type(exc).__name__] += 1
                    continue
                finally:
                    slowest[0] = max(slowest[0], loop.time() - start)
                assert isinstance(ack, aio_pika.PublishAck)
                told[message_id] = ack.receipt.status.value
                if not killed[0] and len(told) >= N // 4:
                    killed[0] = True
                    await asyncio.to_thread(rabbit.kill, victim)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        direct[0] = connection.publisher.fast.accepted
        # close() forwards what the outbox holds (up to its wait); the count then reads
        # the file for what is left.
        await asyncio.wait_for(connection.close(), 60)

    asyncio.run(main())
    assert killed[0], "the node was never killed"
    stored_ids: list[str] = []
    store = SqliteOutbox(outbox)
    try:
        stored_ids = [e.envelope.message_id for e in store.list(limit=10 * N)]
        quarantined = store.quarantined(limit=10 * N)
    finally:
        store.close()
    others = [i for i in range(rabbit.size) if i != victim]
    wait_until(lambda: rabbit.is_running(others[0]), 30, "a surviving node")
    received = _consume_all(rabbit, queue, others, expect=len(told) - len(stored_ids))
    counts = collections.Counter(received)
    lost = set(told) - set(counts) - set(stored_ids)
    duplicates = sum(n - 1 for n in counts.values())
    unknown = set(counts) - {f"crash-{i}" for i in range(N)}
    statuses = collections.Counter(told.values())
    print(
        f"\naio-pika wrapper, node SIGKILL: told={len(told)} ({dict(statuses)}) "
        f"errors={dict(errors)} received={len(counts)} in_outbox={len(stored_ids)} "
        f"quarantined={len(quarantined)} lost={len(lost)} duplicates={duplicates} "
        f"unknown={len(unknown)} slowest_publish_s={slowest[0]:.2f} "
        f"confirmed_on_the_callers_channel={direct[0]}"
    )
    assert not errors, errors
    assert len(told) == N
    assert lost == set(), sorted(lost)[:10]
    assert unknown == set()
    assert not quarantined
    # The node died under publishes on the application's own channel, not only msgsafe's.
    assert direct[0] > 0, "no publish was confirmed on the application's channel"
    assert slowest[0] <= DEADLINE_S + 0.5, "a publish took longer than its deadline"
