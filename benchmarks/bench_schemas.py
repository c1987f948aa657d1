"""Serializing sends: msgsafe against confluent-kafka's SerializingProducer, with the same
AvroSerializer against the same schema registry.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_schemas.py \
        [--messages 50000] [--rounds 6] [--readme benchmarks/README.md]

Starts one Kafka node and one schema registry (Apicurio, ``msgsafe cluster``) on loopback
and runs, alternating, the same loop: 16 keys, a record of four fields (Avro, confluent's
``AvroSerializer`` with the schema registered before the clock starts, as a long-lived
producer has), ``acks=all`` and idempotence, then ``flush``. Variants:

- ``SerializingProducer``: confluent-kafka's, ``produce(topic, key, value)`` and
  ``poll(0)`` every 1,000;
- ``drop-in``: ``msgsafe.compat.confluent_kafka.SerializingProducer``, the same loop
  (outbox on);
- ``Producer(serializer=)``: ``msgsafe.Producer`` with ``serializer=AvroSerializer``,
  ``send_async`` per record, then ``flush`` (outbox on).

The limit each msgsafe variant is measured against, in the same rounds:

- ``serializer alone``: the key's ``StringSerializer`` and the value's
  ``AvroSerializer`` on every record, nothing sent: what any serializing producer
  spends before it produces;
- ``Producer (bytes)``, ``drop-in (bytes)``, ``Producer.send_async (bytes)``:
  confluent-kafka's plain ``Producer``, msgsafe's drop-in and ``msgsafe.Producer`` on
  the same records serialized before the clock starts.

A serializing send costs its serializer plus its plain send, so the fastest a msgsafe
variant can go is ``1 / (1/plain + 1/serializer)`` of its own plain send: its limit,
shown as a ratio to ``SerializingProducer`` beside the measured one (and the same sum for
confluent's plain ``Producer``, which checks that the sum predicts
``SerializingProducer`` itself).

One warm-up run each, then ``--rounds`` rounds in ABBA order. Goal: msgsafe /
SerializingProducer >= 0.9 for both msgsafe variants, read as the median of the
per-round wall-rate ratios; CPU per message (``time.process_time``, every thread of this
process) shown beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
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
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from benchmarks.bench_compat import Run, abba_rounds
from msgsafe import Producer
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.registry import RegistryCluster
from msgsafe.compat import confluent_kafka as compat_kafka

SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "customer", "type": "string"},
            {"name": "amount", "type": "long"},
            {"name": "currency", "type": "string"},
        ],
    }
)

REAL, DROP_IN, PRODUCER = "SerializingProducer", "drop-in", "Producer(serializer=)"
SERIALIZER = "serializer alone"
RAW_BYTES, DROP_IN_BYTES, PRODUCER_BYTES = (
    "Producer (bytes)",
    "drop-in (bytes)",
    "Producer.send_async (bytes)",
)
#: Each serializing variant, and the plain send of the same bytes its limit sums.
PAIRS = {
    f"{DROP_IN} / {REAL}": (DROP_IN, REAL, DROP_IN_BYTES),
    f"{PRODUCER} / {REAL}": (PRODUCER, REAL, PRODUCER_BYTES),
}
VARIANTS = (REAL, DROP_IN, PRODUCER, SERIALIZER, RAW_BYTES, DROP_IN_BYTES, PRODUCER_BYTES)
GOAL = 0.9


def _orders(count: int) -> list[dict[str, Any]]:
    return [
        {"id": f"o-{i}", "customer": f"c-{i % 97}", "amount": i, "currency": "EUR"}
        for i in range(count)
    ]


def _run(variant: str, kafka: KafkaCluster, registry: str, count: int, outbox: Path) -> Run:
    topic = f"bench-schemas-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=3, replication=1)
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry}), SCHEMA)
    keys = [f"k{i}" for i in range(16)]
    orders = _orders(count)
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        failed[0] += err is not None

    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "key.serializer": confluent_kafka.serialization.StringSerializer(),
        "value.serializer": serializer,
    }
    if variant in (SERIALIZER, RAW_BYTES, DROP_IN_BYTES, PRODUCER_BYTES):
        return _plain(variant, kafka, topic, serializer, keys, orders, outbox)
    if variant == PRODUCER:
        producer: Any = Producer(kafka.url, outbox=outbox, serializer=serializer)
        # A long-lived producer has checked its topic and registered its schema already.
        for key in keys:
            producer.send(topic, orders[0], key=key)
        start, cpu = time.perf_counter(), time.process_time()
        send = producer.send_async
        futures = [send(topic, order, key=keys[i % 16]) for i, order in enumerate(orders)]
        producer.flush(120)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        failed[0] = sum(f.exception() is not None for f in futures)
        producer.close()
    else:
        if variant == DROP_IN:
            producer = compat_kafka.SerializingProducer({**config, "msgsafe.outbox": str(outbox)})
        else:
            producer = confluent_kafka.SerializingProducer(config)
        for key in keys:
            producer.produce(topic, key=key, value=orders[0], on_delivery=report)
        assert producer.flush(60) == 0, "warm-up not delivered"
        start, cpu = time.perf_counter(), time.process_time()
        for i, order in enumerate(orders):
            producer.produce(topic, key=keys[i % 16], value=order, on_delivery=report)
            if i % 1000 == 999:
                producer.poll(0)
        left = producer.flush(120)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert left == 0, f"{left} unreported"
        producer.close()
    assert failed[0] == 0, f"{failed[0]} failed"
    return Run(count / wall, cpu / count * 1e6)


def _plain(
    variant: str,
    kafka: KafkaCluster,
    topic: str,
    serializer: AvroSerializer,
    keys: list[str],
    orders: list[dict[str, Any]],
    outbox: Path,
) -> Run:
    """The limit's parts: :data:`SERIALIZER` times what ``SerializingProducer.produce``
    does before it produces; the ``(bytes)`` variants send the same records serialized
    before the clock starts."""
    strings = confluent_kafka.serialization.StringSerializer()
    value_ctx = SerializationContext(topic, MessageField.VALUE)
    key_ctx = SerializationContext(topic, MessageField.KEY)
    count = len(orders)
    if variant == SERIALIZER:
        start, cpu = time.perf_counter(), time.process_time()
        for i, order in enumerate(orders):
            strings(keys[i % 16], key_ctx)
            serializer(order, value_ctx)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return Run(count / wall, cpu / count * 1e6)
    values = [serializer(order, value_ctx) for order in orders]
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        failed[0] += err is not None

    if variant == PRODUCER_BYTES:
        producer: Any = Producer(kafka.url, outbox=outbox)
        for key in keys:
            producer.send(topic, values[0], key=key)
        start, cpu = time.perf_counter(), time.process_time()
        send = producer.send_async
        futures = [send(topic, value, key=keys[i % 16]) for i, value in enumerate(values)]
        producer.flush(120)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        failed[0] = sum(f.exception() is not None for f in futures)
        producer.close()
    else:
        config: dict[str, Any] = {
            "bootstrap.servers": kafka.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
        }
        if variant == DROP_IN_BYTES:
            producer = compat_kafka.Producer({**config, "msgsafe.outbox": str(outbox)})
        else:
            producer = confluent_kafka.Producer(config)
        key_bytes = [key.encode() for key in keys]
        for warm in key_bytes:
            producer.produce(topic, values[0], warm, on_delivery=report)
        assert producer.flush(60) == 0, "warm-up not delivered"
        start, cpu = time.perf_counter(), time.process_time()
        for i, value in enumerate(values):
            producer.produce(topic, value, key_bytes[i % 16], on_delivery=report)
            if i % 1000 == 999:
                producer.poll(0)
        left = producer.flush(120)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert left == 0, f"{left} unreported"
        producer.close()
    assert failed[0] == 0, f"{failed[0]} failed"
    return Run(count / wall, cpu / count * 1e6)


def _summed(plain: Run, serializer: Run) -> float:
    """The rate of a send that costs ``plain``'s send plus ``serializer``'s work."""
    return 1 / (1 / plain.rate + 1 / serializer.rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--readme", type=Path, help="write the figures into this README")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.UTC)
    work = Path(tempfile.mkdtemp(prefix="bench-schemas-"))
    kafka = KafkaCluster(nodes=1, dir=work / "kafka")
    registry = RegistryCluster(dir=work / "registry")
    try:
        RegistryCluster.fetch()
        registry.start()
        kafka.start()
        n = args.messages
        variants: dict[str, Callable[[int], Run]] = {
            name: (
                lambda d, name=name: _run(  # type: ignore[misc]
                    name, kafka, registry.url, n // d, work / f"{uuid.uuid4().hex}.sqlite3"
                )
            )
            for name in VARIANTS
        }
        runs = abba_rounds(variants, args.rounds)
    finally:
        kafka.stop()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = report(runs, args, started, load_start)
    print(text)
    if args.readme:
        replace_section(
            args.readme,
            "## Serializing sends (schema registry)\n\n`flock /tmp/msgsafe-bench.lock python "
            "benchmarks/bench_schemas.py --readme benchmarks/README.md`\n\n" + text + "\n",
        )
    return 0


def report(
    runs: dict[str, list[Run]],
    args: argparse.Namespace,
    started: datetime.datetime,
    load_start: float,
) -> str:
    """The README section's body: the setting, the tables, whether the goal was met."""
    lines = [
        f"Measured {started:%Y-%m-%d %H:%M} to {datetime.datetime.now(datetime.UTC):%H:%M} UTC "
        f"on {os.cpu_count()} cores, load average {load_start:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (the machine is shared), Python "
        f"{platform.python_version()}, confluent-kafka {confluent_kafka.__version__}; one "
        f"Kafka node and Apicurio Registry on loopback; {args.messages:,} Avro records per "
        f"run, one warm-up run each, then {args.rounds} rounds in ABBA order.",
        "",
        "| variant | msg/s (mean) | CPU µs/msg (median) | msg/s by round |",
        "|---|---:|---:|---|",
    ]
    for name, rs in runs.items():
        lines.append(
            f"| {name} | {statistics.mean(r.rate for r in rs):,.0f} "
            f"| {statistics.median(r.cpu_us for r in rs):.1f} "
            f"| {', '.join(f'{r.rate:,.0f}' for r in rs)} |"
        )
    lines += [
        "",
        "| ratio | wall, median of rounds | wall by round | CPU/msg real ÷ msgsafe (median) "
        f"| limit: own plain send + serializer (median) | goal ≥ {GOAL} |",
        "|---|---:|---|---:|---:|---|",
    ]
    serializer = runs[SERIALIZER]
    for label, (a, b, plain) in PAIRS.items():
        pairs = list(zip(runs[a], runs[b], strict=True))
        wall = [x.rate / y.rate for x, y in pairs]
        cpu = statistics.median(y.cpu_us / x.cpu_us for x, y in pairs)
        limit = statistics.median(
            _summed(p, s) / y.rate for p, s, y in zip(runs[plain], serializer, runs[b], strict=True)
        )
        met = "met" if statistics.median(wall) >= GOAL else "NOT met"
        if met == "NOT met" and limit < GOAL:
            met = f"NOT met; the limit is {limit:.2f}"
        lines.append(
            f"| {label} | {statistics.median(wall):.3f} "
            f"| {', '.join(f'{w:.2f}' for w in wall)} | {cpu:.2f} | {limit:.3f} | {met} |"
        )
    model = statistics.median(
        _summed(p, s) / y.rate
        for p, s, y in zip(runs[RAW_BYTES], serializer, runs[REAL], strict=True)
    )
    lines.append(
        f"| {RAW_BYTES} + {SERIALIZER} / {REAL} (the sum, checked on confluent-kafka) "
        f"| {model:.3f} | | | | |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
