"""The cost of the destination checks (``require=``, ``receipt.guarantee``): what one
check costs per destination, and what the gate adds to every message, in one run.

    python benchmarks/bench_checks.py [--checks 20] [--sends 200000] [--readme benchmarks/README.md]

One RabbitMQ node and one Kafka node are started on loopback (``msgsafe.cluster``).

- **Per destination**: the check the producer runs before a destination's first message
  (and every ``check_every`` seconds, in the background), timed ``--checks`` times per
  kind of destination: an AMQP 0-9-1 quorum queue, the same queue as an AMQP 1.0
  ``/amq/queue/`` address, a Kafka topic with three partitions, and a Kafka topic that
  does not exist yet (its broker defaults). Median and maximum, in milliseconds.
- **Per message**: what the gate does for each message once its destination is
  admitted (one dict read and a clock read), against a ``send_async`` of the same
  producer into the in-process broker (``retain=False``: the SDK's own cost, no I/O),
  measured alternately in rounds; reported as nanoseconds and as a share of the send.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika

from benchmarks._readme import replace_section
from msgsafe import Producer
from msgsafe.checks import inspector_for
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import new_message_id
from msgsafe.testing import MemoryBroker


def _time_checks(url: str, destination: str, count: int) -> list[float]:
    inspect = inspector_for(parse_url(url), {})
    took = []
    for _ in range(count):
        start = time.perf_counter()
        inspect(destination)
        took.append((time.perf_counter() - start) * 1000)
    return took


def _per_message(sends: int, rounds: int = 10) -> tuple[float, float]:
    """(gate ns per message, send_async ns per message): medians of alternated rounds."""
    broker = MemoryBroker.install(MemoryBroker(f"bench-{new_message_id()}", retain=False))
    gate_ns, send_ns = [], []
    with Producer(f"memory://{broker.name}", outbox=False) as producer:
        producer.send("q", b"x")
        # The hot path's own read (Producer._tracked), timed alone.
        admitted = producer._admitted
        monotonic = time.monotonic
        for _ in range(rounds):
            start = time.perf_counter_ns()
            for _ in range(sends):
                due = admitted.get("q")
                if due is None or due < monotonic():
                    raise AssertionError("the destination fell out of the gate")
            gate_ns.append((time.perf_counter_ns() - start) / sends)
            start = time.perf_counter_ns()
            for _ in range(sends):
                producer.send_async("q", b"x")
            producer.flush()
            send_ns.append((time.perf_counter_ns() - start) / sends)
    MemoryBroker.forget(broker.name)
    return statistics.median(gate_ns), statistics.median(send_ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=20)
    parser.add_argument("--sends", type=int, default=200_000)
    parser.add_argument("--readme", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rabbit = RabbitCluster(nodes=1, dir=Path(tmp) / "rabbit")
        kafka = KafkaCluster(nodes=1, dir=Path(tmp) / "kafka")
        print("starting one RabbitMQ node and one Kafka node ...", flush=True)
        rabbit.start()
        try:
            kafka.start()
            try:
                queue = f"bench-{new_message_id()}"
                connection = pika.BlockingConnection(
                    pika.ConnectionParameters("127.0.0.1", rabbit.port(0))
                )
                connection.channel().queue_declare(
                    queue, durable=True, arguments={"x-queue-type": "quorum"}
                )
                connection.close()
                topic = f"bench-{new_message_id()}"
                kafka.create_topic(topic, partitions=3, replication=1)
                rows = [
                    ("AMQP 0-9-1 quorum queue", rabbit.node_url(0), queue),
                    (
                        "AMQP 1.0 /amq/queue/ (RabbitMQ)",
                        rabbit.amqp10_url(0),
                        f"/amq/queue/{queue}",
                    ),
                    ("Kafka topic", kafka.url, topic),
                    ("Kafka topic not created yet", kafka.url, f"missing-{new_message_id()}"),
                ]
                checks = []
                for label, url, destination in rows:
                    took = _time_checks(url, destination, args.checks)
                    checks.append((label, statistics.median(took), max(took)))
                    print(f"{label}: median {checks[-1][1]:.1f} ms, max {checks[-1][2]:.1f} ms")
            finally:
                kafka.stop()
        finally:
            rabbit.stop()
    gate, send = _per_message(args.sends)
    print(f"gate per message {gate:.0f} ns; send_async {send:.0f} ns; share {gate / send:.2%}")

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Destination checks",
        "",
        f"Measured {when} on {platform.node()} (2 cores), `python3 benchmarks/bench_checks.py"
        f" --checks {args.checks} --sends {args.sends}`: one RabbitMQ 3.10 node and one Apache "
        "Kafka node on loopback.",
        "",
        "| check, once per destination per `check_every` | median ms | max ms |",
        "|---|---:|---:|",
        *[f"| {label} | {median:.1f} | {worst:.1f} |" for label, median, worst in checks],
        "",
        "| per message, destination admitted | ns |",
        "|---|---:|",
        f"| the gate (one dict read, one clock read) | {gate:.0f} |",
        f"| `send_async` into the in-process broker (SDK cost alone) | {send:.0f} |",
        f"| share of the send | {gate / send:.2%} |",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if args.readme is not None:
        replace_section(args.readme, section)


if __name__ == "__main__":
    main()
