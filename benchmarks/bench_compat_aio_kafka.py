"""The asyncio Kafka drop-ins against the clients they replace, with the same guarantees.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_aio_kafka.py \
        [--messages 20000] [--rounds 4]

Starts one Kafka node on loopback (``msgsafe.cluster``) and runs, alternating, the same
asyncio loop through each client: ``--messages`` per-message sends of 100-byte values
keyed over 16 keys, each with its own call and future, then every future awaited.

- ``aiokafka``: ``AIOKafkaProducer(acks="all", enable_idempotence=True)``,
  ``await producer.send(...)`` per message carrying a ``msgsafe-id`` header with a fresh
  id (the header the wrapper puts on every record); the wrapper
  (``msgsafe.compat.aiokafka``, outbox on) runs the same loop without it.
- ``confluent aio``: ``confluent_kafka.aio.AIOProducer`` (``acks=all``, idempotence),
  ``await producer.produce(...)`` per message, then ``flush()``; its batch mode takes no
  headers (``NotImplementedError``), so the real client runs without the id header here;
  the wrapper (``msgsafe.compat.confluent_kafka.AIOProducer``) carries its own.
- ``confluent asyncio example + id header``: what confluent-kafka offers a caller who
  needs headers in asyncio (its AIOProducer refuses them and points to the sync
  ``produce()``): the pattern of its ``examples/asyncio_example.py``, the sync
  ``Producer`` with a thread in ``poll()`` and each delivery settling the message's
  future through ``call_soon_threadsafe``, with the ``msgsafe-id`` header; against the
  same AIOProducer wrapper.

Each producer is started and delivers one message per key before the clock starts. Every
variant runs once unmeasured, then ``--rounds`` rounds, each in the reverse order of the
one before (ABBA). Reported: the median of the per-round wrapper / real rate ratios, and
CPU per message (``time.process_time``, every thread of this process) real / wrapper.
Goal: >= 0.9 for each wrapper.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiokafka
import confluent_kafka
from confluent_kafka.aio import AIOProducer as RealAIOProducer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import aiokafka as compat_aiokafka
from msgsafe.compat.confluent_kafka import AIOProducer as WrappedAIOProducer
from msgsafe.message import MESSAGE_ID_HEADER as ID_HEADER
from msgsafe.message import new_message_id

KEYS = [f"key-{i}".encode() for i in range(16)]
VALUE = b"x" * 100


@dataclass(frozen=True)
class Run:
    rate: float  #: messages per second, wall clock
    cpu_us: float  #: this process's CPU per message, microseconds


async def _timed(count: int, send: Callable[[int], Awaitable[Any]], done: Callable[[], Any]) -> Run:
    wall, cpu = time.perf_counter(), time.process_time()
    futures = [await send(i) for i in range(count)]
    await done()
    await asyncio.gather(*futures)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Run(count / wall, cpu / count * 1e6)


async def _aiokafka(wrapped: bool, bootstrap: str, count: int, outbox: Path) -> Run:
    topic = f"bench-ak-{uuid.uuid4().hex[:8]}"
    if wrapped:
        producer: Any = compat_aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            msgsafe_outbox=str(outbox / f"{topic}.sqlite3"),
        )
    else:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True
        )
    await producer.start()
    try:
        for key in KEYS:
            await producer.send_and_wait(topic, VALUE, key=key)

        async def send(i: int) -> Any:
            if wrapped:
                return await producer.send(topic, VALUE, key=KEYS[i % 16])
            header = [(ID_HEADER, new_message_id().encode())]
            return await producer.send(topic, VALUE, key=KEYS[i % 16], headers=header)

        return await _timed(count, send, producer.flush)
    finally:
        await producer.stop()


async def _confluent_aio(wrapped: bool, bootstrap: str, count: int, outbox: Path) -> Run:
    topic = f"bench-aio-{uuid.uuid4().hex[:8]}"
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
    }
    if wrapped:
        conf["msgsafe.outbox"] = str(outbox / f"{topic}.sqlite3")
    producer: Any = WrappedAIOProducer(conf) if wrapped else RealAIOProducer(conf)
    try:
        warm = [await producer.produce(topic, VALUE, key=key) for key in KEYS]
        await producer.flush()
        await asyncio.gather(*warm)

        async def send(i: int) -> Any:
            return await producer.produce(topic, VALUE, key=KEYS[i % 16])

        return await _timed(count, send, producer.flush)
    finally:
        await producer.close()


async def _confluent_example(wrapped: bool, bootstrap: str, count: int, outbox: Path) -> Run:
    """confluent-kafka's own asyncio pattern (its ``examples/asyncio_example.py``: the
    sync ``Producer``, a thread in ``poll()``, each delivery settling the message's
    future through ``call_soon_threadsafe``), which is what its AIOProducer tells a
    caller who needs headers to use, here with the ``msgsafe-id`` header; the wrapper
    side is the AIOProducer wrapper, as in ``_confluent_aio``."""
    if wrapped:
        return await _confluent_aio(True, bootstrap, count, outbox)
    topic = f"bench-aio-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    )
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            producer.poll(0.1)

    poller = threading.Thread(target=serve, daemon=True)
    poller.start()

    def produce(i: int) -> asyncio.Future[Any]:
        result = loop.create_future()

        def ack(err: Any, msg: Any) -> None:
            if err:
                loop.call_soon_threadsafe(result.set_exception, confluent_kafka.KafkaException(err))
            else:
                loop.call_soon_threadsafe(result.set_result, msg)

        producer.produce(
            topic,
            VALUE,
            key=KEYS[i % 16],
            headers={ID_HEADER: new_message_id()},
            on_delivery=ack,
        )
        return result

    async def flush() -> None:
        await loop.run_in_executor(None, producer.flush)

    try:
        warm = [produce(i) for i in range(16)]
        await flush()
        await asyncio.gather(*warm)

        async def send(i: int) -> Any:
            return produce(i)

        return await _timed(count, send, flush)
    finally:
        stop.set()
        poller.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    outbox = Path(tempfile.mkdtemp(prefix="bench-aio-outbox-"))
    cluster = KafkaCluster(nodes=1)
    cluster.start()
    started = datetime.datetime.now(datetime.UTC)
    pairs = {
        "aiokafka": _aiokafka,
        "confluent aio": _confluent_aio,
        "confluent asyncio example + id header": _confluent_example,
    }
    runs: dict[tuple[str, bool], list[Run]] = {}
    try:
        order = [(name, wrapped) for name in pairs for wrapped in (False, True)]
        for name, wrapped in order:  # warm-up, unmeasured
            asyncio.run(pairs[name](wrapped, cluster.bootstrap, args.messages // 4, outbox))
        for round_ in range(args.rounds):
            for name, wrapped in order if round_ % 2 == 0 else order[::-1]:
                run = asyncio.run(pairs[name](wrapped, cluster.bootstrap, args.messages, outbox))
                runs.setdefault((name, wrapped), []).append(run)
                side = "wrapper" if wrapped else "real"
                print(f"round {round_} {name} {side}: {run.rate:.0f} msg/s, {run.cpu_us:.1f} us")
    finally:
        cluster.stop()
        shutil.rmtree(outbox, ignore_errors=True)
    print(f"\nMeasured {started:%Y-%m-%d %H:%M} UTC, {args.messages} messages x {args.rounds}")
    print(
        "| client | real msg/s | wrapper msg/s | wrapper / real (median of rounds) "
        "| CPU/msg real, wrapper (us) | CPU real / wrapper |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in pairs:
        real, wrapper = runs[(name, False)], runs[(name, True)]
        ratio = statistics.median(w.rate / r.rate for r, w in zip(real, wrapper, strict=True))
        real_cpu = statistics.median(r.cpu_us for r in real)
        wrap_cpu = statistics.median(w.cpu_us for w in wrapper)
        print(
            f"| {name} | {statistics.median(r.rate for r in real):.0f} "
            f"| {statistics.median(w.rate for w in wrapper):.0f} | {ratio:.2f} "
            f"| {real_cpu:.1f}, {wrap_cpu:.1f} | {real_cpu / wrap_cpu:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
