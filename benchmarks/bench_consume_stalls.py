"""Where a Kafka read's wall time goes: every ``consume()`` call timed, beside the
reader's own CPU, for the raw loop and msgsafe's ``poll`` + ``ack()`` with librdkafka's
default prefetch backoff and with msgsafe's:

    flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_consume_stalls.py
        [--rounds 3] [--messages 200000] [--url kafka://...]

One Kafka node (``KafkaCluster(nodes=1)``, or ``--url``), one topic of 3 partitions
filled once by msgsafe's producer as in ``bench_consume.py``; every run reads all of it
as a new consumer group, in batches of 500. Sides:

- ``raw``: ``bench_consume.py``'s raw loop (``consume(500, 1.0)``, ``store_offsets``).
- ``poll+ack 1000ms``: ``msgsafe.Consumer(librdkafka={"fetch.queue.backoff.ms":
  "1000"})``, librdkafka's default: how the consumer read before.
- ``poll+ack``: ``msgsafe.Consumer`` as it is (``fetch.queue.backoff.ms`` 20).

Printed per run: msg/s; seconds inside ``consume()`` (the reader waiting for
librdkafka) and the reading thread's CPU (``time.thread_time()``, the Python side); the
longest ``consume()`` calls (ms, messages, ms since the first message) and the calls
that returned fewer than 500 (a 0.5 s slice ran out). librdkafka pauses fetching a
partition for ``fetch.queue.backoff.ms`` once the reader falls ``queued.min.messages``
behind; a reader that then drains the queue waits out the rest of the pause.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgsafe
from benchmarks.bench_consume import BATCH, _raw_consumer, fill


@dataclass
class Timed:
    """A consumer whose ``consume()`` is timed call by call."""

    inner: Any
    calls: list[tuple[float, int, float]] = field(default_factory=list)
    inside: float = 0.0
    zero: float = 0.0

    def consume(self, num_messages: int, timeout: float) -> Any:
        started = time.perf_counter()
        messages = self.inner.consume(num_messages, timeout)
        took = time.perf_counter() - started
        if self.zero:
            self.inside += took
            self.calls.append((took, len(messages), started - self.zero))
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Run:
    wall: float
    cpu: float
    timed: Timed

    def line(self, name: str, count: int) -> str:
        longest = sorted(self.timed.calls, reverse=True)[:3]
        partial = [c for c in self.timed.calls if c[1] < BATCH and c is not self.timed.calls[-1]]
        shown = ", ".join(f"{t * 1e3:.0f} ms/{n} @{at * 1e3:.0f}" for t, n, at in longest)
        short = ", ".join(f"{t * 1e3:.0f} ms/{n} @{at * 1e3:.0f}" for t, n, at in partial[:3])
        return (
            f"  {name:16s} {count / self.wall:9,.0f} msg/s  wall {self.wall:.2f} s, "
            f"in consume() {self.timed.inside:.2f} s, reader CPU {self.cpu:.2f} s; "
            f"longest: {shown}; partial: {short or 'none'}"
        )


def read_raw(bootstrap: str, topic: str, count: int) -> Run:
    consumer = _raw_consumer(bootstrap)
    consumer.subscribe([topic])
    timed, seen = Timed(consumer), 0
    wall = cpu = 0.0
    try:
        while seen < count:
            messages = timed.consume(BATCH, 1.0)
            if messages and not timed.zero:
                timed.zero = wall = time.perf_counter()
                cpu = time.thread_time()
            for message in messages:
                if message.error() is None:
                    message.value()
                    consumer.store_offsets(message)
                    seen += 1
        return Run(time.perf_counter() - wall, time.thread_time() - cpu, timed)
    finally:
        consumer.close()


def read_msgsafe(url: str, topic: str, count: int, **options: Any) -> Run:
    with msgsafe.Consumer(url, group=f"stalls-{uuid.uuid4().hex[:8]}", **options) as consumer:
        consumer.subscribe(topic)
        receiver: Any = consumer._receiver
        timed = receiver._consumer = Timed(receiver._consumer)
        seen = 0
        wall = cpu = 0.0
        while seen < count:
            batch = consumer.poll(1.0, max_messages=BATCH)
            if batch and not timed.zero:
                timed.zero = wall = time.perf_counter()
                cpu = time.thread_time()
            for delivery in batch:
                delivery.ack()
            seen += len(batch)
        return Run(time.perf_counter() - wall, time.thread_time() - cpu, timed)


@contextlib.contextmanager
def kafka(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from msgsafe.cluster.kafka import KafkaCluster

    cluster = KafkaCluster(nodes=1)
    cluster.start()
    try:
        yield str(cluster.url)
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--url", help="a running Kafka (kafka://...) instead of one started here")
    args = parser.parse_args()
    from msgsafe.cluster.kafka_admin import create_topic

    with kafka(args.url) as url:
        bootstrap = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("@")[-1]
        topic = f"bench-stalls-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 3, 1, timeout=60)
        fill(url, topic, args.messages)
        sides: dict[str, Callable[[], Run]] = {
            "raw": lambda: read_raw(bootstrap, topic, args.messages),
            "poll+ack 1000ms": lambda: read_msgsafe(
                url, topic, args.messages, librdkafka={"fetch.queue.backoff.ms": "1000"}
            ),
            "poll+ack": lambda: read_msgsafe(url, topic, args.messages),
        }
        read_raw(bootstrap, topic, args.messages)  # the broker's first read, untimed
        print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
        for n in range(args.rounds):
            print(f"round {n + 1}", flush=True)
            for name, side in sides.items():
                print(side().line(name, args.messages), flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
