"""The cost of telemetry: OpenTelemetry on (SDK installed, spans and metrics exported to
memory) against telemetry off, paired in one run on the same broker.

    python benchmarks/bench_telemetry.py [--rounds 7] [--sends 1500] [--batches 20]
                                         [--url amqp://...] [--readme benchmarks/README.md]

Without ``--url`` one RabbitMQ node is started on loopback (``msgsafe.cluster.rabbitmq``).
Two producers stay open side by side, each with its own quorum queue and the same
guarantees (publisher confirms, persistent, mandatory; no outbox detour happens):

- ``off``: ``Producer(url)`` — the ``stats()`` counters only (they are always on);
- ``otel``: ``Producer(url, telemetry=True)`` with the OpenTelemetry SDK: a
  ``TracerProvider`` with a ``BatchSpanProcessor`` into an ``InMemorySpanExporter``, a
  ``MeterProvider`` with an ``InMemoryMetricReader`` (collected after every round).

Each round times ``--sends`` blocking ``send()`` calls and ``--batches`` ``send_batch()``
calls of 1000 messages for each producer, interleaved call by call in ABBA order so
that drift on a shared machine falls on both. The overhead is the median over rounds of
``otel time / off time - 1``. Goals: <= 5 % on ``send``, <= 3 % on ``send_batch``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry import metrics, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks._readme import replace_section
from msgsafe import Producer, Status

BODY = b"x" * 100
BATCH = 1000
_KINDS = ("off send", "otel send", "off batch", "otel batch")


def _install() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return spans, reader


def _sends(producer: Producer, queue: str, count: int) -> tuple[float, float]:
    """Wall and client CPU seconds (every thread of this process) of ``count`` sends."""
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        if producer.send(queue, BODY).status is not Status.CONFIRMED:
            raise RuntimeError("a send was not confirmed: the comparison would be unfair")
    return time.perf_counter() - started, time.process_time() - cpu


def _batches(producer: Producer, queue: str, count: int) -> tuple[float, float]:
    """Wall and client CPU seconds of ``count`` batches of BATCH messages."""
    bodies = [BODY] * BATCH
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        if producer.send_batch(queue, bodies).confirmed != BATCH:
            raise RuntimeError("a batch was not confirmed: the comparison would be unfair")
    return time.perf_counter() - started, time.process_time() - cpu


def _sdk_floor(count: int = 5000) -> float:
    """Client CPU microseconds of what the SDK itself does per send, with no broker and
    no msgsafe: start a PRODUCER span, inject its context into headers, end it."""
    tracer = trace.get_tracer("bench")
    attributes = {"messaging.system": "rabbitmq", "messaging.destination.name": "q"}
    started = time.process_time()
    for _ in range(count):
        span = tracer.start_span("send q", kind=trace.SpanKind.PRODUCER, attributes=attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        span.end()
    return (time.process_time() - started) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sends", type=int, default=1500)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--url", help="a running RabbitMQ (default: start one node)")
    parser.add_argument("--readme", type=Path, help="write the figures into this README")
    args = parser.parse_args()

    spans, reader = _install()
    cluster = None
    url = args.url
    if url is None:
        from msgsafe.cluster.rabbitmq import RabbitCluster

        cluster = RabbitCluster(size=1)
        cluster.start()
        url = cluster.node_url(0)
    load = os.getloadavg()[0]
    send_ratio: list[float] = []
    batch_ratio: list[float] = []
    cpus: dict[str, list[float]] = {k: [] for k in _KINDS}
    rates: dict[str, list[float]] = {
        "off send": [],
        "otel send": [],
        "off batch": [],
        "otel batch": [],
    }
    try:
        off = Producer(url, outbox=False, declare="quorum")
        on = Producer(url, outbox=False, declare="quorum", telemetry=True)
        queues = {
            id(off): f"tel-off-{uuid.uuid4().hex[:8]}",
            id(on): f"tel-on-{uuid.uuid4().hex[:8]}",
        }
        try:
            for p in (off, on):  # warm-up: connections, queue declarations, code paths
                _sends(p, queues[id(p)], 200)
                _batches(p, queues[id(p)], 2)
            for r in range(args.rounds):
                took = dict.fromkeys(_KINDS, 0.0)
                cpu = dict.fromkeys(_KINDS, 0.0)
                # Interleaved call by call (ABBA): drift on a shared machine falls on both.
                for kind, calls, run in (
                    ("send", args.sends // 2, _sends),
                    ("batch", max(1, args.batches // 2), _batches),
                ):
                    for i in range(calls):
                        for p in (off, on, on, off) if i % 2 else (on, off, off, on):
                            key = f"{'off' if p is off else 'otel'} {kind}"
                            wall, used = run(p, queues[id(p)], 1)
                            took[key] += wall
                            cpu[key] += used
                reader.get_metrics_data()  # a metric collection per round, as an exporter would
                send_ratio.append(took["otel send"] / took["off send"] - 1)
                batch_ratio.append(took["otel batch"] / took["off batch"] - 1)
                sends = 2 * (args.sends // 2)
                batched = 2 * max(1, args.batches // 2) * BATCH
                for name in ("off", "otel"):
                    rates[f"{name} send"].append(sends / took[f"{name} send"])
                    rates[f"{name} batch"].append(batched / took[f"{name} batch"])
                    cpus[f"{name} send"].append(cpu[f"{name} send"] / sends * 1e6)
                    cpus[f"{name} batch"].append(cpu[f"{name} batch"] / batched * 1e6)
                print(
                    f"round {r + 1}: wall send {send_ratio[-1]:+.1%} send_batch "
                    f"{batch_ratio[-1]:+.1%}; cpu/msg send {cpus['off send'][-1]:.0f} -> "
                    f"{cpus['otel send'][-1]:.0f} us, batch {cpus['off batch'][-1]:.1f} -> "
                    f"{cpus['otel batch'][-1]:.1f} us",
                    flush=True,
                )
            stats_on = on.stats()
        finally:
            off.close()
            on.close()
    finally:
        if cluster is not None:
            cluster.stop()
    floor = _sdk_floor()
    trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
    exported = len(spans.get_finished_spans())
    send_over = statistics.median(send_ratio)
    batch_over = statistics.median(batch_ratio)
    med = {k: statistics.median(v) for k, v in rates.items()}
    med.update({f"cpu {k}": statistics.median(v) for k, v in cpus.items()})
    med["sdk floor"] = floor
    print(
        f"client CPU per message: send {med['cpu off send']:.1f} -> "
        f"{med['cpu otel send']:.1f} us, send_batch {med['cpu off batch']:.2f} -> "
        f"{med['cpu otel batch']:.2f} us; the SDK alone (span, inject, end) {floor:.1f} us"
    )
    print(
        f"send: off {med['off send']:,.0f} msg/s, otel {med['otel send']:,.0f} msg/s, "
        f"overhead {send_over:+.1%} (goal <= 5 %)\n"
        f"send_batch: off {med['off batch']:,.0f} msg/s, otel {med['otel batch']:,.0f} msg/s, "
        f"overhead {batch_over:+.1%} (goal <= 3 %)\n"
        f"spans exported {exported:,}; otel producer sent {stats_on.sent:,}, "
        f"confirmed {stats_on.confirmed:,}"
    )
    if args.readme:
        replace_section(
            args.readme, _section(args, med, send_over, batch_over, send_ratio, batch_ratio, load)
        )


def _section(
    args: argparse.Namespace,
    med: dict[str, float],
    send_over: float,
    batch_over: float,
    send_ratio: list[float],
    batch_ratio: list[float],
    load: float,
) -> str:
    day = datetime.date.today().isoformat()
    floor = f"{med['sdk floor']:.0f}"
    command = (
        f"python benchmarks/bench_telemetry.py --rounds {args.rounds} --sends {args.sends} "
        f"--batches {args.batches} --readme benchmarks/README.md"
    )
    rows = [
        _row("`send()` (blocking, one message)", med, "send", send_over, send_ratio, 0.05),
        _row("`send_batch()` (1000 messages)", med, "batch", batch_over, batch_ratio, 0.03),
    ]
    return f"""## Telemetry

