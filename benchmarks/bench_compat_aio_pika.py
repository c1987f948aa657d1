"""aio-pika against msgsafe.compat.aio_pika: the same publishing code, confirms both ways.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_aio_pika.py \
        [--messages 2000] [--window 100] [--rounds 4]

Starts one RabbitMQ node on loopback (``msgsafe.cluster``) and runs, alternating (ABBA),
the same application code with each client: ``connect_robust``, a channel with publisher
confirms (aio-pika's default), ``default_exchange.publish`` of 100-byte persistent
messages to a fresh durable quorum queue, each publish awaited until the broker
confirmed it (the wrapper: confirmed or stored; nothing is stored while the broker is
up). Two shapes:

- ``sequential``: one publish awaited after the other (one confirm round trip each);
- ``window``: ``--window`` publishes in flight at once (``asyncio.gather`` per window).

Each connection publishes one message before the clock starts. Reported: msgsafe
messages per second per run, the process's CPU per message (every thread: aio-pika's
loop, msgsafe's I/O and outbox threads), and wrapper / aio-pika per round (median).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import aio_pika as compat

BODY = b"x" * 100
GOAL = 0.9


async def _run(
    connect: Callable[..., Any], url: str, queue: str, n: int, window: int
) -> tuple[float, float]:
    connection = await connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = channel.default_exchange
        await exchange.publish(aio_pika.Message(BODY, delivery_mode=2), queue)  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        if window <= 1:
            for _ in range(n):
                await exchange.publish(aio_pika.Message(BODY, delivery_mode=2), queue)
        else:
            for start in range(0, n, window):
                await asyncio.gather(
                    *(
                        exchange.publish(aio_pika.Message(BODY, delivery_mode=2), queue)
                        for _ in range(min(window, n - start))
                    )
                )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n * 1e6


def _queue(cluster: RabbitCluster) -> str:
    name = f"bench-aio-{uuid.uuid4().hex[:8]}"
    params = pika.ConnectionParameters("127.0.0.1", cluster.port(0))
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    return name


def _purge(cluster: RabbitCluster, name: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.port(0)))
    conn.channel().queue_delete(name)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="bench-aio-") as tmp:
        os.environ["XDG_DATA_HOME"] = tmp  # the wrapper's default outbox: here
        cluster = RabbitCluster(size=1, dir=Path(tmp) / "rabbit")
        cluster.start()
        try:
            url = f"amqp://guest:guest@127.0.0.1:{cluster.port(0)}/"

            def real(u: str) -> Any:
                return aio_pika.connect_robust(u)

            def wrapped(u: str) -> Any:
                return compat.connect_robust(u, outbox=Path(tmp) / "outbox.sqlite3")

            results: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for shape, window in (("sequential", 1), ("window", args.window)):
                n = args.messages if window > 1 else args.messages // 4
                order = [("aio-pika", real), ("wrapper", wrapped)]
                queue = _queue(cluster)
                for _name, connect in order:  # untimed warm-up of each
                    asyncio.run(_run(connect, url, queue, min(n, 200), window))
                for r in range(args.rounds):
                    for name, connect in order if r % 2 == 0 else order[::-1]:
                        results.setdefault((shape, name), []).append(
                            asyncio.run(_run(connect, url, queue, n, window))
                        )
                _purge(cluster, queue)
        finally:
            cluster.stop()
    ended = datetime.datetime.now(datetime.UTC)
    print(
        f"Measured {started:%Y-%m-%d %H:%M} to {ended:%H:%M} UTC on {os.cpu_count()} cores, "
        f"load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, "
        f"Python {platform.python_version()}, aio-pika {aio_pika.__version__}, "
        f"RabbitMQ 1 node, quorum queue; {args.rounds} rounds in ABBA order.\n"
    )
    print("| shape | client | msg/s (mean) | CPU µs/msg (median) | msg/s by round |")
    print("|---|---|---|---|---|")
    for (shape, name), runs in results.items():
        rates = [r for r, _ in runs]
        cpus = [c for _, c in runs]
        by_round = ", ".join(f"{r:,.0f}" for r in rates)
        print(
            f"| {shape} | {name} | {statistics.mean(rates):,.0f} | "
            f"{statistics.median(cpus):.0f} | {by_round} |"
        )
    print("\n| shape | wrapper / aio-pika (median of rounds) | by round | goal |")
    print("|---|---|---|---|")
    for shape in ("sequential", "window"):
        real_runs, ours = results[(shape, "aio-pika")], results[(shape, "wrapper")]
        ratios = [w[0] / r[0] for w, r in zip(ours, real_runs, strict=True)]
        print(
            f"| {shape} | **{statistics.median(ratios):.2f}** | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | >= {GOAL} |"
        )


if __name__ == "__main__":
    main()
