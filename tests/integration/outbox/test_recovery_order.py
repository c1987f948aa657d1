"""Recovery after an outage, per protocol, on the real brokers: 4 hot keys and 100 cold
keys are STORED while the broker is unreachable (fault proxies refuse every connection;
single sends, then batches stored whole as blocks, then single sends again),
the proxies heal, more messages of the hot keys and of new keys are sent while the
pipelined drain runs, and a consumer checks every key's order and counts: lost 0,
duplicates only of sent ids.

Per-key order is checked on the first arrival of each id (a re-sent message's second copy
is a duplicate the consumer's ``dedup=`` drops; it never overtakes its predecessor).
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest

import msgsafe
from msgsafe.adapters import open_receiver
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import Delivery, new_message_ids
from msgsafe.ports import Receiver
from msgsafe.retry import RetryPolicy
from msgsafe.testing.faultproxy import FaultProxies
from tests.support.kafka_lab import LabKafka
from tests.support.kafka_ledger import start_group_at_zero

pytestmark = pytest.mark.integration

HOT = [f"hot-{i}" for i in range(4)]
COLD = [f"cold-{i}" for i in range(100)]
DOWN = 2_000  #: sent while the broker is unreachable: 1,600 on hot keys, 400 on cold ones
DURING = 200  #: sent after the heal, while the backlog drains: hot keys and new keys


@dataclass
class Run:
    """Every id sent with its key, in send order; every receipt; every arrival."""

    order: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    sent: set[str] = field(default_factory=set)
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    arrivals: list[tuple[str, str]] = field(default_factory=list)  # (key, id) as consumed

    def send(
        self, producer: msgsafe.Producer, destination: str, keys: list[str]
    ) -> dict[str, collections.Counter[str]]:
        """Send one message per key in ``keys``; returns the statuses per key."""
        futures = []
        for key in keys:
            message_id = msgsafe.new_message_id()
            self.order[key].append(message_id)
            self.sent.add(message_id)
            futures.append(
                (key, producer.send_async(destination, b"x" * 100, key=key, message_id=message_id))
            )
        by_key: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for key, future in futures:
            receipt = future.result(120)
            self.statuses[receipt.status.name] += 1
            by_key[key][receipt.status.name] += 1
        return by_key

    def send_batch(self, producer: msgsafe.Producer, destination: str, keys: list[str]) -> None:
        """Send one message per key in ``keys`` with one ``send_batch`` (what it stores in
        an outage is kept as blocks: msgsafe/outbox/_blocks.py)."""
        ids = new_message_ids(len(keys))
        for key, message_id in zip(keys, ids, strict=True):
            self.order[key].append(message_id)
            self.sent.add(message_id)
        receipt = producer.send_batch(
            destination, [b"x" * 100] * len(keys), keys=keys, message_ids=ids
        )
        self.statuses["STORED"] += receipt.stored
        self.statuses["CONFIRMED"] += receipt.confirmed

    def check(self, name: str) -> None:
        received = collections.Counter(mid for _, mid in self.arrivals)
        first: dict[str, list[str]] = collections.defaultdict(list)
        seen: set[str] = set()
        for key, mid in self.arrivals:
            if mid not in seen:
                seen.add(mid)
                first[key].append(mid)
        lost = self.sent - seen
        unknown = seen - self.sent
        duplicates = sum(n - 1 for n in received.values())
        print(
            f"[{name}] sent={len(self.sent)} {dict(self.statuses)} "
            f"received={len(self.arrivals)} lost={len(lost)} duplicates={duplicates} "
            f"unknown={len(unknown)} keys={len(self.order)}"
        )
        assert not lost, f"{len(lost)} lost"
        assert not unknown
        assert self.statuses["STORED"] >= DOWN - 50  # the outage sent them to the outbox
        out_of_order = [k for k, ids in self.order.items() if first[k] != ids]
        for k in out_of_order[:3]:
            pos = {mid: i for i, mid in enumerate(self.order[k])}
            print(f"key {k}: first arrivals, by send index: {_ranges([pos[m] for m in first[k]])}")
        assert not out_of_order, f"per-key order broken for {out_of_order[:5]}"


def _ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 7, 3]`` -> ``"0-2,7-7,3-3"``: where an order broke, readable."""
    out = []
    start = prev = None
    for x in xs:
        if prev is not None and x == prev + 1:
            prev = x
            continue
        if start is not None:
            out.append(f"{start}-{prev}")
        start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}")
    return ",".join(out)