`{command}`
({day}, {platform.machine()}, {os.cpu_count()} cores, load {load:.1f} at start; one local
RabbitMQ node, quorum queues). OpenTelemetry on (SDK, `BatchSpanProcessor` into an
in-memory exporter, in-memory metric reader) against telemetry off (the `stats()`
counters only), two producers side by side, calls interleaved ABBA; overhead is the
median over {args.rounds} rounds of `otel time / off time - 1`; client CPU is
`time.process_time()` (every thread of the process) per message, median over rounds. On
a loaded machine the wall-clock ratio is mostly scheduling noise; the CPU column is the
cost telemetry itself adds. Of it, the OpenTelemetry SDK alone (start a span, inject its
context, end it; no broker, no msgsafe) takes {floor} us per send here; the `traceparent`
header each message then carries is encoded by the adapter like any other header.

| call | off | OTel on | overhead | per-round range | goal | client CPU/msg off -> on |
|---|---:|---:|---:|---:|---|---:|
{rows[0]}
{rows[1]}
"""


def _row(
    call: str,
    med: dict[str, float],
    kind: str,
    over: float,
    ratios: list[float],
    goal: float,
) -> str:
    verdict = "meets" if over <= goal else "misses"
    return (
        f"| {call} | {med[f'off {kind}']:,.0f} msg/s | {med[f'otel {kind}']:,.0f} msg/s "
        f"| {over:+.1%} | {min(ratios):+.1%} .. {max(ratios):+.1%} "
        f"| <= {goal:.0%}: {verdict} "
        f"| {med[f'cpu off {kind}']:.2f} -> {med[f'cpu otel {kind}']:.2f} us |"
    )


if __name__ == "__main__":
    main()
