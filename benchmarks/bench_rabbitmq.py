"""RabbitMQ publishing throughput: the SDK against raw pika, measured in one run.

    python benchmarks/bench_rabbitmq.py [--messages 100000] [--rounds 2] [--url amqp://...]
                                        [--readme benchmarks/README.md]

Without ``--url`` a 3-node cluster is started on loopback (``msgsafe.cluster.rabbitmq``).
Every variant publishes ``--messages`` 100-byte persistent messages to its own fresh
quorum queue with the same guarantees:

- ``sdk transport``: ``RabbitTransport.publish`` (pipelined confirms, mandatory,
  persistent, message id and headers), all futures awaited;
- ``sdk batch``: ``RabbitTransport.publish_batch`` of batches of ``--batch`` messages
  built with ``Batch.build`` (ids made in the timed loop), every report counted and
  checked: confirmed == messages, no failure;
- ``sdk producer``: ``msgsafe.Producer.send_async`` without an outbox;
- ``raw pika pipelined``: pika ``SelectConnection``, confirm mode, ``mandatory=True``,
  persistent, the same in-flight window, delivery tags matched (multiple acks too);
- ``raw pika blocking``: ``BlockingConnection`` with per-message confirms (each publish
  waits for its confirm), on ``--blocking-messages`` messages (it runs ~100x slower).

Goals: sdk / raw pipelined >= 0.9; sdk / raw blocking >= 5 (both shown for the
per-message ``publish`` and for ``publish_batch``). Client CPU per message is
``time.process_time()`` (all threads of this process) over the timed part.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel
from pika.spec import Basic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from msgsafe.adapters.rabbitmq import RabbitOptions, RabbitTransport
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError
from msgsafe.message import Batch, Envelope

BODY = b"x" * 100
WINDOW = 1000
BATCH = 1000

#: Client CPU seconds (process_time, all threads) of the last run's timed part.
_cpu = [0.0]


def _params(url: str) -> pika.ConnectionParameters:
    parsed = parse_url(url)
    ep = parsed.endpoints[0]
    password = parsed.password.reveal() if parsed.password else "guest"
    return pika.ConnectionParameters(
        host=ep.host,
        port=ep.port,
        virtual_host=parsed.path or "/",
        credentials=pika.PlainCredentials(parsed.username or "guest", password),
        heartbeat=10,
    )


def _declare(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(_params(url))
    conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()


def _delete(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(_params(url))
    conn.channel().queue_delete(queue)
    conn.close()


def bench_transport(url: str, queue: str, n: int) -> float:
    transport = RabbitTransport(parse_url(url), RabbitOptions(max_in_flight=WINDOW))
    try:
        warm = transport.publish(Envelope.build(queue, BODY))
        warm.result(30)
        cpu = time.process_time()
        start = time.perf_counter()
        futures = [transport.publish(Envelope.build(queue, BODY)) for _ in range(n)]
        for fut in futures:
            fut.result(60)
        elapsed = time.perf_counter() - start
        _cpu[0] = time.process_time() - cpu
        return n / elapsed
    finally:
        transport.close(10)


class _Count:
    """A BatchReport that counts confirms and failures for all batches of a run."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.confirmed = 0
        self.failures: list[tuple[int, MsgsafeError]] = []
        self._lock = threading.Lock()
        self.done = threading.Event()

    def _check(self) -> None:
        if self.confirmed + len(self.failures) >= self.expected:
            self.done.set()

    def batch_confirmed(self, count: int) -> None:
        with self._lock:
            self.confirmed += count
            self._check()

    def batch_failed(self, index: int, error: MsgsafeError) -> None:
        with self._lock:
            self.failures.append((index, error))
            self._check()


class _Report:
    """The report of one batch, counting into the run's ``_Count``."""

    __slots__ = ("confirmed", "failed")

    def __init__(self, count: _Count) -> None:
        self.confirmed = count.batch_confirmed
        self.failed = count.batch_failed


