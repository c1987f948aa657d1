"""Per-message sends: msgsafe against the raw clients, side by side in one run.

    flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_send.py
        [--only kafka|rabbitmq|amqp10] [--rounds 6] [--messages 20000]
        [--blocking-messages 400] [--block 20] [--url kafka://...|amqp://...|amqp10://...]
        [--profile 5000] [--readme benchmarks/README.md]

One message a call, the way application code sends, on one real broker node per
protocol started here through ``msgsafe.cluster`` (``--url`` names a running one
instead; its scheme says which protocol it serves):

- **Kafka** (``KafkaCluster(nodes=1)``, a 3-partition topic), pipelined, every receipt
  awaited at the end of each run:

  - ``raw``: ``confluent_kafka.Producer`` with the Kafka adapter's own settings
    (:func:`~msgsafe.adapters.kafka.config.producer_settings` for the same URL and the
    default options: ``acks=all``, ``enable.idempotence=true``, ``linger.ms`` ...). Per
    message: ``produce(topic, body, key=k, headers=[("msgsafe-id", str(uuid.uuid4()))],
    on_delivery=cb)`` (``poll(0.005)`` and again on ``BufferError``), then ``poll(0)``;
    ``flush()`` at the end; ``cb`` counts the reports without an error.
  - ``msgsafe``: ``msgsafe.Producer.send_async(topic, body, key=k)`` (outbox in a temp
    dir), every future kept; ``flush()`` at the end, then every receipt must be
    CONFIRMED (counted inside the clock).
  - ``compat``: the drop-in ``msgsafe.compat.confluent_kafka.Producer`` (same URL,
    ``acks=all``, idempotence, outbox in a temp dir): the raw loop without the header
    (the wrapper adds the id), ``poll(0)`` per message, ``flush()`` at the end.

  - ``floor``: the least a ``send_async`` returning a receipt future must do per
    message on the same producer settings (:class:`KafkaFloor`): an id, a future, one
    ``produce()`` whose report resolves the future with a receipt, ``poll(0)``. Not a
    producer (no validation, order, outbox or counters): it shows how close the goal
    can be approached at all in Python.

  Keys: bytes, 16 of them in turn (a ``str`` key takes the wrapper's general path).
  Goals: msgsafe / raw >= 0.8; compat / raw >= 0.9; floor / raw is printed beside them.

- **RabbitMQ** (``RabbitCluster(nodes=1)``, a durable quorum queue), blocking:

  - ``raw``: pika ``BlockingConnection``, ``channel.confirm_delivery()``, per message
    ``basic_publish("", queue, body, BasicProperties(delivery_mode=2, message_id=id,
    headers={"msgsafe-id": id}), mandatory=True)`` (``id = str(uuid.uuid4())``), which
    returns once the broker confirmed it.
  - ``msgsafe``: ``msgsafe.Producer.send(queue, body)`` (outbox in a temp dir), which
    returns once CONFIRMED.

  Goal: msgsafe / raw >= 0.95.

- **AMQP 1.0** (RabbitMQ's AMQP 1.0 plugin on the same node, the same kind of queue as
  ``/amq/queue/NAME``), blocking:

  - ``raw``: proton ``BlockingConnection(url).create_sender(address)``, per message
    ``send(Message(body=body, id=id, durable=True, properties={"msgsafe-id": id}))``,
    which returns once the broker settled it (accepted).
  - ``msgsafe``: ``msgsafe.Producer.send(address, body)`` on the ``amqp10://`` URL.
  - ``floor``: the least a thread-safe blocking send over proton does
    (:class:`Amqp10Floor`): proton's own pattern for sending from other threads, a
    ``Container`` running on its thread, each message handed over through an
    ``EventInjector``, its ``accepted`` outcome resolving a future the caller waits on.
    Not a producer (no outbox, fail-over, deadlines or counters): it shows what the
    hand-over to an I/O thread costs, which ``BlockingConnection`` (the caller's thread
    runs the connection, one thread per connection) does not pay.

  Goal: msgsafe / raw >= 0.95.

Every variant is warmed up (connected, its first sends made) before the clocks start.
The Kafka variants take turns by round (ABC, then CBA); the blocking pairs take turns
in blocks of ``--block`` messages within each round (AB, BA, AB ...), so a change in
the shared machine's load hits both alike. Per round the ratio is msgsafe's wall-clock
rate over raw's in the same round; a goal is read on the median of the rounds. CPU is
``time.process_time()`` of this process (every thread: the clients' I/O threads and
librdkafka's included) per message, over all rounds.

``--profile N``: after the rounds, each msgsafe variant sends ``N`` more messages with a
fresh producer under :mod:`cProfile`, one profiler per thread timed with that thread's
CPU clock (``time.thread_time``); the table printed says where the CPU goes per message.

``send_batch_async`` is measured by ``benchmarks/bench_kafka.py`` (Kafka) and
``benchmarks/bench_rabbitmq.py`` (RabbitMQ): not repeated here.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._readme import replace_section
from msgsafe.message import Guarantee, Status
from msgsafe.message import new_receipt as _new_receipt

BODY = b"x" * 100
KEYS = [f"key-{i}".encode() for i in range(16)]
PROTOCOLS = ("kafka", "rabbitmq", "amqp10")
TITLE = "## Per-message sends"

#: (protocol, variant compared, baseline, goal, what is compared)
GOALS: tuple[tuple[str, str, str, float, str], ...] = (
    ("kafka", "msgsafe", "raw", 0.8, "`Producer.send_async` / raw `produce()` + `poll(0)`"),
    ("kafka", "compat", "raw", 0.9, "drop-in `compat.confluent_kafka.Producer.produce` / raw"),
    ("rabbitmq", "msgsafe", "raw", 0.95, "blocking `Producer.send` / raw pika blocking confirm"),
    ("amqp10", "msgsafe", "raw", 0.95, "blocking `Producer.send` / raw proton `BlockingSender`"),
    # Not a goal: how close any receipt-future API can get (see KafkaFloor).
    ("kafka", "floor", "raw", 0.0, "floor: id + future + receipt + `produce()` / raw"),
    # Not a goal: what a send handed to an I/O thread costs on proton (see Amqp10Floor).
    ("amqp10", "floor", "raw", 0.0, "floor: proton `Container` thread + `EventInjector` / raw"),
    ("amqp10", "msgsafe", "floor", 0.0, "blocking `Producer.send` / that floor"),
)

#: What each variant's loop does, for the output.
LOOPS: dict[tuple[str, str], str] = {
    ("kafka", "raw"): (
        "confluent_kafka.Producer(producer_settings(url, defaults)); per message "
        "produce(topic, body, key=k, headers=[('msgsafe-id', str(uuid.uuid4()))], "
        "on_delivery=cb) then poll(0); flush() at the end; cb counts successes"
    ),
    ("kafka", "msgsafe"): (
        "msgsafe.Producer(url, outbox=file).send_async(topic, body, key=k) per message; "
        "flush(); every receipt checked CONFIRMED"
    ),
    ("kafka", "compat"): (
        "msgsafe.compat.confluent_kafka.Producer; per message produce(topic, body, key=k, "
        "on_delivery=cb) then poll(0); flush() at the end; cb counts successes"
    ),
    ("kafka", "floor"): (
        "the floor under send_async: new_message_id(), a LightFuture, produce(topic, body, "
        "k, headers={'msgsafe-id': id}, on_delivery=report) then poll(0); the report "
        "resolves the future with a Receipt; nothing else"
    ),
    ("rabbitmq", "raw"): (
        "pika.BlockingConnection, confirm_delivery(); per message basic_publish('', queue, "
        "body, BasicProperties(delivery_mode=2, message_id=id, headers={'msgsafe-id': id}), "
        "mandatory=True), id = str(uuid.uuid4())"
    ),
    ("rabbitmq", "msgsafe"): "msgsafe.Producer(url, outbox=file).send(queue, body)",
    ("amqp10", "raw"): (
        "proton.utils.BlockingConnection(url).create_sender(address); per message "
        "send(Message(body=body, id=id, durable=True, properties={'msgsafe-id': id}))"
    ),
    ("amqp10", "msgsafe"): "msgsafe.Producer(amqp10_url, outbox=file).send(address, body)",
    ("amqp10", "floor"): (
        "proton Container(handler) on its own thread; per message the caller queues "
        "Message(body=body, id=id, durable=True, properties={'msgsafe-id': id}) with a "
        "future, EventInjector.trigger(); the handler sends it, on_accepted resolves the "
        "future; the caller waits on it"
    ),
}


@dataclass
class Tally:
    """Wall-clock and CPU seconds spent on ``messages`` messages."""

    wall: float = 0.0
    cpu: float = 0.0
    messages: int = 0

    def add(self, wall: float, cpu: float, messages: int) -> None:
        self.wall += wall
        self.cpu += cpu
        self.messages += messages

    @property
    def rate(self) -> float:
        return self.messages / self.wall if self.wall > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.messages * 1e6 if self.messages else 0.0


@dataclass
class Result:
    """One protocol's rounds: per variant, one tally per round."""

    protocol: str
    broker: str
    rounds: dict[str, list[Tally]] = field(default_factory=dict)

    def total(self, variant: str) -> Tally:
        whole = Tally()
        for tally in self.rounds[variant]:
            whole.add(tally.wall, tally.cpu, tally.messages)
        return whole

    def ratios(self, variant: str, baseline: str) -> list[float]:
        """``variant`` / ``baseline`` wall-clock rate, round by round."""
        pairs = zip(self.rounds[variant], self.rounds[baseline], strict=True)
        return [a.rate / b.rate for a, b in pairs if b.rate > 0]


