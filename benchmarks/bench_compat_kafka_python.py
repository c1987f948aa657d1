"""msgsafe.compat.kafka_python against kafka-python's own KafkaProducer, same guarantees.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_kafka_python.py \
        [--messages 20000] [--rounds 4]

Starts one Kafka node on loopback (``msgsafe.cluster``) and runs, alternating (ABBA),
the same legacy loop through each client: ``send(topic, value, key=...)`` of 100-byte
values keyed over 16 keys, one ``add_callback`` per future counting the successes,
``flush()`` at the end. The real client runs with ``acks='all'`` and idempotence (its
3.x defaults, what the wrapper enforces) and carries the same id header per message as
the wrapper (``msgsafe-id``, a UUIDv7 made per message); the wrapper runs with its
outbox on. Each producer sends one message per key before the clock starts (connections
and the producer id). Prints the rates and the median of the per-round ratios
(wrapper / real, goal >= 0.9) and the CPU per message of this process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kafka

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import kafka_python
from msgsafe.message import MESSAGE_ID_HEADER, new_message_id

KEYS = [f"key-{i}".encode() for i in range(16)]
VALUE = b"x" * 100


def _run(
    make: Callable[[], Any], topic: str, count: int, *, id_header: bool
) -> tuple[float, float]:
    """(messages per second, CPU microseconds per message) of one run."""
    producer = make()
    for key in KEYS:  # warm: connections, producer id, metadata
        producer.send(topic, VALUE, key=key).get(timeout=60)
    done = [0]

    def count_one(_md: Any) -> None:
        done[0] += 1

    started, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        headers = [(MESSAGE_ID_HEADER, new_message_id().encode())] if id_header else None
        producer.send(topic, VALUE, key=KEYS[i & 15], headers=headers).add_callback(count_one)
    producer.flush()
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    producer.close()
    assert done[0] == count, f"{done[0]} of {count} succeeded"
    return count / wall, used / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", DeprecationWarning)
    cluster = KafkaCluster(nodes=1)
    cluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kp-") as tmp:
            base = {"bootstrap_servers": cluster.bootstrap, "acks": "all", "linger_ms": 5}
            variants: dict[str, Callable[[], Any]] = {
                "kafka-python": lambda: kafka.KafkaProducer(**base, enable_idempotence=True),
                "wrapper": lambda: kafka_python.KafkaProducer(
                    **base, msgsafe_outbox=str(Path(tmp) / f"o-{uuid.uuid4().hex[:6]}.sqlite3")
                ),
            }
            topic = f"bench-kp-{uuid.uuid4().hex[:8]}"
            cluster.create_topic(topic, partitions=3)
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            order = list(variants)
            for name in order:  # warm-up, unmeasured
                _run(variants[name], topic, args.messages // 4, id_header=name == "kafka-python")
            for round_no in range(args.rounds):
                for name in order if round_no % 2 == 0 else reversed(order):
                    runs[name].append(
                        _run(variants[name], topic, args.messages, id_header=name == "kafka-python")
                    )
    finally:
        cluster.stop()
    ratios = [w[0] / r[0] for w, r in zip(runs["wrapper"], runs["kafka-python"], strict=True)]
    for name, got in runs.items():
        rates = ", ".join(f"{rate:,.0f}" for rate, _ in got)
        cpu = statistics.median(c for _, c in got)
        print(f"{name:13} msg/s per round: {rates}  (median CPU {cpu:.1f} µs/msg)")
    print(f"wrapper / kafka-python, median of per-round ratios: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
