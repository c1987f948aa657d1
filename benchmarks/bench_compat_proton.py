"""proton.utils against msgsafe.compat.proton: the same sending code, settled on accepted.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_proton.py \
        [--messages 1000] [--rounds 4]

Starts one RabbitMQ node on loopback (``msgsafe.cluster``; its AMQP 1.0 plugin on the
same port) and runs, alternating (ABBA), the same legacy loop with each client:
``BlockingConnection(url)``, ``create_sender("/amq/queue/Q")`` to a durable quorum
queue, ``send(Message(body=100 bytes, durable=True))`` per message, each ``send``
returning once the broker settled it ``accepted`` (the wrapper: accepted or stored;
nothing is stored while the broker is up). Each sender sends one message before the
clock starts. Reported: messages per second per run, the process's CPU per message, and
wrapper / proton per round (median).
"""

from __future__ import annotations

import argparse
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

import pika
import proton
import proton.utils

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import proton as compat

BODY = b"x" * 100
GOAL = 0.9


def _run(make: Callable[[], Any], address: str, n: int) -> tuple[float, float]:
    connection = make()
    try:
        sender = connection.create_sender(address)
        sender.send(proton.Message(body=BODY, durable=True))  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            sender.send(proton.Message(body=BODY, durable=True))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        connection.close()
    return n / wall, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.UTC)
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-proton-") as tmp:
        cluster = RabbitCluster(size=1, dir=Path(tmp) / "rabbit")
        cluster.start()
        try:
            port = cluster.port(0)
            url = f"amqp://guest:guest@127.0.0.1:{port}"
            queue = f"bench-proton-{uuid.uuid4().hex[:8]}"
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
            conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            conn.close()
            address = f"/amq/queue/{queue}"
            outbox = Path(tmp) / "outbox.sqlite3"
            order: list[tuple[str, Callable[[], Any]]] = [
                ("proton", lambda: proton.utils.BlockingConnection(url, timeout=30)),
                ("wrapper", lambda: compat.BlockingConnection(url, timeout=30, outbox=outbox)),
            ]
            for _name, make in order:  # untimed warm-up of each
                _run(make, address, min(args.messages, 200))
            for r in range(args.rounds):
                for name, make in order if r % 2 == 0 else order[::-1]:
                    results.setdefault(name, []).append(_run(make, address, args.messages))
        finally:
            cluster.stop()
    ended = datetime.datetime.now(datetime.UTC)
    print(
        f"Measured {started:%Y-%m-%d %H:%M} to {ended:%H:%M} UTC on {os.cpu_count()} cores, "
        f"load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, "
        f"Python {platform.python_version()}, python-qpid-proton "
        f"{'.'.join(map(str, proton.VERSION))}, RabbitMQ 1 node (AMQP 1.0 plugin), quorum "
        f"queue; {args.messages} sends per run, {args.rounds} rounds in ABBA order.\n"
    )
    print("| client | msg/s (mean) | CPU µs/msg (median) | msg/s by round |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        rates = [r for r, _ in runs]
        cpus = [c for _, c in runs]
        print(
            f"| {name} | {statistics.mean(rates):,.0f} | {statistics.median(cpus):.0f} | "
            f"{', '.join(f'{r:,.0f}' for r in rates)} |"
        )
    ratios = [w[0] / r[0] for w, r in zip(results["wrapper"], results["proton"], strict=True)]
    print(
        f"\nwrapper / proton, median of rounds: **{statistics.median(ratios):.2f}** "
        f"(by round {', '.join(f'{x:.2f}' for x in ratios)}; goal >= {GOAL})"
    )


if __name__ == "__main__":
    main()