def bench_batch(url: str, queue: str, n: int) -> float:
    transport = RabbitTransport(parse_url(url), RabbitOptions(max_in_flight=WINDOW))
    try:
        warm = _Count(1)
        transport.publish_batch(Batch.build(queue, [BODY]), _Report(warm))
        if not warm.done.wait(30) or warm.failures:
            raise RuntimeError(f"warm-up batch failed: {warm.failures}")
        count = _Count(n)
        cpu = time.process_time()
        start = time.perf_counter()
        for offset in range(0, n, BATCH):
            batch = Batch.build(queue, [BODY] * min(BATCH, n - offset))
            transport.publish_batch(batch, _Report(count))
        if not count.done.wait(60):
            raise RuntimeError(f"batch run incomplete: {count.confirmed} confirmed of {n}")
        elapsed = time.perf_counter() - start
        _cpu[0] = time.process_time() - cpu
        if count.failures or count.confirmed != n:
            raise RuntimeError(
                f"batch run: {count.confirmed} confirmed, failures {count.failures[:3]}"
            )
        return n / elapsed
    finally:
        transport.close(10)


def bench_producer(url: str, queue: str, n: int) -> float:
    from msgsafe import Producer

    with Producer(url, outbox=False, max_in_flight=WINDOW) as producer:
        producer.send(queue, BODY)
        cpu = time.process_time()
        start = time.perf_counter()
        futures = [producer.send_async(queue, BODY) for _ in range(n)]
        for fut in futures:
            fut.result(60)
        elapsed = time.perf_counter() - start
        _cpu[0] = time.process_time() - cpu
        return n / elapsed


def bench_producer_batch(url: str, queue: str, n: int) -> float:
    """The public batch API: ``Producer.send_batch_async`` in batches of BATCH, every
    receipt read and every message confirmed."""
    from msgsafe import Producer

    with Producer(url, outbox=False, max_in_flight=WINDOW) as producer:
        producer.send(queue, BODY)
        cpu = time.process_time()
        start = time.perf_counter()
        futures = [
            producer.send_batch_async(queue, [BODY] * min(BATCH, n - offset))
            for offset in range(0, n, BATCH)
        ]
        confirmed = sum(fut.result(60).confirmed for fut in futures)
        elapsed = time.perf_counter() - start
        _cpu[0] = time.process_time() - cpu
        if confirmed != n:
            raise RuntimeError(f"producer batch run: {confirmed} confirmed of {n}")
        return n / elapsed


def bench_raw_pipelined(url: str, queue: str, n: int) -> float:
    """pika SelectConnection with pipelined confirms: the best raw pika can do."""
    state = {
        "sent": 0,
        "confirmed": 0,
        "returned": 0,
        "nacked": 0,
        "start": 0.0,
        "end": 0.0,
        "cpu": 0.0,
    }
    in_flight: collections.OrderedDict[int, str] = collections.OrderedDict()

    def publish_some(channel: Channel) -> None:
        while state["sent"] < n and len(in_flight) < WINDOW:
            mid = str(uuid.uuid4())
            channel.basic_publish(
                "",
                queue,
                BODY,
                pika.BasicProperties(delivery_mode=2, message_id=mid, headers={"msgsafe-id": mid}),
                mandatory=True,
            )
            state["sent"] += 1
            in_flight[int(state["sent"])] = mid

    def on_confirm(frame: pika.frame.Method) -> None:  # type: ignore[name-defined]
        method = frame.method
        tags: list[int] = []
        if method.multiple:
            while in_flight and next(iter(in_flight)) <= method.delivery_tag:
                tags.append(in_flight.popitem(last=False)[0])
        elif in_flight.pop(method.delivery_tag, None) is not None:
            tags.append(method.delivery_tag)
        state["confirmed"] += len(tags)
        if isinstance(method, Basic.Nack):
            state["nacked"] += len(tags)
        if state["confirmed"] >= n:
            state["end"] = time.perf_counter()
            _cpu[0] = time.process_time() - state["cpu"]
            channel_ref[0].connection.close()
        else:
            publish_some(channel_ref[0])

    channel_ref: list[Channel] = []

    def on_channel(channel: Channel) -> None:
        channel_ref.append(channel)
        channel.add_on_return_callback(lambda *a: state.__setitem__("returned", 1))

        def confirming(_frame: object) -> None:
            state["cpu"] = time.process_time()
            state["start"] = time.perf_counter()
            publish_some(channel)

        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=confirming)

    conn = SelectConnection(
        _params(url),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, r: c.ioloop.stop(),
    )
    conn.ioloop.start()
    if state["confirmed"] < n or state["nacked"] or state["returned"]:
        raise RuntimeError(f"raw pipelined run incomplete: {state}")
    return n / (state["end"] - state["start"])


