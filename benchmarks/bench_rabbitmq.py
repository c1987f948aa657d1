"""RabbitMQ publishing throughput: the SDK against raw pika, measured in one run.

    python benchmarks/bench_rabbitmq.py [--messages 100000] [--url amqp://...]
                                        [--readme benchmarks/README.md]

Without ``--url`` a 3-node cluster is started on loopback (``msgsafe.testing.rabbitmq``).
Every variant publishes ``--messages`` 100-byte persistent messages to its own fresh
quorum queue with the same guarantees:

- ``sdk transport``: ``RabbitTransport.publish`` (pipelined confirms, mandatory,
  persistent, message id and headers), all futures awaited;
- ``sdk producer``: ``msgsafe.Producer.send_async`` without an outbox;
- ``raw pika pipelined``: pika ``SelectConnection``, confirm mode, ``mandatory=True``,
  persistent, the same in-flight window, delivery tags matched (multiple acks too);
- ``raw pika blocking``: ``BlockingConnection`` with per-message confirms (each publish
  waits for its confirm), on ``--blocking-messages`` messages (it runs ~100x slower).

Goals: sdk transport / raw pipelined >= 0.9; sdk transport / raw blocking >= 5.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel
from pika.spec import Basic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from msgsafe.adapters.rabbitmq import RabbitOptions, RabbitTransport
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope

BODY = b"x" * 100
WINDOW = 1000


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
        start = time.perf_counter()
        futures = [transport.publish(Envelope.build(queue, BODY)) for _ in range(n)]
        for fut in futures:
            fut.result(60)
        return n / (time.perf_counter() - start)
    finally:
        transport.close(10)


def bench_producer(url: str, queue: str, n: int) -> float:
    from msgsafe import Producer

    with Producer(url, outbox=False, max_in_flight=WINDOW) as producer:
        producer.send(queue, BODY)
        start = time.perf_counter()
        futures = [producer.send_async(queue, BODY) for _ in range(n)]
        for fut in futures:
            fut.result(60)
        return n / (time.perf_counter() - start)


def bench_raw_pipelined(url: str, queue: str, n: int) -> float:
    """pika SelectConnection with pipelined confirms: the best raw pika can do."""
    state = {"sent": 0, "confirmed": 0, "returned": 0, "nacked": 0, "start": 0.0, "end": 0.0}
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
            channel_ref[0].connection.close()
        else:
            publish_some(channel_ref[0])

    channel_ref: list[Channel] = []

    def on_channel(channel: Channel) -> None:
        channel_ref.append(channel)
        channel.add_on_return_callback(lambda *a: state.__setitem__("returned", 1))

        def confirming(_frame: object) -> None:
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
    conn.close()
    return rate


def _run(name: str, fn: Callable[[str, str, int], float], url: str, n: int) -> float:
    queue = f"bench-{name.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
    _declare(url, queue)
    try:
        rate = fn(url, queue, n)
    finally:
        _delete(url, queue)
    print(f"{name:>22}: {rate:>10,.0f} msg/s  ({n:,} messages)", flush=True)
    return rate


def _write_readme(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## RabbitMQ\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--blocking-messages", type=int, default=5_000)
    parser.add_argument("--url", help="a running broker (default: start a 3-node cluster)")
    parser.add_argument("--readme", type=Path, help="write the figures into this README")
    args = parser.parse_args(argv)

    cluster = None
    url = args.url
    if url is None:
        from msgsafe.testing.rabbitmq import RabbitCluster

        cluster = RabbitCluster(size=3)
        started = time.monotonic()
        cluster.start()
        print(f"cluster ready in {time.monotonic() - started:.1f} s", flush=True)
        url = cluster.url(0)
    load = os.getloadavg()[0]
    try:
        n = args.messages
        # Alternate so a change in the shared machine's load hits both sides alike.
        raw1 = _run("raw pika pipelined", bench_raw_pipelined, url, n)
        sdk1 = _run("sdk transport", bench_transport, url, n)
        raw2 = _run("raw pika pipelined", bench_raw_pipelined, url, n)
        sdk2 = _run("sdk transport", bench_transport, url, n)
        prod = _run("sdk producer", bench_producer, url, n)
        blocking = _run("raw pika blocking", bench_raw_blocking, url, args.blocking_messages)
    finally:
        if cluster is not None:
            cluster.stop()
    raw, sdk = (raw1 + raw2) / 2, (sdk1 + sdk2) / 2
    ratio = sdk / raw
    speedup = sdk / blocking
    print(f"sdk transport / raw pipelined: {ratio:.2f} (goal >= 0.9)")
    print(f"sdk producer / raw pipelined:  {prod / raw:.2f}")
    print(f"sdk transport / raw blocking:  {speedup:.1f}x (goal >= 5x)")
    if args.readme:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        section = (
            "## RabbitMQ\n\n"
            "`python benchmarks/bench_rabbitmq.py --readme benchmarks/README.md`\n\n"
            f"Measured {now} on {os.cpu_count()} cores, load average {load:.1f} at the start "
            f"(the machine is shared), Python {platform.python_version()}, pika "
            f"{pika.__version__}, RabbitMQ 3.10.8 3-node cluster on loopback, quorum queue, "
            f"{n:,} persistent 100-byte messages per run, window {WINDOW}.\n\n"
            "| figure | value | goal |\n|---|---|---|\n"
            f"| raw pika SelectConnection, pipelined confirms, mandatory (mean of 2) "
            f"| {raw:,.0f} msg/s | |\n"
            f"| SDK `RabbitTransport.publish` (mean of 2) | {sdk:,.0f} msg/s | |\n"
            f"| SDK `Producer.send_async`, no outbox | {prod:,.0f} msg/s | |\n"
            f"| raw pika BlockingConnection, per-message confirm "
            f"({args.blocking_messages:,} messages) | {blocking:,.0f} msg/s | |\n"
            f"| SDK transport / raw pipelined | {ratio:.2f} | >= 0.9 |\n"
            f"| SDK producer / raw pipelined | {prod / raw:.2f} | |\n"
            f"| SDK transport / raw blocking | {speedup:.1f}x | >= 5x |\n\n"
            f"Runs, in order: raw {raw1:,.0f}, sdk {sdk1:,.0f}, raw {raw2:,.0f}, "
            f"sdk {sdk2:,.0f} msg/s.\n\n"
        )
        _write_readme(args.readme, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