class Variant:
    """One way of sending: ``run(count)`` sends ``count`` messages one call each and
    returns once every one of them is confirmed (raises otherwise)."""

    name = ""

    def run(self, count: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


# --- Kafka ------------------------------------------------------------------------------


class KafkaRaw(Variant):
    name = "raw"

    def __init__(self, url: str, topic: str) -> None:
        from confluent_kafka import Producer

        from msgsafe.adapters._config import build_config
        from msgsafe.adapters.kafka.config import KafkaOptions, producer_settings
        from msgsafe.endpoints import parse_url

        parsed = parse_url(url)
        self._producer = Producer(producer_settings(parsed, build_config(KafkaOptions, parsed, {})))
        self._topic = topic
        self.delivered = 0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1

    def run(self, count: int) -> None:
        producer, topic, keys = self._producer, self._topic, KEYS
        produce, poll, uuid4, cb = producer.produce, producer.poll, uuid.uuid4, self._on_delivery
        before = self.delivered
        for i in range(count):
            headers: list[tuple[str, str | bytes | None]] = [("msgsafe-id", str(uuid4()))]
            while True:
                try:
                    produce(topic, BODY, key=keys[i & 15], headers=headers, on_delivery=cb)
                    break
                except BufferError:
                    poll(0.005)
            poll(0)
        if producer.flush(120) or self.delivered - before != count:
            raise SystemExit(f"kafka raw: {self.delivered - before} of {count} delivered")

    def close(self) -> None:
        self._producer.flush(30)


class KafkaMsgsafe(Variant):
    name = "msgsafe"

    def __init__(self, url: str, topic: str, outbox: Path) -> None:
        import msgsafe

        self._producer = msgsafe.Producer(url, outbox=outbox)
        self._topic = topic
        self._confirmed = msgsafe.Status.CONFIRMED

    def run(self, count: int) -> None:
        send, topic, keys = self._producer.send_async, self._topic, KEYS
        futures = [send(topic, BODY, key=keys[i & 15]) for i in range(count)]
        if not self._producer.flush(120):
            raise SystemExit("kafka msgsafe: receipts missing after 120 s")
        confirmed = self._confirmed
        good = sum(1 for f in futures if f.result().status is confirmed)
        if good != count:
            raise SystemExit(f"kafka msgsafe: {good} of {count} confirmed")

    def close(self) -> None:
        self._producer.close()


_CONFIRMED = Status.CONFIRMED
_REPLICATED = Guarantee.REPLICATED


class _FloorReport:
    """The floor's delivery report: one slotted object that resolves its future."""

    __slots__ = ("future", "message_id", "topic")

    def __init__(self, future: Any, message_id: str, topic: str) -> None:
        self.future = future
        self.message_id = message_id
        self.topic = topic

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.future.set_result(
                _new_receipt(self.message_id, _CONFIRMED, self.topic, _REPLICATED)
            )
        else:
            self.future.set_exception(RuntimeError(str(err)))


class KafkaFloor(Variant):
    """What any ``send_async`` that returns a receipt future must do per message, and
    nothing else: an id, a future (msgsafe's ``LightFuture``), the record headers, one
    ``produce()`` with a report object that resolves the future with a receipt, and the
    reports served by ``poll(0)`` on the same thread (msgsafe's transport serves them
    inline while the caller publishes). No validation, no per-key order, no outbox, no
    counters, no ``flush()`` bookkeeping: a floor under ``Producer.send_async``, not a
    producer."""

    name = "floor"

    def __init__(self, url: str, topic: str) -> None:
        from confluent_kafka import Producer

        from msgsafe.adapters._config import build_config
        from msgsafe.adapters.kafka.config import KafkaOptions, producer_settings
        from msgsafe.endpoints import parse_url

        parsed = parse_url(url)
        self._producer = Producer(producer_settings(parsed, build_config(KafkaOptions, parsed, {})))
        self._topic = topic

    def run(self, count: int) -> None:
        from msgsafe._futures import LightFuture
        from msgsafe.message_ids import new_message_id

        producer, topic, keys = self._producer, self._topic, KEYS
        produce, poll = producer.produce, producer.poll
        futures: list[Any] = []
        append = futures.append
        for i in range(count):
            message_id = new_message_id()
            future: Any = LightFuture()
            report = _FloorReport(future, message_id, topic)
            headers: dict[str, str | bytes | None] = {"msgsafe-id": message_id}
            while True:
                try:
                    # Positional, as msgsafe's fast path calls it: partition -1, timestamp 0.
                    produce(topic, BODY, keys[i & 15], -1, report, None, 0, headers)
                    break
                except BufferError:
                    poll(0.005)
            poll(0)
            append(future)
        producer.flush(120)
        good = sum(1 for f in futures if f.result(0).status is _CONFIRMED)
        if good != count:
            raise SystemExit(f"kafka floor: {good} of {count} confirmed")

    def close(self) -> None:
        self._producer.flush(30)


class KafkaCompat(Variant):
    name = "compat"

    def __init__(self, url: str, bootstrap: str, topic: str, outbox: Path) -> None:
        from msgsafe.compat.confluent_kafka import Producer

        del url  # the wrapper takes confluent-kafka's configuration
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "msgsafe.outbox": str(outbox),
            }
        )
        self._topic = topic
        self.delivered = 0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1

    def run(self, count: int) -> None:
        producer, topic, keys = self._producer, self._topic, KEYS
        produce, poll, cb = producer.produce, producer.poll, self._on_delivery
        before = self.delivered
        for i in range(count):
            while True:
                try:
                    produce(topic, BODY, key=keys[i & 15], on_delivery=cb)
                    break
                except BufferError:
                    poll(0.005)
            poll(0)
        if producer.flush(120) or self.delivered - before != count:
            raise SystemExit(f"kafka compat: {self.delivered - before} of {count} delivered")

    def close(self) -> None:
        self._producer.close()


