"""Kafka publish throughput: msgsafe vs a raw confluent-kafka ``Producer``, same settings.

1M 100-byte messages to one 3-partition topic (replication factor 3), in one run against
one 3-node Apache Kafka cluster. The baseline every goal is read against is ``raw + id``:
the same guarantees as msgsafe (``acks=all``, idempotence, the same ``linger.ms``,
``batch.num.messages`` and queue size) and the same ``msgsafe-id`` header, since a
producer without an id cannot tell a resent message from a new one.

- ``raw + id`` — ``confluent_kafka.Producer``, each message carrying a UUID in the
  ``msgsafe-id`` header (ids made before the clock starts, which flatters the raw side);
  one delivery callback counting successes, ``poll(0)`` every 1000 messages, ``flush()``
  at the end. No msgsafe code.
- ``raw`` — the same without the header; ``raw, positional`` — ``raw`` with the delivery
  callback passed positionally (``produce(topic, value, None, -1, callback)``): the
  binding parses keyword arguments about 1 µs slower per call. Shown for reference.
- ``batch`` — ``msgsafe.Producer.send_batch_async`` with batches of 10,000 bodies (fresh
  UUIDv7 ids made inside, the ``msgsafe-id`` header, one receipt per batch), then every
  receipt; every message must be CONFIRMED.
- ``sdk`` — ``msgsafe.Producer.send_async`` for every message (a fresh UUIDv7 id, the
  ``msgsafe-id`` header, a receipt per message), then ``flush()``; every receipt must
  be CONFIRMED. ``transport`` — the adapter alone (``Envelope.build`` +
  ``KafkaTransport.publish``), to show which layer the time goes to.
- ``send`` — ``msgsafe.Producer.send`` one message at a time, each blocking until
  CONFIRMED (``--sync-messages``, 2,000); against ``raw send``: ``produce()`` with the
  id header then ``flush()`` per message, the hand-written synchronous send. The two
  take turns in blocks of 20 messages (see :func:`run_sync_pair`).
- ``send after pauses`` — the same two sends, one message each after a 60 ms pause
  (``--paused-messages``, 100), taking turns: the median latency of each. After a pause
  msgsafe's poll thread waits in librdkafka's ``poll()`` and may take the send's
  delivery report; the sender must not sit out a slice for it, nor wait out
  ``linger.ms`` (see ``KafkaTransport.hurry``).

A warm-up round (``raw + id``, not counted) lets the brokers' JIT settle first; then
rounds alternate raw / msgsafe so both see the same broker state; the best round of each
is reported with the ratios against ``raw + id`` (goal >= 0.95), wall-clock and CPU time
per message (``time.process_time()``: the client process, all its threads).

The brokers are a 3-node Apache Kafka cluster started here
(:class:`msgsafe.cluster.kafka.KafkaCluster`: KRaft, replication factor 3,
``min.insync.replicas=2``) unless ``--url kafka://...`` names another.

    python -m benchmarks.bench_kafka [--messages 1000000] [--rounds 3]
        [--readme benchmarks/README.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section

BODY = b"x" * 100
LINGER_MS = 5.0
BATCH = 10_000
QUEUE = 100_000


def raw_settings(bootstrap: str) -> dict[str, Any]:
    """The raw producer's settings: what msgsafe's defaults amount to."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "batch.num.messages": BATCH,
        "queue.buffering.max.messages": QUEUE,
        "message.timeout.ms": 28_800,
        "log_level": 0,
    }


def run_raw(
    bootstrap: str, topic: str, count: int, *, ids: bool = False, positional: bool = False
) -> tuple[float, float]:
    """(messages per second, CPU microseconds per message) of a raw producer; with
    ``ids`` every message carries a UUID header (made before the clock starts); with
    ``positional`` the delivery callback is passed positionally (the fastest call)."""
    from confluent_kafka import Producer

    producer = Producer(raw_settings(bootstrap))
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    headers = [[("msgsafe-id", str(uuid.uuid4()))] for _ in range(count)] if ids else None
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    started, cpu = time.perf_counter(), time.process_time()
    if positional:
        _produce_positional(producer, topic, count, on_delivery)
    elif headers is None:
        _produce_plain(producer, topic, count, on_delivery)
    else:
        _produce_with_headers(producer, topic, headers, on_delivery)
    producer.flush(120)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if delivered != count:
        raise SystemExit(f"raw: only {delivered} of {count} delivered")
    return count / elapsed, cpu / count * 1e6