def bench_raw_blocking(url: str, queue: str, n: int) -> float:
    """pika BlockingConnection, confirm mode: each publish waits for its own confirm."""
    conn = pika.BlockingConnection(_params(url))
    channel = conn.channel()
    channel.confirm_delivery()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(n):
        mid = str(uuid.uuid4())
        channel.basic_publish(
            "",
            queue,
            BODY,
            pika.BasicProperties(delivery_mode=2, message_id=mid, headers={"msgsafe-id": mid}),
            mandatory=True,
        )
    rate = n / (time.perf_counter() - start)
    _cpu[0] = time.process_time() - cpu
    conn.close()
    return rate


def _run(name: str, fn: Callable[[str, str, int], float], url: str, n: int) -> tuple[float, float]:
    """(msg/s, client CPU µs per message) of one run on a fresh quorum queue."""
    queue = f"bench-{name.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
    _declare(url, queue)
    try:
        rate = fn(url, queue, n)
    finally:
        _delete(url, queue)
    cpu_us = _cpu[0] / n * 1e6
    print(
        f"{name:>22}: {rate:>10,.0f} msg/s  {cpu_us:6.1f} µs CPU/msg  ({n:,} messages)", flush=True
    )
    return rate, cpu_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--blocking-messages", type=int, default=5_000)
    parser.add_argument("--url", help="a running broker (default: start a 3-node cluster)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (mean shown)")
    parser.add_argument("--readme", type=Path, help="write the figures into this README")
    args = parser.parse_args(argv)

    cluster = None
    url = args.url
    if url is None:
        from msgsafe.cluster.rabbitmq import RabbitCluster

        cluster = RabbitCluster(size=3)
        started = time.monotonic()
        cluster.start()
        print(f"cluster ready in {time.monotonic() - started:.1f} s", flush=True)
        url = cluster.node_url(0)
    load = os.getloadavg()[0]
    rounds: dict[str, list[tuple[float, float]]] = {
        "raw": [],
        "transport": [],
        "batch": [],
        "pbatch": [],
    }
    try:
        n = args.messages
        # Alternate so a change in the shared machine's load hits every variant alike.
        for _ in range(args.rounds):
            rounds["raw"].append(_run("raw pika pipelined", bench_raw_pipelined, url, n))
            rounds["transport"].append(_run("sdk transport", bench_transport, url, n))
            rounds["batch"].append(_run("sdk batch", bench_batch, url, n))
            rounds["pbatch"].append(_run("sdk producer batch", bench_producer_batch, url, n))
        prod, prod_cpu = _run("sdk producer", bench_producer, url, n)
        blocking, _ = _run("raw pika blocking", bench_raw_blocking, url, args.blocking_messages)
    finally:
        if cluster is not None:
            cluster.stop()
    end_load = os.getloadavg()[0]

    def mean(name: str, field: int) -> float:
        values = [run[field] for run in rounds[name]]
        return sum(values) / len(values)

    def per_round(name: str) -> str:
        pairs = zip(rounds[name], rounds["raw"], strict=True)
        return ", ".join(f"{run[0] / raw_run[0]:.2f}" for run, raw_run in pairs)

    raw, sdk, batch = mean("raw", 0), mean("transport", 0), mean("batch", 0)
    raw_cpu, sdk_cpu, batch_cpu = mean("raw", 1), mean("transport", 1), mean("batch", 1)
    pbatch, pbatch_cpu = mean("pbatch", 0), mean("pbatch", 1)
    print(f"sdk transport / raw pipelined: {sdk / raw:.2f} (goal >= 0.9)")
    print(f"sdk batch / raw pipelined:     {batch / raw:.2f} (goal >= 0.9)")
    print(f"sdk producer batch / raw:      {pbatch / raw:.2f} (goal >= 0.9)")
    print(f"sdk producer / raw pipelined:  {prod / raw:.2f}")
    print(f"sdk transport / raw blocking:  {sdk / blocking:.1f}x (goal >= 5x)")
    print(f"sdk batch / raw blocking:      {batch / blocking:.1f}x (goal >= 5x)")
    if args.readme:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        k = args.rounds
        runs = "; ".join(
            f"raw {r[0]:,.0f}, transport {t[0]:,.0f}, batch {b[0]:,.0f}"
            for r, t, b in zip(rounds["raw"], rounds["transport"], rounds["batch"], strict=True)
        )
        section = (
            "## RabbitMQ\n\n"
            f"`flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_rabbitmq.py "
            f"--rounds {k} --readme benchmarks/README.md`\n\n"
            f"Measured {now} on {os.cpu_count()} cores, load average {load:.1f} at the start "
            f"and {end_load:.1f} at the end (the machine is shared), Python "
            f"{platform.python_version()}, pika {pika.__version__}, RabbitMQ 3.10.8 3-node "
            f"cluster on loopback, quorum queue, {n:,} persistent 100-byte messages per run, "
            f"window {WINDOW}, batches of {BATCH}. Client CPU: `time.process_time()` of "
            "the benchmark process (all its threads) per message.\n\n"
            "| figure | value | client CPU | goal |\n|---|---|---|---|\n"
            f"| raw pika SelectConnection, pipelined confirms, mandatory (mean of {k}) "
            f"| {raw:,.0f} msg/s | {raw_cpu:.1f} µs/msg | |\n"
            f"| SDK `RabbitTransport.publish` (mean of {k}) | {sdk:,.0f} msg/s "
            f"| {sdk_cpu:.1f} µs/msg | |\n"
            f"| SDK `RabbitTransport.publish_batch` (mean of {k}) | {batch:,.0f} msg/s "
            f"| {batch_cpu:.1f} µs/msg | |\n"
            f"| SDK `Producer.send_batch_async`, no outbox (mean of {k}) | {pbatch:,.0f} msg/s "
            f"| {pbatch_cpu:.1f} µs/msg | |\n"
            f"| SDK `Producer.send_async`, no outbox | {prod:,.0f} msg/s "
            f"| {prod_cpu:.1f} µs/msg | |\n"
            f"| raw pika BlockingConnection, per-message confirm "
            f"({args.blocking_messages:,} messages) | {blocking:,.0f} msg/s | | |\n"
            f"| SDK transport / raw pipelined | {sdk / raw:.2f} | | >= 0.9 |\n"
            f"| SDK batch / raw pipelined | **{batch / raw:.2f}** | | >= 0.9 |\n"
            f"| SDK `Producer.send_batch_async` / raw pipelined | **{pbatch / raw:.2f}** "
            "| | >= 0.9 |\n"
            f"| SDK producer / raw pipelined | {prod / raw:.2f} | | |\n"
            f"| SDK transport / raw blocking | {sdk / blocking:.1f}x | | >= 5x |\n"
            f"| SDK batch / raw blocking | **{batch / blocking:.1f}x** | | >= 5x |\n\n"
            f"Runs, in order: {runs} msg/s. Per round, transport/raw "
            f"{per_round('transport')}; batch/raw {per_round('batch')}; producer batch/raw "
            f"{per_round('pbatch')}.\n"
        )
        replace_section(args.readme, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