# --- RabbitMQ ---------------------------------------------------------------------------


def _pika_params(url: str) -> Any:
    import pika

    from msgsafe.endpoints import parse_url

    parsed = parse_url(url)
    endpoint = parsed.endpoints[0]
    return pika.ConnectionParameters(
        host=endpoint.host,
        port=endpoint.port,
        virtual_host=parsed.path or "/",
        credentials=pika.PlainCredentials(
            parsed.username or "guest",
            parsed.password.reveal() if parsed.password else "guest",
        ),
    )


def declare_quorum_queue(url: str, name: str) -> None:
    """A durable quorum queue ``name`` on the broker of ``url`` (an amqp:// URL)."""
    import pika

    conn = pika.BlockingConnection(_pika_params(url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()


class RabbitRaw(Variant):
    name = "raw"

    def __init__(self, url: str, queue: str) -> None:
        import pika

        self._properties = pika.BasicProperties
        self._conn = pika.BlockingConnection(_pika_params(url))
        self._channel = self._conn.channel()
        self._channel.confirm_delivery()
        self._queue = queue

    def run(self, count: int) -> None:
        publish, queue, props, uuid4 = (
            self._channel.basic_publish,
            self._queue,
            self._properties,
            uuid.uuid4,
        )
        for _ in range(count):
            mid = str(uuid4())
            # Raises (UnroutableError, NackError) unless the broker confirmed it.
            publish(
                "",
                queue,
                BODY,
                props(delivery_mode=2, message_id=mid, headers={"msgsafe-id": mid}),
                mandatory=True,
            )

    def close(self) -> None:
        self._conn.close()


class BlockingMsgsafe(Variant):
    """``msgsafe.Producer.send`` one message at a time (RabbitMQ and AMQP 1.0)."""

    name = "msgsafe"

    def __init__(self, url: str, destination: str, outbox: Path) -> None:
        import msgsafe

        self._producer = msgsafe.Producer(url, outbox=outbox)
        self._destination = destination
        self._confirmed = msgsafe.Status.CONFIRMED

    def run(self, count: int) -> None:
        send, destination, confirmed = self._producer.send, self._destination, self._confirmed
        for _ in range(count):
            if send(destination, BODY).status is not confirmed:
                raise SystemExit("msgsafe send: a message was stored, not confirmed")

    def close(self) -> None:
        self._producer.close()


# --- AMQP 1.0 ---------------------------------------------------------------------------


def _proton_target(url: str) -> tuple[str, dict[str, Any]]:
    """The address and login keywords a proton connection to ``url``'s first host takes."""
    from msgsafe.endpoints import parse_url

    parsed = parse_url(url)
    endpoint = parsed.endpoints[0]
    login: dict[str, Any] = {"allowed_mechs": "ANONYMOUS"}
    if parsed.username:
        login = {
            "user": parsed.username,
            "password": parsed.password.reveal() if parsed.password else None,
            "allowed_mechs": "PLAIN",
            "allow_insecure_mechs": True,
        }
    scheme = "amqps" if parsed.tls else "amqp"
    return f"{scheme}://{endpoint.host}:{endpoint.port}", login


class Amqp10Raw(Variant):
    name = "raw"

    def __init__(self, url: str, address: str) -> None:
        from proton import Message
        from proton.utils import BlockingConnection

        target, login = _proton_target(url)
        self._message = Message
        self._conn = BlockingConnection(target, **login)
        self._sender = self._conn.create_sender(address)

    def run(self, count: int) -> None:
        send, message, uuid4 = self._sender.send, self._message, uuid.uuid4
        for _ in range(count):
            mid = str(uuid4())
            # Waits for the broker to settle it; raises unless it was accepted.
            send(message(body=BODY, id=mid, durable=True, properties={"msgsafe-id": mid}))

    def close(self) -> None:
        self._conn.close()


class Amqp10Floor(Variant):
    """What a thread-safe blocking send over proton must do at least, and nothing else:
    proton's own pattern for sending from other threads (a ``Container`` on its own
    thread, an ``EventInjector`` that hands each message over, the ``accepted`` outcome
    resolving a future the caller waits on). No outbox, fail-over, deadlines, window or
    counters: a floor under ``Producer.send`` on an I/O thread, not a producer."""

    name = "floor"

    def __init__(self, url: str, address: str) -> None:
        import collections
        import threading

        from proton import Message
        from proton.handlers import MessagingHandler
        from proton.reactor import ApplicationEvent, Container, EventInjector

        from msgsafe._futures import LightFuture

        target, login = _proton_target(url)
        ready = threading.Event()
        pending: collections.deque[tuple[Any, Any]] = collections.deque()

        class Handler(MessagingHandler):
            def __init__(self) -> None:
                super().__init__()
                self.sender: Any = None
                self.conn: Any = None
                self.futures: dict[Any, Any] = {}

            def on_start(self, event: Any) -> None:
                self.conn = event.container.connect(target, **login)
                self.sender = event.container.create_sender(self.conn, address)

            def on_sendable(self, event: Any) -> None:
                ready.set()

            def on_floor_send(self, event: Any) -> None:
                while pending:
                    message, future = pending.popleft()
                    self.futures[self.sender.send(message)] = future

            def on_floor_close(self, event: Any) -> None:
                self.conn.close()
                injector.close()

            def on_accepted(self, event: Any) -> None:
                self.futures.pop(event.delivery).set_result(None)

            def on_rejected(self, event: Any) -> None:
                self.futures.pop(event.delivery).set_exception(RuntimeError("rejected"))

            def on_released(self, event: Any) -> None:
                self.futures.pop(event.delivery).set_exception(RuntimeError("released"))

        injector = EventInjector()
        container = Container(Handler())
        container.selectable(injector)
        self._thread = threading.Thread(target=container.run, daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise SystemExit("amqp10 floor: no link credit within 30 s")
        self._pending = pending
        self._trigger = injector.trigger
        self._send_event = ApplicationEvent("floor_send")
        self._close_event = ApplicationEvent("floor_close")
        self._message = Message
        self._future = LightFuture

    def run(self, count: int) -> None:
        message, uuid4, future_of = self._message, uuid.uuid4, self._future
        pending, trigger, event = self._pending, self._trigger, self._send_event
        for _ in range(count):
            mid = str(uuid4())
            future: Any = future_of()
            pending.append(
                (message(body=BODY, id=mid, durable=True, properties={"msgsafe-id": mid}), future)
            )
            trigger(event)
            future.result(30)  # raises unless it was accepted

    def close(self) -> None:
        self._trigger(self._close_event)
        self._thread.join(10)


# --- brokers ----------------------------------------------------------------------------


@dataclass
class Target:
    """Where one protocol's variants send: built by ``make`` once the broker is up."""

    protocol: str
    broker: str
    make: Callable[[Path], list[Variant]]


def urls_by_protocol(urls: Sequence[str]) -> dict[str, str]:
    """``--url`` values by the protocol their scheme names (kafka, rabbitmq, amqp10)."""
    from msgsafe.endpoints import parse_url

    found: dict[str, str] = {}
    for url in urls:
        protocol = parse_url(url).protocol
        if protocol not in PROTOCOLS:
            raise SystemExit(f"--url {parse_url(url).redacted()}: not kafka, amqp or amqp10")
        found[protocol] = url
    return found


@contextlib.contextmanager
def kafka_target(url: str | None) -> Iterator[Target]:
    from msgsafe.cluster.kafka_admin import create_topic

    cluster: Any = None
    broker = "a running Kafka (--url)"
    if url is None:
        from msgsafe.cluster.kafka import VERSION, KafkaCluster

        cluster = KafkaCluster(nodes=1)
        started = time.monotonic()
        cluster.start()
        print(f"kafka: 1 node up in {time.monotonic() - started:.1f} s", flush=True)
        url = str(cluster.url)
        broker = f"Apache Kafka {VERSION}, 1 KRaft node, topic of 3 partitions"
    bootstrap = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("@")[-1]
    try:
        topic = f"bench-send-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 3, 1, timeout=60)

        def make(tmp: Path) -> list[Variant]:
            return [
                KafkaRaw(url, topic),
                KafkaMsgsafe(url, topic, tmp / "kafka-msgsafe.db"),
                KafkaCompat(url, bootstrap, topic, tmp / "kafka-compat.db"),
                KafkaFloor(url, topic),
            ]

        yield Target("kafka", broker, make)
    finally:
        if cluster is not None:
            cluster.stop()


@contextlib.contextmanager
def rabbit_targets(
    wanted: set[str], amqp_url: str | None, amqp10_url: str | None
) -> Iterator[list[Target]]:
    """RabbitMQ (AMQP 0-9-1) and its AMQP 1.0 plugin, on one node started here unless
    ``--url`` names them; ``amqp10`` on a broker that is not RabbitMQ sends to a plain
    address (created on first use: Artemis, Broker-J)."""
    cluster: Any = None
    broker = "a running broker (--url)"
    if (amqp_url is None and "rabbitmq" in wanted) or (amqp10_url is None and "amqp10" in wanted):
        from msgsafe.cluster.rabbitmq import RabbitCluster

        cluster = RabbitCluster(nodes=1)
        started = time.monotonic()
        cluster.start()
        print(f"rabbitmq: 1 node up in {time.monotonic() - started:.1f} s", flush=True)
        amqp_url = amqp_url or cluster.node_url(0)
        amqp10_url = amqp10_url or cluster.amqp10_url(0)
        broker = "RabbitMQ 1 node, quorum queue"
    try:
        targets: list[Target] = []
        if "rabbitmq" in wanted and amqp_url is not None:
            queue = f"bench-send-{uuid.uuid4().hex[:8]}"
            declare_quorum_queue(amqp_url, queue)
            rabbit_url = amqp_url

            def make_rabbit(tmp: Path) -> list[Variant]:
                return [
                    RabbitRaw(rabbit_url, queue),
                    BlockingMsgsafe(rabbit_url, queue, tmp / "rabbitmq.db"),
                ]

            targets.append(Target("rabbitmq", broker, make_rabbit))
        if "amqp10" in wanted and amqp10_url is not None:
            address = _amqp10_address(amqp10_url, amqp_url)
            plugin_url = amqp10_url

            def make_amqp10(tmp: Path) -> list[Variant]:
                return [
                    Amqp10Raw(plugin_url, address),
                    BlockingMsgsafe(plugin_url, address, tmp / "amqp10.db"),
                    Amqp10Floor(plugin_url, address),
                ]

            where = (
                "the same queue kind as /amq/queue/NAME" if address[0] == "/" else "a plain address"
            )
            targets.append(Target("amqp10", f"{broker}, AMQP 1.0 plugin, {where}", make_amqp10))
        yield targets
    finally:
        if cluster is not None:
            cluster.stop()


def _amqp10_address(amqp10_url: str, amqp_url: str | None) -> str:
    """A quorum queue as ``/amq/queue/NAME`` where the broker is RabbitMQ (declared
    through AMQP 0-9-1 on the same host and port), else a plain new address."""
    from msgsafe.endpoints import parse_url

    name = f"bench-send-{uuid.uuid4().hex[:8]}"
    if amqp_url is None:
        parsed = parse_url(amqp10_url)
        endpoint = parsed.endpoints[0]
        user = parsed.username or "guest"
        password = parsed.password.reveal() if parsed.password else "guest"
        amqp_url = f"amqp://{user}:{password}@{endpoint.host}:{endpoint.port}"
    try:
        declare_quorum_queue(amqp_url, name)
    except Exception as exc:
        print(f"amqp10: no AMQP 0-9-1 on that port ({type(exc).__name__}): plain address")
        return name
    return f"/amq/queue/{name}"


# --- measuring --------------------------------------------------------------------------


def measure(
    variants: Sequence[Variant], rounds: int, count: int, block: int
) -> dict[str, list[Tally]]:
    """``rounds`` rounds of ``count`` messages per variant: in blocks of ``block`` that
    take turns (AB BA AB ...), the first variant first in even rounds, last in odd ones."""
    tallies: dict[str, list[Tally]] = {v.name: [] for v in variants}
    for n in range(rounds):
        this = {v.name: Tally() for v in variants}
        order = list(variants) if n % 2 == 0 else list(reversed(variants))
        for start in range(0, count, block):
            size = min(block, count - start)
            for variant in order:
                wall, cpu = time.perf_counter(), time.process_time()
                variant.run(size)
                this[variant.name].add(time.perf_counter() - wall, time.process_time() - cpu, size)
            order.reverse()
        for name, tally in this.items():
            tallies[name].append(tally)
        print(
            f"  round {n + 1}: "
            + ", ".join(
                f"{name} {t.rate:,.0f} msg/s {t.cpu_us:.1f} µs CPU" for name, t in this.items()
            ),
            flush=True,
        )
    return tallies


def run_target(target: Target, args: argparse.Namespace) -> Result:
    pipelined = target.protocol == "kafka"
    count = args.messages if pipelined else args.blocking_messages
    block = count if pipelined else args.block
    print(f"{target.protocol}: {target.broker}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-send-") as tmp:
        variants = target.make(Path(tmp))
        try:
            for variant in variants:  # connected, and the first sends made, untimed
                variant.run(min(count, 2000))
            rounds = measure(variants, args.rounds, count, block)
        finally:
            for variant in variants:
                variant.close()
        result = Result(target.protocol, target.broker, rounds)
        if args.profile:
            unprofiled = {name: result.total(name).cpu_us for name in rounds}
            profile_msgsafe(target, Path(tmp), args.profile, unprofiled)
    return result


# --- profiling --------------------------------------------------------------------------


class ThreadProfiles:
    """cProfile in every thread started inside the block (and the caller's), each timed
    by its own thread's CPU clock; armed by :meth:`arm` (before that, nothing counts)."""

    def __init__(self) -> None:
        self.profiles: list[tuple[str, cProfile.Profile]] = []
        self._armed = False
        self._lock = threading.Lock()

    def __enter__(self) -> ThreadProfiles:
        threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.setprofile(None)
        self._armed = False

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        # Runs as the thread's profile function until armed, then hands over to cProfile.
        if self._armed:
            self._start()

    def _start(self) -> None:
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append((threading.current_thread().name, profile))
        profile.enable()

    def arm(self) -> None:
        """Start counting: the caller's thread now, every other thread at its next call."""
        self._armed = True
        self._start()

    def stop_caller(self) -> None:
        for name, profile in self.profiles:
            if name == threading.current_thread().name:
                profile.disable()


def profile_msgsafe(target: Target, tmp: Path, count: int, unprofiled: dict[str, float]) -> None:
    """Send ``count`` messages through the msgsafe variant(s) of ``target`` under
    :class:`ThreadProfiles` and print where the CPU went, per message (``unprofiled``:
    each variant's CPU µs per message in the rounds, to scale the profile to)."""
    for index in range(1, 3):
        where = tmp / f"profile-{index}"
        where.mkdir(exist_ok=True)
        with ThreadProfiles() as profiles:
            variants = target.make(where)
            chosen = variants[index] if index < len(variants) else None
            for variant in variants:
                if variant is not chosen:
                    variant.close()
            if chosen is None:
                return
            try:
                chosen.run(min(count, 2000))
                profiles.arm()
                cpu = time.process_time()
                chosen.run(count)
                cpu = time.process_time() - cpu
                profiles.stop_caller()
            finally:
                chosen.close()
        real = unprofiled.get(chosen.name, 0.0)
        print_profile(f"{target.protocol} {chosen.name}", profiles, count, cpu, real)


def print_profile(
    title: str, profiles: ThreadProfiles, count: int, cpu: float, real_us: float
) -> None:
    """Per thread: CPU and calls per message; then the CPU by file and the top functions,
    scaled by ``real_us`` / the profiled CPU per message (the profiler's own cost per
    call inflates small functions most: read the scaled figures as estimates)."""
    rows: list[tuple[str, str, float, float, int]] = []  # thread, where, own, cum, calls
    for name, profile in profiles.profiles:
        profile.create_stats()
        entries: dict[Any, Any] = getattr(profile, "stats", {})
        thread = name.split(" ")[0]
        for (path, line, function), (_cc, calls, own, cumulative, _) in entries.items():
            rows.append((thread, f"{_short_path(path)}:{line}({function})", own, cumulative, calls))
    profiled_us = cpu / count * 1e6
    scale = real_us / profiled_us if real_us and profiled_us else 1.0
    print(
        f"\nprofile {title}: {count:,} messages; {profiled_us:.1f} µs process CPU per message "
        f"under the profiler, {real_us:.1f} without (scale {scale:.2f})",
        flush=True,
    )
    threads: dict[str, list[float]] = {}
    files: dict[str, float] = {}
    merged: dict[tuple[str, str], list[float]] = {}
    for thread, where, own, cumulative, calls in rows:
        seen = threads.setdefault(thread, [0.0, 0.0])
        seen[0] += own
        seen[1] += calls
        module = where.split(":", 1)[0]
        if module.startswith("site-packages/"):
            module = "/".join(module.split("/")[:2])
        elif module == "~":
            module = f"C functions ({thread})"
        files[module] = files.get(module, 0.0) + own
        entry = merged.setdefault((thread, where), [0.0, 0.0, 0.0])
        entry[0] += own
        entry[1] += cumulative
        entry[2] += calls
    per = 1e6 / count
    for thread, (own, calls) in sorted(threads.items(), key=lambda item: -item[1][0]):
        print(
            f"  thread {thread}: ≈{own * per * scale:.1f} µs CPU/msg, {calls / count:.0f} calls/msg"
        )
    print("  by file, own time (≈µs/msg):")
    for module, own in sorted(files.items(), key=lambda item: -item[1])[:15]:
        print(f"    {own * per * scale:7.2f}  {module}")
    print("  top functions (≈µs/msg own, cumulative; calls/msg):")
    ranked = sorted(merged.items(), key=lambda item: -item[1][0])[:25]
    for (thread, where), (own, cumulative, calls) in ranked:
        print(
            f"    {own * per * scale:7.2f} {cumulative * per * scale:7.2f} {calls / count:5.2f}"
            f"  [{thread[:24]}] {where}"
        )


def _short_path(path: str) -> str:
    for marker in ("/msgsafe/", "/site-packages/", "/lib/python3"):
        at = path.find(marker)
        if at >= 0:
            return path[at + 1 :]
    return path


# --- the report -------------------------------------------------------------------------


def id_costs(calls: int = 100_000, rounds: int = 3) -> dict[str, float]:
    """CPU µs of one message id, best of ``rounds``: the raw loops' ``str(uuid.uuid4())``
    and msgsafe's UUIDv7 (``new_message_id``), so that a reader can tell the raw loops'
    id apart from the rest of their cost."""
    from msgsafe.message_ids import new_message_id

    def uuid4_text() -> str:
        return str(uuid.uuid4())

    forms: dict[str, Callable[[], str]] = {
        "str(uuid.uuid4())": uuid4_text,
        "msgsafe new_message_id()": new_message_id,
    }
    best = dict.fromkeys(forms, float("inf"))
    for _ in range(rounds):
        for name, make in forms.items():
            started = time.process_time()
            for _ in range(calls):
                make()
            best[name] = min(best[name], (time.process_time() - started) / calls * 1e6)
    return best


def goal_lines(
    results: Sequence[Result],
    goals: Sequence[tuple[str, str, str, float, str]] = GOALS,
) -> list[tuple[str, float, float, float, float, float, str]]:
    """(what, median of rounds, lowest, highest, all rounds, CPU ratio, verdict) per goal
    (of ``goals``, as :data:`GOALS`) whose protocol was measured."""
    rows = []
    by_protocol = {r.protocol: r for r in results}
    for protocol, variant, baseline, goal, what in goals:
        result = by_protocol.get(protocol)
        if result is None or variant not in result.rounds or baseline not in result.rounds:
            continue
        ratios = result.ratios(variant, baseline)
        median = statistics.median(ratios)
        whole = result.total(variant).rate / result.total(baseline).rate
        cpu = result.total(baseline).cpu_us / result.total(variant).cpu_us
        if goal:
            verdict = f">= {goal}: " + ("**met**" if median >= goal else "**not met**")
        elif variant.startswith("floor"):
            verdict = "the limit (not a goal)"
        elif baseline.startswith("floor"):
            verdict = "against the limit (not a goal)"
        else:
            verdict = "(no goal)"
        rows.append((what, median, min(ratios), max(ratios), whole, cpu, verdict))
    return rows


def report(
    results: Sequence[Result],
    args: argparse.Namespace,
    started: str,
    ended: str,
    loads: str,
    ids: dict[str, float] | None = None,
) -> str:
    """The README section (``## Per-message sends``), without notes of its own."""
    versions = [f"Python {platform.python_version()}"]
    for module, label in (
        ("confluent_kafka", "confluent-kafka"),
        ("pika", "pika"),
        ("proton", "python-qpid-proton"),
    ):
        with contextlib.suppress(Exception):
            versions.append(f"{label} {_version(module)}")
    command = (
        "`flock /tmp/msgsafe-bench.lock python3 benchmarks/bench_send.py "
        f"--rounds {args.rounds} --messages {args.messages} "
        f"--blocking-messages {args.blocking_messages} --block {args.block}"
        + "".join(f" --only {p}" for p in args.only or ())
        + " --readme benchmarks/README.md`"
    )
    lines = [
        TITLE,
        "",
        command,
        "",
        f"Measured {started}\N{EN DASH}{ended} UTC on {os.cpu_count()} cores, {loads} "
        f"(the machine is shared), {', '.join(versions)}. Kafka: {args.messages:,} messages "
        f"per variant per round, pipelined; RabbitMQ and AMQP 1.0: {args.blocking_messages:,} "
        f"blocking sends per variant per round, the two taking turns every {args.block}; "
        f"{args.rounds} rounds; 100-byte bodies. CPU: `time.process_time()` of the "
        "benchmark process (every thread) per message, all rounds.",
        "",
        *tables(results, LOOPS, goal_lines(results)),
    ]
    brokers = "; ".join(f"{r.protocol}: {r.broker}" for r in results)
    if ids:
        lines += [
            "",
            "One id, CPU (best of 3 x 100,000 calls): "
            + ", ".join(f"{name} {us:.2f} µs" for name, us in ids.items())
            + ".",
        ]
    lines += [
        "",
        f"Brokers: {brokers}. `send_batch_async` against the raw clients: see the Kafka "
        "and RabbitMQ sections (`bench_kafka.py`, `bench_rabbitmq.py`).",
    ]
    return "\n".join(lines) + "\n"


def tables(
    results: Sequence[Result],
    loops: dict[tuple[str, str], str],
    goals: Sequence[tuple[str, float, float, float, float, float, str]],
) -> list[str]:
    """The figures' table (a row per protocol and variant, ``loops`` saying what each
    does), a blank line, and the ratios' table of ``goals`` (:func:`goal_lines`)."""
    lines = [
        "| protocol | variant | what the loop does | msg/s (all rounds) | CPU µs/msg "
        "| msg/s by round |",
        "|---|---|---|---:|---:|---|",
    ]
    for result in results:
        for variant, tallies in result.rounds.items():
            total = result.total(variant)
            by_round = ", ".join(f"{t.rate:,.0f}" for t in tallies)
            lines.append(
                f"| {result.protocol} | {variant} | {loops[(result.protocol, variant)]} "
                f"| {total.rate:,.0f} | {total.cpu_us:.1f} | {by_round} |"
            )
    lines += [
        "",
        "| ratio | median of rounds | lowest .. highest | all rounds | CPU/msg raw ÷ variant "
        "| goal |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for what, median, low, high, whole, cpu, verdict in goals:
        lines.append(
            f"| {what} | **{median:.2f}** | {low:.2f} .. {high:.2f} | {whole:.2f} | {cpu:.2f} "
            f"| {verdict} |"
        )
    return lines


def _version(module: str) -> str:
    from importlib.metadata import version

    return version(
        {"confluent_kafka": "confluent-kafka", "pika": "pika", "proton": "python-qpid-proton"}[
            module
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--only", action="append", choices=PROTOCOLS, help="measure this protocol (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument(
        "--messages", type=int, default=20_000, help="Kafka: messages per variant per round"
    )
    parser.add_argument(
        "--blocking-messages",
        type=int,
        default=400,
        help="RabbitMQ, AMQP 1.0: blocking sends per variant per round",
    )
    parser.add_argument(
        "--block", type=int, default=20, help="blocking sends per turn before the other variant"
    )
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        help="a running broker instead of one started here: kafka://, amqp:// or amqp10://",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then profile N sends of each msgsafe variant (per-thread CPU)",
    )
    parser.add_argument("--readme", type=Path, help=f"write the {TITLE[3:]!r} section there")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.messages < 1 or args.blocking_messages < 1 or args.block < 1:
        parser.error("--rounds, --messages, --blocking-messages and --block must be >= 1")
    urls_by_protocol(args.url)  # refuses a scheme of another protocol now
    return args


def main(argv: Sequence[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    wanted = set(args.only or PROTOCOLS)
    urls = urls_by_protocol(args.url)
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    results: list[Result] = []
    if "kafka" in wanted:
        with kafka_target(urls.get("kafka")) as target:
            results.append(run_target(target, args))
    if wanted & {"rabbitmq", "amqp10"}:
        with rabbit_targets(wanted, urls.get("rabbitmq"), urls.get("amqp10")) as targets:
            for target in targets:
                results.append(run_target(target, args))
    ended = datetime.datetime.now(datetime.UTC)
    loads = f"load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end"
    stamps = (f"{started:%Y-%m-%d %H:%M}", f"{ended:%H:%M}")
    text = report(results, args, *stamps, loads, id_costs())
    print()
    print(text)
    if args.readme is not None:
        replace_section(args.readme, text)
    return results


if __name__ == "__main__":
    main()