def _produce_plain(producer: Any, topic: str, count: int, on_delivery: Any) -> None:
    # Two loops rather than one with a branch: neither baseline pays for the other.
    for i in range(count):
        while True:
            try:
                producer.produce(topic, BODY, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)


def _produce_positional(producer: Any, topic: str, count: int, on_delivery: Any) -> None:
    # produce(topic, value, key, partition, callback): no keyword argument to parse.
    for i in range(count):
        while True:
            try:
                producer.produce(topic, BODY, None, -1, on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)


def _produce_with_headers(
    producer: Any, topic: str, headers: list[list[tuple[str, str]]], on_delivery: Any
) -> None:
    for i, header in enumerate(headers):
        while True:
            try:
                producer.produce(topic, BODY, headers=header, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)


def produce_call_cost(calls: int = 200_000, rounds: int = 3) -> dict[str, float]:
    """CPU µs of one ``Producer.produce()`` call in three forms, best of ``rounds``: a
    producer whose broker address refuses connections, so messages only queue locally
    and only the client library is measured (no broker, no network)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",  # discard port: nothing listens
            "queue.buffering.max.messages": calls + 1,
            "queue.buffering.max.kbytes": 2**21,
            "acks": "all",
            "enable.idempotence": True,
            "log_level": 0,
        }
    )

    def on_delivery(_err: Any, _msg: Any) -> None:
        pass

    header = [("msgsafe-id", str(uuid.uuid4()))]
    forms: dict[str, Callable[[], None]] = {
        "keyword": lambda: producer.produce("t", BODY, on_delivery=on_delivery),
        "positional": lambda: producer.produce("t", BODY, None, -1, on_delivery),
        "positional + header": lambda: producer.produce(
            "t", BODY, None, -1, on_delivery, None, 0, header
        ),
    }
    best = dict.fromkeys(forms, float("inf"))
    for _ in range(rounds):
        for name, call in forms.items():
            started = time.process_time()
            for _ in range(calls):
                call()
            best[name] = min(best[name], (time.process_time() - started) / calls * 1e6)
            producer.purge()
            producer.poll(0)
    return best


def _producer(url: str, outbox: Path) -> Any:
    """A msgsafe.Producer with the raw producer's settings (see :func:`raw_settings`)."""
    import msgsafe

    return msgsafe.Producer(
        url,
        outbox=outbox,
        send_timeout=60,
        confirm_timeout=30,
        linger_ms=LINGER_MS,
        batch_num_messages=BATCH,
        max_in_flight=QUEUE,
    )


def run_batch(url: str, topic: str, count: int, outbox: Path) -> tuple[float, float]:
    """(messages per second, CPU microseconds per message) of ``Producer.send_batch_async``
    in batches of BATCH bodies."""

    bodies = [BODY] * BATCH
    with _producer(url, outbox) as producer:
        producer.send(topic, b"warm-up")
        started, cpu = time.perf_counter(), time.process_time()
        futures = []
        left = count
        while left > 0:
            size = min(BATCH, left)
            futures.append(producer.send_batch_async(topic, bodies[:size]))
            left -= size
        receipts = [f.result(1800) for f in futures]
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    confirmed = sum(r.confirmed for r in receipts)
    if confirmed != count:
        raise SystemExit(f"batch: only {confirmed} of {count} confirmed")
    return count / elapsed, cpu / count * 1e6


def run_sdk(url: str, topic: str, count: int, outbox: Path) -> tuple[float, float]:
    """(messages per second, CPU microseconds per message) of msgsafe.Producer."""
    import msgsafe

    confirmed = 0

    def on_receipt(future: Any) -> None:
        nonlocal confirmed
        if future.exception() is None and future.result().status is msgsafe.Status.CONFIRMED:
            confirmed += 1

    with _producer(url, outbox) as producer:
        producer.send(topic, b"warm-up")  # connected before the clock starts
        started, cpu = time.perf_counter(), time.process_time()
        send = producer.send_async
        for _ in range(count):
            send(topic, BODY).add_done_callback(on_receipt)
        if not producer.flush(1800):
            raise SystemExit("sdk: not every receipt arrived within 1800 s")
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if confirmed != count:
        raise SystemExit(f"sdk: only {confirmed} of {count} confirmed")
    return count / elapsed, cpu / count * 1e6