def outage_and_recovery(
    url: str,
    destination: str,
    proxies: Callable[[], None],
    heal: Callable[[], None],
    tmp_path: Path,
    run: Run,
    **options: object,
) -> None:
    """Refuse, store DOWN messages, heal, and once the forwarder's first confirm came
    send DURING more (hot keys: behind their backlog; new keys: straight to the broker)
    while draining; drain."""
    proxies()
    down = [HOT[i % 4] if i % 5 != 4 else COLD[(i // 5) % 100] for i in range(DOWN)]
    during = [HOT[i % 4] if i % 2 else f"new-{i}" for i in range(DURING)]
    with msgsafe.Producer(
        url,
        outbox=tmp_path / "outbox.db",
        send_timeout=30,
        confirm_timeout=3.0,
        retry=RetryPolicy(initial=0.1, maximum=1.0),
        **options,
    ) as producer:
        # Singles, then batches (stored whole, as blocks), then singles again, on the
        # same keys: the drain must keep each key's order across rows and blocks.
        run.send(producer, destination, down[: DOWN // 2])
        for start in range(DOWN // 2, DOWN * 3 // 4, 250):
            run.send_batch(producer, destination, down[start : start + 250])
        run.send(producer, destination, down[DOWN * 3 // 4 :])
        stored = producer.pending()
        assert stored >= DOWN - 50  # a probe may already have gone through
        heal()
        healed = time.monotonic()
        while producer.pending() >= stored:  # the forwarder's first confirm
            assert time.monotonic() - healed < 30, "nothing confirmed 30 s after the heal"
            time.sleep(0.01)
        first_confirm_s = time.monotonic() - healed
        # The producer's own refusal pause (0.5 s after its last failed send) ends: a send
        # of a key without backlog is CONFIRMED again.
        probes = 0
        while run.send(producer, destination, [f"probe-{probes}"])[f"probe-{probes}"]["STORED"]:
            probes += 1
            assert time.monotonic() - healed < 30, "direct sends did not resume"
        statuses = run.send(producer, destination, during)
        # Keys without a backlog do not wait behind the hot keys' backlog.
        new_keys = [k for k in statuses if k.startswith("new-")]
        assert all(statuses[k]["CONFIRMED"] == 1 for k in new_keys), {
            k: dict(statuses[k]) for k in new_keys if not statuses[k]["CONFIRMED"]
        }
        assert producer.drain(120) == 0, "the outbox did not drain after the heal"
        print(
            f"first confirm {first_confirm_s:.2f}s, {probes + 1} probe send(s), drained in "
            f"{time.monotonic() - healed:.2f}s after the heal"
        )


def consume(receiver: Receiver, source: str, run: Run, deadline_s: float = 120) -> None:
    """Read ``source`` until every sent id arrived (then 1 s more for trailing copies)."""
    receiver.subscribe(source)
    missing = set(run.sent)
    deadline = time.monotonic() + deadline_s
    quiet_until: float | None = None
    while time.monotonic() < deadline:
        batch: list[Delivery] = receiver.receive(max_messages=1000, timeout=0.5)
        for delivery in batch:
            key = (delivery.key or b"").decode()
            assert delivery.message_id is not None
            run.arrivals.append((key, delivery.message_id))
            missing.discard(delivery.message_id)
            delivery.ack()
        if not missing:
            quiet_until = quiet_until or time.monotonic() + 1.0
            if not batch and time.monotonic() >= quiet_until:
                return


@pytest.fixture
def rabbit_proxies(rabbit_cluster: RabbitCluster) -> Iterator[FaultProxies]:
    upstreams = [("127.0.0.1", rabbit_cluster.port(i)) for i in range(rabbit_cluster.size)]
    with FaultProxies(upstreams, connect_timeout=2.0) as proxies:
        yield proxies


def _quorum_queue(cluster: RabbitCluster) -> str:
    name = f"recovery-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(cluster.node_url(0)))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    return name


def test_rabbitmq_recovery_keeps_key_order(
    rabbit_cluster: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    queue = _quorum_queue(rabbit_cluster)
    hosts = ",".join(f"127.0.0.1:{p.port}" for p in rabbit_proxies)
    run = Run()
    outage_and_recovery(
        f"amqp://guest:guest@{hosts}/%2F",
        queue,
        rabbit_proxies.refuse,
        rabbit_proxies.heal,
        tmp_path,
        run,
        connect_timeout=1.0,
    )
    receiver = open_receiver(parse_url(rabbit_cluster.cluster_url()), {"prefetch": 1000})
    try:
        consume(receiver, queue, run)
    finally:
        receiver.close()
    run.check("rabbitmq recovery")


def test_amqp10_recovery_keeps_key_order(
    rabbit_cluster: RabbitCluster, rabbit_proxies: FaultProxies, tmp_path: Path
) -> None:
    """AMQP 1.0 through RabbitMQ's AMQP 1.0 plugin (the session cluster's own ports)."""
    address = f"/amq/queue/{_quorum_queue(rabbit_cluster)}"
    hosts = ",".join(f"127.0.0.1:{p.port}" for p in rabbit_proxies)
    run = Run()
    outage_and_recovery(
        f"amqp10://guest:guest@{hosts}",
        address,
        rabbit_proxies.refuse,
        rabbit_proxies.heal,
        tmp_path,
        run,
        connect_timeout=1.0,
    )
    receiver = open_receiver(parse_url(rabbit_cluster.amqp10_url(0)), {"credit": 1000})
    try:
        consume(receiver, address, run)
    finally:
        receiver.close()
    run.check("amqp10 recovery")


def test_kafka_recovery_keeps_key_order(
    kafka_cluster: LabKafka, kafka_topic: str, tmp_path: Path
) -> None:
    proxies = kafka_cluster.open_proxies()

    def refuse() -> None:
        for proxy in proxies:
            proxy.refuse()

    def heal() -> None:
        for proxy in proxies:
            proxy.heal()

    run = Run()
    try:
        outage_and_recovery(kafka_cluster.proxied_url, kafka_topic, refuse, heal, tmp_path, run)
    finally:
        heal()
    group = f"check-{uuid.uuid4().hex[:8]}"
    start_group_at_zero(kafka_cluster.url, kafka_topic, group)
    receiver = open_receiver(
        parse_url(kafka_cluster.url),
        {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500},
        group=group,
    )
    try:
        consume(receiver, kafka_topic, run)
    finally:
        receiver.close()
    run.check("kafka recovery")
