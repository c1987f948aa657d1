"""AMQP 1.0 publish throughput: msgsafe vs a raw proton sender vs send-and-wait.

20k durable 100-byte messages to one address, in one run against one broker:

- ``raw``  — a plain proton ``Container`` sender: durable messages with a message id,
  unsettled (at-least-once) transfers, at most ``--window`` unsettled, done when every
  message is ``accepted``. The same settlement the SDK uses; no msgsafe code.
- ``sdk``  — ``msgsafe.Producer.send_async`` for every message, then every receipt
  (``outbox=False``, ``max_in_flight=--window``).
- ``wait`` — ``proton.utils.BlockingConnection``: each send waits for its outcome
  (the one-round-trip-per-message baseline), on ``--wait-count`` messages.

Rounds alternate raw / sdk so both see the same broker state; the best round of each
is reported with the ratio sdk/raw (goal >= 0.95). Both clocks start once the link can
send (connection set-up untimed), and an untimed warm-up of ``--warmup`` messages per
client comes first (a JVM broker is slow until its code is compiled).

Brokers (``--broker``, repeatable; by default ``artemis`` then ``qpid``), each started
here on loopback through ``msgsafe.cluster`` and stopped at the end:

- ``artemis`` — an ActiveMQ Artemis 2.40 primary/backup pair with replication: a message
  is accepted once the backup has it too; every run sends to a new address (a durable
  anycast queue created on first use).
- ``qpid`` — a Qpid Broker-J 9.2 BDB HA group of three nodes, sending to the master: a
  message is accepted once a majority of the group has it; a new queue per run, created
  on first use.
- ``rabbitmq`` — a one-node RabbitMQ 3.10 with a durable quorum queue, addressed as
  ``/amq/queue/NAME``.
- ``peer`` — the proton test peer; it commits every message to its SQLite store before
  accepting it. ``--address sink/...`` makes it accept without storing, which leaves the
  clients' own cost as the only limit.
- ``--url amqp10://...`` — any running broker.

Also reported: client CPU time per message (``time.process_time`` over the run), which a
busy machine disturbs less than wall-clock rates.

    flock /tmp/msgsafe-bench.lock python benchmarks/bench_amqp10.py [--broker qpid]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BODY = b"x" * 100


def run_raw(url: str, address: str, count: int, window: int) -> tuple[float, float]:
    """Messages per second of a raw proton sender with unsettled, durable transfers."""
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import AtLeastOnce, Container

    parsed = _plain_url(url)

    class Send(MessagingHandler):
        def __init__(self) -> None:
            super().__init__()
            self.sent = 0
            self.accepted = 0
            self.started = 0.0
            self.elapsed = 0.0
            self.cpu_started = 0.0
            self.cpu = 0.0
            self.error = ""

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(parsed, reconnect=False, **_sasl_kwargs(url))
            event.container.create_sender(conn, address, options=AtLeastOnce())

        def on_sendable(self, event: Any) -> None:
            if not self.started:
                # The clock starts with the first credit: connection and link set-up stay
                # outside the timing, as for the Producer (its first send is untimed).
                self.started = time.perf_counter()
                self.cpu_started = time.process_time()
            sender = event.sender
            while sender.credit and self.sent < count and self.sent - self.accepted < window:
                sender.send(Message(body=BODY, id=str(uuid.uuid4()), durable=True))
                self.sent += 1

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            if self.accepted == count:
                self.elapsed = time.perf_counter() - self.started
                self.cpu = time.process_time() - self.cpu_started
                event.connection.close()
            else:
                self.on_sendable(event)

        def on_rejected(self, event: Any) -> None:
            raise RuntimeError("raw sender: message rejected")

        on_released = on_rejected

        def on_transport_error(self, event: Any) -> None:
            self.error = f"transport: {event.transport.condition}"

        def on_connection_remote_close(self, event: Any) -> None:
            self.error = f"closed by the broker: {event.connection.remote_condition}"

    handler = Send()
    Container(handler).run()
    if handler.accepted < count:
        raise RuntimeError(
            f"raw sender: {handler.accepted} of {count} accepted, then {handler.error or 'ended'}"
        )
    return count / handler.elapsed, handler.cpu / count * 1e6


def run_sdk(url: str, address: str, count: int, window: int) -> tuple[float, float]:
    """Messages per second through msgsafe.Producer (pipelined, every receipt awaited)."""
    from msgsafe import Producer, Status

    with Producer(url, outbox=False, max_in_flight=window) as producer:
        producer.send(address, BODY)  # connection set up outside the timing, as for raw
        started = time.perf_counter()
        cpu_started = time.process_time()
        futures = [producer.send_async(address, BODY) for _ in range(count)]
        for future in futures:
            if future.result(60).status is not Status.CONFIRMED:
                raise RuntimeError("sdk: a message was not confirmed")
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        return count / elapsed, cpu / count * 1e6


def run_transport(url: str, address: str, count: int, window: int) -> tuple[float, float]:
    """Messages per second through the adapter alone (Transport.publish, every future)."""
    from msgsafe.adapters import open_transport
    from msgsafe.endpoints import parse_url
    from msgsafe.message import Envelope

    transport = open_transport(parse_url(url), {"max_in_flight": window})
    try:
        transport.publish(Envelope.build(address, BODY)).result(60)
        envelopes = [Envelope.build(address, BODY) for _ in range(count)]
        started = time.perf_counter()
        cpu_started = time.process_time()
        futures = [transport.publish(env) for env in envelopes]
        for future in futures:
            future.result(60)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        return count / elapsed, cpu / count * 1e6
    finally:
        transport.close(10)


def run_wait(url: str, address: str, count: int) -> float:
    """Messages per second when every send waits for its outcome."""
    from proton import Message
    from proton.utils import BlockingConnection

    conn = BlockingConnection(_plain_url(url), **_sasl_kwargs(url))
    try:
        sender = conn.create_sender(address)
        started = time.perf_counter()
        for _ in range(count):
            sender.send(Message(body=BODY, id=str(uuid.uuid4()), durable=True))
        return count / (time.perf_counter() - started)
    finally:
        conn.close()


def _name(address: str, kind: str, round_: int, fixed: bool) -> str:
    # One address per run (a fresh queue) where the broker creates queues on first use;
    # RabbitMQ's queue must exist already.
    return address if fixed else f"{address}-{kind}-{round_}"


def _start_jvm_broker(kind: str, heap_mb: int | None = None) -> tuple[Any, str]:
    """Start the Artemis pair or the Broker-J group (each JVM with ``heap_mb`` of heap,
    or the cluster's default); return it and the serving node's URL."""
    if kind == "artemis":
        from msgsafe.cluster.artemis import ArtemisCluster

        pair = ArtemisCluster() if heap_mb is None else ArtemisCluster(heap=f"{heap_mb}m")
        pair.fetch()
        pair.start()
        return pair, pair.node_url(0)
    from msgsafe.cluster.qpid import QpidCluster

    group = QpidCluster() if heap_mb is None else QpidCluster(heap_mb=heap_mb)
    group.fetch()
    group.start()
    return group, group.node_url(group.wait_master())


def _declare_quorum_queue(amqp_url: str, name: str) -> str:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        queue = name.replace("/", "-")
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        return queue
    finally:
        conn.close()


def _plain_url(url: str) -> str:
    from msgsafe.endpoints import parse_url

    parsed = parse_url(url)
    endpoint = parsed.endpoints[0]
    return f"{'amqps' if parsed.tls else 'amqp'}://{endpoint.host}:{endpoint.port}"


def _sasl_kwargs(url: str) -> dict[str, Any]:
    from msgsafe.endpoints import parse_url

    parsed = parse_url(url)
    if parsed.username:
        return {
            "user": parsed.username,
            "password": parsed.password.reveal() if parsed.password else None,
            "allowed_mechs": "PLAIN",
            "allow_insecure_mechs": True,
        }
    return {"allowed_mechs": "ANONYMOUS"}


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the benchmark on each ``--broker`` (by default the Artemis pair, then the
    Broker-J group), print a table per broker and return the figures by broker."""
    parser = argparse.ArgumentParser(description="AMQP 1.0 publish throughput")
    parser.add_argument("--url", help="amqp10://... of a running broker")
    parser.add_argument(
        "--broker", action="append", choices=("artemis", "qpid", "rabbitmq", "peer")
    )
    parser.add_argument("--address", default="bench")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--wait-count", type=int, default=2_000)
    parser.add_argument("--window", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5_000)
    args = parser.parse_args(argv)
    if args.url is not None:
        return {"url": measure(args, "url")}
    return {broker: measure(args, broker) for broker in args.broker or ("artemis", "qpid")}


def measure(args: argparse.Namespace, broker: str) -> dict[str, float]:
    """The paired rounds on one broker (``url``: the running broker of ``--url``)."""
    peer = None
    cluster: Any = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-amqp10-")
    address = args.address
    fixed = False
    try:
        url = args.url
        if url is None and broker in ("artemis", "qpid"):
            cluster, url = _start_jvm_broker(broker)
        elif url is None and broker == "rabbitmq":
            from msgsafe.cluster.rabbitmq import RabbitCluster

            cluster = RabbitCluster(size=1)
            cluster.start()
            url = cluster.amqp10_url(0)
            address = "/amq/queue/" + _declare_quorum_queue(cluster.node_url(0), args.address)
            fixed = True
        elif url is None and broker == "peer":
            from tests.support.amqp10_peer import PeerProcess

            peer = PeerProcess(store=Path(tmp.name) / "store.db", credit=args.window).start()
            url = f"amqp10://127.0.0.1:{peer.port}"
        if url is None:
            raise SystemExit(f"no broker to measure: {broker}")
        if args.warmup:
            run_raw(url, _name(address, "warm-raw", 0, fixed), args.warmup, args.window)
            run_sdk(url, _name(address, "warm-sdk", 0, fixed), args.warmup, args.window)
        raw: list[float] = []
        sdk: list[float] = []
        raw_cpu: list[float] = []
        sdk_cpu: list[float] = []
        adapter: list[float] = []
        adapter_cpu: list[float] = []
        for i in range(args.rounds):
            rate, cpu = run_raw(url, _name(address, "raw", i, fixed), args.count, args.window)
            raw.append(rate)
            raw_cpu.append(cpu)
            rate, cpu = run_sdk(url, _name(address, "sdk", i, fixed), args.count, args.window)
            sdk.append(rate)
            sdk_cpu.append(cpu)
            rate, cpu = run_transport(url, _name(address, "tr", i, fixed), args.count, args.window)
            adapter.append(rate)
            adapter_cpu.append(cpu)
            print(
                f"round {i + 1}: raw {raw[-1]:,.0f} msg/s ({raw_cpu[-1]:.0f} us CPU/msg)   "
                f"sdk {sdk[-1]:,.0f} msg/s ({sdk_cpu[-1]:.0f} us)   "
                f"transport {adapter[-1]:,.0f} msg/s ({adapter_cpu[-1]:.0f} us)",
                flush=True,
            )
        wait = run_wait(url, _name(address, "wait", 0, fixed), args.wait_count)
    finally:
        if peer is not None:
            peer.stop()
        if cluster is not None:
            cluster.stop()
        tmp.cleanup()
    figures = {
        "raw_best": max(raw),
        "sdk_best": max(sdk),
        "raw_median": statistics.median(raw),
        "sdk_median": statistics.median(sdk),
        "wait": wait,
        "ratio_best": max(sdk) / max(raw),
        "ratio_median": statistics.median(sdk) / statistics.median(raw),
        "sdk_over_wait": max(sdk) / wait,
        "raw_cpu_us": min(raw_cpu),
        "sdk_cpu_us": min(sdk_cpu),
        "ratio_cpu": min(raw_cpu) / min(sdk_cpu),
        "transport_best": max(adapter),
        "transport_cpu_us": min(adapter_cpu),
        "ratio_transport": max(adapter) / max(raw),
    }
    from msgsafe.endpoints import parse_url

    where = f"{parse_url(url).redacted()} {address}"
    print(f"{args.count} x 100-byte durable messages, window {args.window}, {where}")
    print(f"  raw proton sender (unsettled)  {figures['raw_best']:>10,.0f} msg/s (best)")
    print(f"  msgsafe Producer               {figures['sdk_best']:>10,.0f} msg/s (best)")
    print(f"  msgsafe Transport (adapter)    {figures['transport_best']:>10,.0f} msg/s (best)")
    print(f"  send-and-wait per message      {figures['wait']:>10,.0f} msg/s")
    print(
        f"  client CPU per message: raw {figures['raw_cpu_us']:.0f} us, "
        f"sdk {figures['sdk_cpu_us']:.0f} us (raw/sdk {figures['ratio_cpu']:.2f}), "
        f"transport {figures['transport_cpu_us']:.0f} us"
    )
    print(
        f"  ratio sdk/raw {figures['ratio_best']:.2f} (best) "
        f"{figures['ratio_median']:.2f} (median); transport/raw "
        f"{figures['ratio_transport']:.2f}; sdk/wait {figures['sdk_over_wait']:.1f}x"
    )
    return figures


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