def run_sync_pair(
    url: str, bootstrap: str, topic: str, count: int, outbox: Path
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(messages per second, CPU µs per message) of a hand-written synchronous send
    (``produce()`` with the id header, then ``flush()`` until its delivery report) and
    of ``msgsafe.Producer.send`` (returning once CONFIRMED), one message at a time each.

    Both producers are open at once and take turns in blocks of 20 messages, so drifts
    in the shared machine's load hit both alike (a per-message latency is a few ms,
    and rounds of separate runs differed by 2x on a loaded machine)."""
    from confluent_kafka import Producer

    import msgsafe

    raw = Producer(raw_settings(bootstrap))
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    headers = [[("msgsafe-id", str(uuid.uuid4()))] for _ in range(count)]
    raw.list_topics(topic, timeout=10)
    spent = {"raw": [0.0, 0.0], "sdk": [0.0, 0.0]}
    confirmed = 0
    with _producer(url, outbox) as producer:
        producer.send(topic, b"warm-up")
        send = producer.send
        for block in range(0, count, 20):
            size = min(20, count - block)
            started, cpu = time.perf_counter(), time.process_time()
            for header in headers[block : block + size]:
                raw.produce(topic, BODY, headers=header, on_delivery=on_delivery)
                raw.flush(30)
            spent["raw"][0] += time.perf_counter() - started
            spent["raw"][1] += time.process_time() - cpu
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(size):
                confirmed += send(topic, BODY).status is msgsafe.Status.CONFIRMED
            spent["sdk"][0] += time.perf_counter() - started
            spent["sdk"][1] += time.process_time() - cpu
    if delivered != count or confirmed != count:
        raise SystemExit(f"sync: raw delivered {delivered}, send confirmed {confirmed} of {count}")
    (raw_s, raw_cpu), (sdk_s, sdk_cpu) = spent["raw"], spent["sdk"]
    return (count / raw_s, raw_cpu / count * 1e6), (count / sdk_s, sdk_cpu / count * 1e6)


#: The pause before each send of :func:`run_paused_pair`: longer than the poll thread's
#: grace (20 ms), so it is back in librdkafka's poll() when the send starts.
PAUSE_S = 0.06


def run_paused_pair(
    url: str, bootstrap: str, topic: str, count: int, outbox: Path
) -> tuple[float, float]:
    """Median seconds of a hand-written synchronous send (``produce()`` with the id
    header, then ``flush()``) and of ``msgsafe.Producer.send``, each message after a
    pause of :data:`PAUSE_S`; the two take turns message by message."""
    import statistics

    from confluent_kafka import Producer

    import msgsafe

    raw = Producer(raw_settings(bootstrap))
    raw.list_topics(topic, timeout=10)
    took: dict[str, list[float]] = {"raw": [], "sdk": []}
    with _producer(url, outbox) as producer:
        producer.send(topic, b"warm-up")
        raw.produce(topic, b"warm-up")
        raw.flush(30)
        for _ in range(count):
            time.sleep(PAUSE_S)  # the pause is what is measured, not a synchronisation
            started = time.perf_counter()
            raw.produce(topic, BODY, headers=[("msgsafe-id", str(uuid.uuid4()))])
            if raw.flush(30) != 0:
                raise SystemExit("paused: a raw send was not delivered within 30 s")
            took["raw"].append(time.perf_counter() - started)
            time.sleep(PAUSE_S)  # the pause is what is measured, not a synchronisation
            started = time.perf_counter()
            if producer.send(topic, BODY).status is not msgsafe.Status.CONFIRMED:
                raise SystemExit("paused: a send was not CONFIRMED")
            took["sdk"].append(time.perf_counter() - started)
    return statistics.median(took["raw"]), statistics.median(took["sdk"])


def run_transport(url: str, topic: str, count: int) -> tuple[float, float]:
    """(messages per second, CPU microseconds per message) of the adapter alone: an
    envelope (UUIDv7 id) per message, ``KafkaTransport.publish``, every future awaited
    by a done-callback. The SDK row minus this row is the producer layer's share."""
    from concurrent.futures import Future

    from msgsafe.adapters.kafka import open_transport
    from msgsafe.endpoints import parse_url
    from msgsafe.message import Envelope

    transport = open_transport(
        parse_url(url),
        {
            "confirm_timeout": 30,
            "linger_ms": LINGER_MS,
            "batch_num_messages": BATCH,
            "max_in_flight": QUEUE,
        },
    )
    confirmed = 0
    done = 0

    def on_done(future: Future[None]) -> None:
        nonlocal confirmed, done
        done += 1
        if future.exception() is None:
            confirmed += 1

    try:
        transport.publish(Envelope.build(topic, b"warm-up")).result(30)
        started, cpu = time.perf_counter(), time.process_time()
        publish, build = transport.publish, Envelope.build
        for _ in range(count):
            publish(build(topic, BODY)).add_done_callback(on_done)
        deadline = time.monotonic() + 1800
        while done < count and time.monotonic() < deadline:
            time.sleep(0.005)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        transport.close()
    if confirmed != count:
        raise SystemExit(f"transport: only {confirmed} of {count} confirmed")
    return count / elapsed, cpu / count * 1e6


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[tuple[str, str]]:
    if url is not None:
        yield url, url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("@")[-1]
        return
    from msgsafe.cluster.kafka import KafkaCluster

    with KafkaCluster(nodes=3) as cluster:
        print(f"kafka cluster up in {cluster.start_seconds:.1f} s: {cluster.url}", flush=True)
        yield cluster.url, cluster.bootstrap


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sync-messages", type=int, default=2_000)
    parser.add_argument("--paused-messages", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--url", default=None, help="kafka://host:port,... (default: start a 3-node cluster)"
    )
    parser.add_argument("--readme", type=Path, default=None, help="update its ## Kafka section")
    parser.add_argument(
        "--skip-per-message",
        action="store_true",
        help="measure only raw, raw + id and the batch path",
    )
    args = parser.parse_args(argv)

    from msgsafe.cluster.kafka_admin import create_topic

    runs: dict[str, list[tuple[float, float]]] = {}
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]

    def record(name: str, n: int, result: tuple[float, float]) -> None:
        runs.setdefault(name, []).append(result)
        print(f"round {n + 1}: {name} {result[0]:,.0f} msg/s, {result[1]:.1f} µs CPU", flush=True)

    with _broker(args.url) as (url, bootstrap), tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            # Replicated like production topics: acks=all waits for the in-sync followers.
            create_topic(bootstrap, topic, 3, 3, timeout=30)
            # NOTE: the first run into a new topic measured half the rate of later ones
            # (its log segments and the brokers' JIT warming up): not counted.
            warm = run_raw(bootstrap, topic, min(args.messages, 200_000), ids=True)
            print(f"round {n + 1}: warm-up {warm[0]:,.0f} msg/s (not counted)", flush=True)
            record("raw + id", n, run_raw(bootstrap, topic, args.messages, ids=True))
            record("batch", n, run_batch(url, topic, args.messages, Path(tmp) / f"b{n}.db"))
            record("raw", n, run_raw(bootstrap, topic, args.messages))
            record("raw positional", n, run_raw(bootstrap, topic, args.messages, positional=True))
            if args.skip_per_message:
                continue
            record("sdk", n, run_sdk(url, topic, args.messages, Path(tmp) / f"o{n}.db"))
            record("transport", n, run_transport(url, topic, args.messages))
            raw_send, send = run_sync_pair(
                url, bootstrap, topic, args.sync_messages, Path(tmp) / f"s{n}.db"
            )
            record("raw send", n, raw_send)
            record("send", n, send)
            raw_paused, paused = run_paused_pair(
                url, bootstrap, topic, args.paused_messages, Path(tmp) / f"p{n}.db"
            )
            runs.setdefault("paused", []).append((raw_paused, paused))
            print(
                f"round {n + 1}: send after pauses {paused * 1000:.2f} ms, "
                f"raw {raw_paused * 1000:.2f} ms (medians)",
                flush=True,
            )
    calls = produce_call_cost()
    import confluent_kafka

    ended = datetime.datetime.now(datetime.UTC)
    stamp = (
        f"Measured {started:%Y-%m-%d %H:%M}\N{EN DASH}{ended:%H:%M} UTC "
        f"on {os.cpu_count()} cores, load average {load_start:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end, Python {platform.python_version()}, "
        f"confluent-kafka {confluent_kafka.version()}."
    )
    text = "\n".join([stamp, "", *report_lines(args, runs, calls)])
    print(text)
    if args.readme:
        update_readme(args.readme, text, args)


