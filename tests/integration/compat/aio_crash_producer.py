"""An asyncio producer through one of msgsafe's asyncio Kafka drop-ins.

    python aio_crash_producer.py aiokafka|confluent-aio BOOTSTRAP TOPIC COUNT

Sends COUNT events ``{"id": N}`` over time, each with its own ``send()`` /
``produce()``, and prints one line per event when its future resolves:
``delivered N confirmed|stored`` or ``failed N ERROR``; then stops the producer (what
is still stored stays in the outbox, under ``XDG_DATA_HOME``) and prints ``done``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


def _report(event: int, stored: Any, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        print(f"failed {event} cancelled", flush=True)
        return
    exc = future.exception()
    if exc is not None:
        print(f"failed {event} {exc!r}", flush=True)
        return
    outcome = "stored" if stored(future.result()) else "confirmed"
    print(f"delivered {event} {outcome}", flush=True)


async def _aiokafka(bootstrap: str, topic: str, count: int) -> None:
    from msgsafe.compat.aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await producer.start()
    for i in range(count):
        event = json.dumps({"id": i, "at": time.time()}).encode()
        future = await producer.send(topic, event, key=str(i % 8).encode())
        future.add_done_callback(lambda f, i=i: _report(i, lambda r: r.stored, f))
        await asyncio.sleep(0.002)  # events arrive over time
    await producer.stop()


async def _confluent_aio(bootstrap: str, topic: str, count: int) -> None:
    from msgsafe.compat.confluent_kafka import AIOProducer

    producer = AIOProducer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000})
    for i in range(count):
        event = json.dumps({"id": i, "at": time.time()}).encode()
        future = await producer.produce(topic, event, key=str(i % 8).encode())
        future.add_done_callback(lambda f, i=i: _report(i, lambda m: m.stored(), f))
        await asyncio.sleep(0.002)
    await producer.close()


def main() -> None:
    kind, bootstrap, topic, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    run = _aiokafka if kind == "aiokafka" else _confluent_aio
    asyncio.run(run(bootstrap, topic, count))
    print("done", flush=True)


if __name__ == "__main__":
    main()
