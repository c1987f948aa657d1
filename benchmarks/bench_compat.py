"""The drop-in wrappers against the clients they replace, with the same guarantees.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat.py \
        [--pika-messages 2000] [--kafka-messages 20000] [--rounds 3] [--readme benchmarks/README.md]

Starts one RabbitMQ node and one Kafka node on loopback (``msgsafe.cluster``) and runs,
alternating, the same legacy publishing loop through each client:

- ``pika``: ``BlockingConnection``, ``confirm_delivery()``, each ``basic_publish``
  (``mandatory=True``, persistent, 100 bytes) waits for its confirm, to a fresh quorum
  queue; the wrapper (``msgsafe.compat.pika``, outbox on) waits the same way (confirmed
  or stored). ``wrapper pipelined`` is the opt-in (``pipelined=True``; ``close()``,
  which waits for every confirm, is timed too).
- ``kafka``: ``Producer`` with ``acks=all`` and ``enable.idempotence``, ``produce`` of
  100-byte values keyed over 16 keys, ``poll(0)`` every 1,000, ``flush()``; the wrapper
  (``msgsafe.compat.confluent_kafka``, outbox on) runs the same loop.

Goal: wrapper / real client >= 0.95 for both (ratio of the means; the ratio of the
medians is shown too, as one slow round on the shared machine moves a mean).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import confluent_kafka as compat_kafka
from msgsafe.compat import pika as compat_pika

BODY = b"x" * 100
GOAL = 0.95


def _pika_run(module: Any, port: int, count: int, outbox: Path, **extra: Any) -> float:
    """Messages per second of the publishing loop (and the wrapper's closing wait)."""
    params = pika.ConnectionParameters("127.0.0.1", port)
    setup = pika.BlockingConnection(params)
    queue = f"bench-compat-{uuid.uuid4().hex[:8]}"
    setup.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    if module is compat_pika:
        conn = module.BlockingConnection(params, outbox=outbox, **extra)
    else:
        conn = module.BlockingConnection(params)
    channel = conn.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream")
    started = time.perf_counter()
    for _ in range(count):
        channel.basic_publish("", queue, BODY, props, mandatory=True)
    if extra.get("pipelined"):
        conn.close()
    seconds = time.perf_counter() - started
    if conn.is_open:
        conn.close()
    got = setup.channel().queue_declare(queue, passive=True).method.message_count
    assert got == count, f"{got} of {count} messages in the queue"
    setup.channel().queue_delete(queue)
    setup.close()
    return count / seconds


def _kafka_run(module: Any, cluster: KafkaCluster, count: int, outbox: Path) -> float:
    topic = f"bench-compat-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=3, replication=1)
    config: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
    }
    if module is compat_kafka:
        config["msgsafe.outbox"] = str(outbox)
    producer = module.Producer(config)
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        failed[0] += err is not None

    keys = [f"k{i}".encode() for i in range(16)]
    started = time.perf_counter()
    for i in range(count):
        producer.produce(topic, BODY, key=keys[i % 16], on_delivery=report)
        if i % 1000 == 999:
            producer.poll(0)
    left = producer.flush(60)
    seconds = time.perf_counter() - started
    assert left == 0 and failed[0] == 0, f"{left} unreported, {failed[0]} failed"
    if module is compat_kafka:
        producer.close()
    return count / seconds


def _rounds(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_no in range(rounds):
        order = list(variants) if round_no % 2 == 0 else list(reversed(variants))
        for name in order:
            rate = variants[name]()
            rates[name].append(rate)
            print(f"round {round_no + 1} {name:>24}: {rate:>10,.0f} msg/s", flush=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pika-messages", type=int, default=2000)
    parser.add_argument("--kafka-messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--readme", type=Path, help="write the figures into this README")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-compat-"))
    rabbit = RabbitCluster(size=1, dir=work / "rabbit")
    kafka = KafkaCluster(nodes=1, dir=work / "kafka")
    rabbit.start()
    try:
        kafka.start()
        try:
            port, n_pika, n_kafka = rabbit.port(0), args.pika_messages, args.kafka_messages
            # One outbox file per client, as two programs would have.
            pika_outbox, kafka_outbox = work / "pika.sqlite3", work / "kafka.sqlite3"
            rates = _rounds(
                {
                    "pika": lambda: _pika_run(pika, port, n_pika, pika_outbox),
                    "pika wrapper": lambda: _pika_run(compat_pika, port, n_pika, pika_outbox),
                    "pika wrapper pipelined": lambda: _pika_run(
                        compat_pika, port, n_pika, pika_outbox, pipelined=True
                    ),
                    "kafka": lambda: _kafka_run(confluent_kafka, kafka, n_kafka, kafka_outbox),
                    "kafka wrapper": lambda: _kafka_run(compat_kafka, kafka, n_kafka, kafka_outbox),
                },
                args.rounds,
            )
        finally:
            kafka.stop()
    finally:
        rabbit.stop()
        shutil.rmtree(work, ignore_errors=True)
    mean = {name: statistics.mean(values) for name, values in rates.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    pairs = {
        "pika wrapper / pika": ("pika wrapper", "pika"),
        "pika wrapper pipelined / pika": ("pika wrapper pipelined", "pika"),
        "kafka wrapper / kafka": ("kafka wrapper", "kafka"),
    }
    ratios = {name: (mean[a] / mean[b], median[a] / median[b]) for name, (a, b) in pairs.items()}
    lines = [
        f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{os.cpu_count()} cores, load average {load_start:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (the machine is shared), Python "
        f"{platform.python_version()}, pika {pika.__version__}, confluent-kafka "
        f"{confluent_kafka.version()}; {args.rounds} alternating rounds, mean shown.",
        "",
        "| variant | msg/s (mean) | rounds |",
        "|---|---|---|",
        *(
            f"| {name} | {mean[name]:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |"
            for name, values in rates.items()
        ),
        "",
        "| ratio | of means | of medians | goal |",
        "|---|---|---|---|",
        *(
            f"| {name} | {by_mean:.2f} | {by_median:.2f} "
            f"| {'>= 0.95' if 'pipelined' not in name else ''} |"
            for name, (by_mean, by_median) in ratios.items()
        ),
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        _write_readme(args.readme, text)
    return 0


def _write_readme(path: Path, body: str) -> None:
    """Replace the ``## Drop-in wrappers`` section of ``path`` (added if missing)."""
    section = (
        "## Drop-in wrappers\n\n`flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat.py "
        "--readme benchmarks/README.md`\n\n" + body + "\n"
    )
    replace_section(path, section)


if __name__ == "__main__":
    sys.exit(main())