def report_lines(
    args: argparse.Namespace, runs: dict[str, list[tuple[float, float]]], calls: dict[str, float]
) -> list[str]:
    """The README section's body: the best round of each variant, ratios against raw + id."""
    paused = runs.pop("paused", [])
    best = {name: max(results) for name, results in runs.items()}
    base, base_sync = best["raw + id"][0], best.get("raw send", (1.0, 0.0))[0]
    rows = [
        ("raw confluent-kafka Producer + the msgsafe-id header (baseline)", "raw + id", base),
        ("raw, no id header", "raw", base),
        ("raw, no id header, callback passed positionally", "raw positional", base),
        (f"msgsafe.Producer.send_batch_async, {BATCH:,} a batch", "batch", base),
        ("msgsafe.Producer.send_async, one message a call", "sdk", base),
        ("adapter alone: Envelope.build + KafkaTransport.publish", "transport", base),
        ("raw synchronous send: produce() + flush() per message (baseline)", "raw send", base_sync),
        ("msgsafe.Producer.send, blocking until CONFIRMED", "send", base_sync),
    ]
    lines = [
        f"{args.messages:,} messages of {len(BODY)} bytes ({args.sync_messages:,} for the "
        f"synchronous sends), acks=all, idempotence, linger.ms={LINGER_MS:g}, "
        f"batch.num.messages={BATCH}, best of {args.rounds} alternating round(s) (each after "
        "a warm-up run), Apache Kafka 4.1.2 (3 KRaft nodes on loopback, "
        "replication factor 3, min.insync.replicas=2).",
        "",
        "| producer | msg/s | CPU µs/msg | / baseline |",
        "|---|---|---|---|",
    ]
    for label, name, against in rows:
        if name in best:
            rate, cpu = best[name]
            bold = "**" if name in ("batch", "sdk", "send") else ""
            ratio = f"{bold}{rate / against:.2f}{bold}"
            lines.append(f"| {label} | {rate:,.0f} | {cpu:.1f} | {ratio} |")
    lines.append("")
    ratios = [f"send_batch_async / (raw + id): **{best['batch'][0] / base:.2f}**"]
    if "sdk" in best:
        ratios.append(f"send_async / (raw + id): **{best['sdk'][0] / base:.2f}**")
        ratios.append(f"send / raw send: **{best['send'][0] / base_sync:.2f}**")
    lines.append("Goal >= 0.95: " + "; ".join(ratios) + ".")
    if paused:
        # The round whose send was quickest next to its raw send, like the other rows.
        raw_s, sdk_s = max(paused, key=lambda pair: pair[0] / pair[1])
        lines.append("")
        lines.append(
            f"A blocking send after a {PAUSE_S * 1000:.0f} ms pause ({args.paused_messages} "
            "a round, taking turns with the raw send), median latency by round: "
            + ", ".join(f"send {b * 1000:.2f} ms / raw {a * 1000:.2f} ms" for a, b in paused)
            + f"; raw / send at the best round: **{raw_s / sdk_s:.2f}** (no goal; shown)."
        )
    by_round = []
    for name, baseline in (("batch", "raw + id"), ("send", "raw send")):
        pairs = zip(runs.get(name, []), runs.get(baseline, []), strict=False)
        by_round.append(f"{name} / {baseline} " + ", ".join(f"{a[0] / b[0]:.2f}" for a, b in pairs))
    lines.append("")
    lines.append("By round (the same round's runs): " + "; ".join(by_round) + ".")
    lines.append("")
    lines.append(
        "One `Producer.produce()` call alone (no broker; best of 3 x 200,000 calls), CPU: "
        + ", ".join(f"{name} {us:.2f} µs" for name, us in calls.items())
        + "."
    )
    lines.append("")
    per_round = []
    for n in range(args.rounds):
        parts = [f"{name} {done[n][0]:,.0f}" for name, done in runs.items() if n < len(done)]
        per_round.append(", ".join(parts))
    lines.append("Runs, in order (msg/s): " + "; ".join(per_round) + ".")
    return lines


def update_readme(path: Path, body: str, args: argparse.Namespace) -> None:
    """Replace the ``## Kafka`` section of ``path`` (created if missing)."""
    section = (
        "## Kafka\n\n`flock /tmp/msgsafe-bench.lock python3 -m benchmarks.bench_kafka "
        f"--messages {args.messages} --rounds {args.rounds} --readme benchmarks/README.md`"
        "\n\n" + body + "\n"
    )
    replace_section(path, section)


if __name__ == "__main__":
    main()
