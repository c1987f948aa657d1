"""Where the Kafka consumer spends CPU beside the raw confluent-kafka loop, without a
broker: every side reads the same prebuilt ``confluent_kafka.Message`` records (100-byte
bodies, a ``msgsafe-id`` header, 16 keys, 3 partitions in runs of ``--batch``) from a
stand-in for ``confluent_kafka.Consumer`` whose ``consume`` hands out a list and whose
``store_offsets`` / ``commit`` do nothing:

    python3 benchmarks/bench_consume_cpu.py [--messages 200000] [--rounds 3] [--profile]

Sides: ``raw`` (per message ``error()``, ``value()``, ``store_offsets``), ``floor`` (a
slotted object per message, its ``ack()`` storing the offset), msgsafe's ``poll+ack``,
``dedup`` and ``run x4`` (a no-op handler). Printed: CPU µs a message
(``time.process_time()``, every thread), best of the rounds; ``--profile``: cProfile of
``poll+ack`` and ``dedup`` on the caller's thread. What librdkafka itself costs (the
fetch, the offset store, the commit) is left out on every side: the figures are the
Python-side cost each side adds to it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Message

import msgsafe
from msgsafe.adapters.kafka import receiver as kafka_receiver

BATCH = 500
BODY = b"x" * 100
KEYS = [f"key-{i}".encode() for i in range(16)]
TOPIC = "cpu"


def records(count: int, batch: int) -> list[list[Message]]:
    """``count`` records in consume() batches of ``batch``, each a run of one partition
    (as librdkafka hands out a fetch), the partitions in turn."""
    out: list[list[Message]] = []
    offsets = [0, 0, 0]
    n = 0
    while n < count:
        partition = len(out) % 3
        size = min(batch, count - n)
        start = offsets[partition]
        out.append(
            [
                Message(
                    topic=TOPIC,
                    partition=partition,
                    offset=start + i,
                    key=KEYS[(n + i) & 15],
                    value=BODY,
                    headers=[("msgsafe-id", f"id-{n + i:08d}".encode())],
                )
                for i in range(size)
            ]
        )
        offsets[partition] += size
        n += size
    return out


class FakeConsumer:
    """What the sides call of ``confluent_kafka.Consumer``: ``consume`` hands out the
    next prebuilt batch (an empty list once they are out)."""

    def __init__(self, batches: list[list[Message]]) -> None:
        self._batches = batches
        self._next = 0
        self._at = 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self._next >= len(self._batches):
            time.sleep(max(0.0, timeout))  # nothing more: a real consume() blocks
            return []
        batch = self._batches[self._next]
        out = batch[self._at : self._at + num_messages]
        self._at += len(out)
        if self._at >= len(batch):
            self._next, self._at = self._next + 1, 0
        return out

    def store_offsets(self, message: Message | None = None, offsets: Any = None) -> None:
        return None

    def commit(self, *args: Any, **kwargs: Any) -> None:
        return None

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        return None

    def seek(self, *args: Any) -> None:
        return None

    def close(self) -> None:
        return None


def raw(batches: list[list[Message]], count: int) -> None:
    consumer = FakeConsumer(batches)
    consume, store = consumer.consume, consumer.store_offsets
    seen = 0
    while seen < count:
        for message in consume(BATCH, 1.0):
            if message.error() is not None:
                continue
            message.value()
            store(message)
            seen += 1


class Handed:
    __slots__ = ("body", "message", "store")

    def __init__(self, message: Message, store: Callable[[Message], None]) -> None:
        self.message = message
        self.body = message.value()
        self.store = store

    def ack(self) -> None:
        self.store(self.message)


def floor(batches: list[list[Message]], count: int) -> None:
    consumer = FakeConsumer(batches)
    consume, store = consumer.consume, consumer.store_offsets
    seen = 0
    while seen < count:
        batch = [Handed(m, store) for m in consume(BATCH, 1.0) if m.error() is None]
        for handed in batch:
            handed.ack()
        seen += len(batch)


def consumer(batches: list[list[Message]], **options: Any) -> msgsafe.Consumer:
    """A msgsafe consumer whose receiver reads ``batches`` (no broker is asked)."""
    made = msgsafe.Consumer(
        "kafka://127.0.0.1:1", group="cpu", **options, librdkafka={"log_level": 0}
    )
    receiver = made._receiver
    assert isinstance(receiver, kafka_receiver.KafkaReceiver)
    receiver._consumer.close()
    receiver._consumer = FakeConsumer(batches)  # type: ignore[assignment]
    made.subscribe(TOPIC)
    made._reach.reached = True
    return made


def poll_ack(batches: list[list[Message]], count: int, **options: Any) -> None:
    with consumer(batches, **options) as reader:
        poll, seen = reader.poll, 0
        while seen < count:
            batch = poll(1.0, max_messages=BATCH)
            for delivery in batch:
                delivery.ack()
            seen += len(batch)


def dedup(batches: list[list[Message]], count: int) -> None:
    poll_ack(batches, count, dedup=True)


def run4(batches: list[list[Message]], count: int) -> None:
    reader = consumer(batches)
    lock = threading.Lock()
    seen = 0

    def handler(_delivery: Any) -> None:
        nonlocal seen
        with lock:
            seen += 1
            if seen == count:
                reader.stop()

    reader.run(handler, concurrency=4, handle_signals=False)
    if seen != count:
        raise SystemExit(f"run x4: {seen} of {count}")


SIDES: dict[str, Callable[[list[list[Message]], int], None]] = {
    "raw": raw,
    "floor": floor,
    "poll+ack": poll_ack,
    "dedup": dedup,
    "run x4": run4,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH, help="records per consume()")
    parser.add_argument("--only", action="append", choices=list(SIDES))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    count = args.messages
    wanted = args.only or list(SIDES)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name in wanted:
            batches = records(count, args.batch)
            cpu = time.process_time()
            SIDES[name](batches, count)
            us = (time.process_time() - cpu) / count * 1e6
            best[name] = min(best.get(name, us), us)
    for name in wanted:
        print(f"{name:>9}: {best[name]:5.2f} µs CPU a message (best of {args.rounds})")
    if args.profile:
        for name in ("poll+ack", "dedup"):
            if name not in wanted:
                continue
            batches = records(count, args.batch)
            profiler = cProfile.Profile()
            profiler.enable()
            SIDES[name](batches, count)
            profiler.disable()
            print(f"\n--- {name}")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
