"""Per-key order on Kafka: messages with the same key arrive in the order sent.

Run:  python3 examples/kafka_keys.py kafka://127.0.0.1:9092 [TOPIC]

Needs a Kafka-protocol broker. No broker at hand? Start one on loopback with the test
harness (an embedded tansu broker; ``pip install 'msgsafe[demo]'``), which prints its URL
and runs until Ctrl-C:

    python3 -m msgsafe.cluster.tansu 1        # -> kafka://127.0.0.1:PORT

(``msgsafe demo`` runs the same broker, kills it mid-run and shows lost = 0.)

Without TOPIC the example creates a fresh 3-partition topic. The key picks the
partition, so each key's messages stay in order while different keys are spread over
partitions and consumed in parallel. msgsafe keeps this order also when some
messages detour through the outbox: a later message of a key that has one waiting
there queues behind it instead of overtaking it.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgsafe

KEYS = ("customer-1", "customer-2", "customer-3", "customer-4")
PER_KEY = 50


def create_topic(url: str, topic: str, partitions: int = 3) -> None:
    """Create ``topic`` (plain ``kafka://`` URLs); topic creation is an admin task that
    msgsafe leaves to you, so this uses confluent-kafka's AdminClient directly."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": url.removeprefix("kafka://").split("?")[0]})
    # Replication 3 with min.insync.replicas=2 where the cluster has three brokers (what
    # `msgsafe doctor` asks for); a one-broker demo cluster can only hold one copy.
    brokers = len(admin.list_topics(timeout=10).brokers)
    replication = min(3, brokers)
    config = {"min.insync.replicas": str(min(2, replication))}
    admin.create_topics([NewTopic(topic, partitions, replication, config=config)])[topic].result(30)
    deadline = time.monotonic() + 30
    while not admin.list_topics(topic, timeout=5).topics[topic].partitions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions yet")
        time.sleep(0.1)


def main(url: str, topic: str | None = None) -> int:
    if topic is None:
        topic = f"keys-{uuid.uuid4().hex[:8]}"
        if url.startswith("kafka://"):
            create_topic(url, topic)
            print(f"created topic {topic}")

    with tempfile.TemporaryDirectory() as tmp:
        with msgsafe.Producer(url, outbox=Path(tmp) / "outbox.db") as producer:
            # send_async keeps many messages in flight; the order per key still holds.
            futures = [
                producer.send_async(topic, f"{key} #{n}".encode(), key=key)
                for n in range(PER_KEY)
                for key in KEYS
            ]
            receipts = [f.result(60) for f in futures]
            if producer.drain(timeout=60):
                print("outbox not empty after 60 s", file=sys.stderr)
                return 1
        statuses = collections.Counter(r.status.name for r in receipts)
        print(f"sent {len(receipts)}: " + ", ".join(f"{s} {n}" for s, n in statuses.items()))

    # auto_offset_reset=earliest (the default): a new group starts at the beginning.
    seen: dict[str, list[int]] = collections.defaultdict(list)
    with msgsafe.Consumer(url, group=f"{topic}-reader", dedup=True) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 60
        while sum(map(len, seen.values())) < len(receipts) and time.monotonic() < deadline:
            for delivery in consumer.poll(1.0, max_messages=100):
                key, number = delivery.body.decode().split(" #")
                seen[key].append(int(number))
                delivery.ack()

    ok = True
    for key in KEYS:
        numbers = seen.get(key, [])
        in_order = numbers == sorted(numbers) and len(numbers) == PER_KEY
        ok = ok and in_order
        print(f"{key}: received {len(numbers)} of {PER_KEY}, in order: {in_order}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
