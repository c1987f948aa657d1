"""Celery ``delay()`` through ``msgsafe.compat.celery`` against Celery's own publishing.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_celery.py \
        [--messages 1000] [--rounds 6] [--readme benchmarks/README.md]

Starts one RabbitMQ node on loopback (``msgsafe.cluster``) and runs, alternating, the
same loop of ``task.delay(i)`` (task protocol 2, JSON, default durable queue, no result
backend) through two apps configured alike:

- ``celery``: Celery's own publishing with publisher confirms
  (``broker_transport_options={"confirm_publish": True}``: kombu's py-amqp channel waits
  for each message's confirm, so ``delay()`` returns once the broker has it);
- ``celery + msgsafe``: the same app after ``msgsafe.compat.celery.install(app)`` (outbox
  on): ``delay()`` returns once the message is confirmed or stored.

Each app publishes once before its clock starts (connections made, the queue declared).
One warm-up run each, then ``--rounds`` rounds in ABBA order; wall-clock rate and the
process's CPU per message (``time.process_time``). Every run checks the queue holds
what was sent. Goal: msgsafe / celery >= 0.9, the median of the per-round ratios.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celery  # type: ignore[import-untyped]
import kombu
import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import celery as compat_celery

GOAL = 0.9
VARIANTS = ("celery", "celery + msgsafe")


@dataclass(frozen=True)
class Run:
    rate: float
    cpu_us: float


def _app(port: int, queue: str) -> Any:
    app = celery.Celery("bench", broker=f"amqp://guest:guest@127.0.0.1:{port}//")
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        broker_transport_options={"confirm_publish": True},
    )

    @app.task(name="bench.noop", shared=False)
    def noop(n: int) -> int:
        return n

    return app


def _run(variant: str, port: int, count: int, work: Path) -> Run:
    queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
    app = _app(port, queue)
    publisher = None
    if variant == "celery + msgsafe":
        publisher = compat_celery.install(app, outbox=work / f"{queue}.sqlite3")
    task = app.tasks["bench.noop"]
    task.delay(-1)  # before the clock: connected, the queue declared
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        task.delay(i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if publisher is not None:
        assert publisher.producer.pending() == 0, "messages left in the outbox"
        publisher.uninstall()
    app.close()
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    got = setup.channel().queue_declare(queue, passive=True).method.message_count
    setup.channel().queue_delete(queue)
    setup.close()
    assert got == count + 1, f"{got} of {count + 1} messages in {queue}"
    return Run(count / wall, cpu / count * 1e6)


def _section(runs: dict[str, list[Run]], args: argparse.Namespace, started: str) -> str:
    load_start = args.load_start
    load_end = os.getloadavg()[0]
    ratios = [
        m.rate / c.rate for c, m in zip(runs["celery"], runs["celery + msgsafe"], strict=True)
    ]
    cpu_ratio = statistics.median(c.cpu_us for c in runs["celery"]) / statistics.median(
        m.cpu_us for m in runs["celery + msgsafe"]
    )
    median = statistics.median(ratios)
    means = statistics.mean(r.rate for r in runs["celery + msgsafe"]) / statistics.mean(
        r.rate for r in runs["celery"]
    )
    ended = datetime.datetime.now(datetime.UTC).strftime("%H:%M")
    lines = [
        "## Celery",
        "",
        "`flock /tmp/msgsafe-bench.lock python benchmarks/bench_compat_celery.py"
        " --readme benchmarks/README.md`",
        "",
        f"Measured {started} to {ended} UTC on {os.cpu_count()} cores, load average "
        f"{load_start:.1f} at the start and {load_end:.1f} at the end (the machine is shared), "
        f"Python {platform.python_version()}, celery {celery.__version__}, kombu "
        f"{kombu.__version__}; one RabbitMQ node, `task.delay(i)` to the default durable "
        f"queue, {args.messages:,} per run, publisher confirms on for both; one warm-up "
        f"run each, then {args.rounds} rounds in ABBA order.",
        "",
        "| variant | msg/s (mean) | CPU µs/msg (median) | msg/s by round |",
        "|---|---|---|---|",
    ]
    for name in VARIANTS:
        rates = [r.rate for r in runs[name]]
        lines.append(
            f"| {name} | {statistics.mean(rates):,.0f} | "
            f"{statistics.median(r.cpu_us for r in runs[name]):.1f} | "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + " |"
        )
    met = "met" if median >= GOAL else "**not met**"
    lines += [
        "",
        "| ratio | wall, median of rounds | wall, of means | wall by round |"
        " CPU/msg celery ÷ msgsafe | goal |",
        "|---|---|---|---|---|---|",
        f"| celery + msgsafe / celery | **{median:.2f}** | {means:.2f} | "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f" | {cpu_ratio:.2f} | >= {GOAL}: {met} |",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--readme", type=Path)
    args = parser.parse_args()
    args.load_start = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    node = RabbitCluster(size=1)
    node.start()
    try:
        port = node.port(0)
        with tempfile.TemporaryDirectory(prefix="bench-celery-") as tmp:
            work = Path(tmp)
            for name in VARIANTS:
                _run(name, port, max(1, args.messages // 5), work)
            runs: dict[str, list[Run]] = {name: [] for name in VARIANTS}
            for round_no in range(args.rounds):
                order = VARIANTS if round_no % 2 == 0 else tuple(reversed(VARIANTS))
                for name in order:
                    run = _run(name, port, args.messages, work)
                    runs[name].append(run)
                    print(
                        f"round {round_no + 1} {name:>18}: {run.rate:>8,.0f} msg/s"
                        f" {run.cpu_us:>8.1f} us CPU/msg",
                        flush=True,
                    )
    finally:
        node.stop()
    section = _section(runs, args, started)
    print(section)
    if args.readme is not None:
        replace_section(args.readme, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
