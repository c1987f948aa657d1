"""Fail-fast figures on real brokers: how long a caller waits when the broker is gone.

For each protocol (a RabbitMQ node for amqp:// and amqp10://, an Apache Kafka node for
kafka://): confirm a few messages, SIGKILL the broker (its port now refuses), then measure

- the first send after the outage (STORED), over ``ROUNDS`` kills of a broker restarted in
  between (median and worst), and without an outbox (ConnectError);
- the worst of the next 50 sends (STORED);
- close() during the outage;
- a send to a black-holed host (a loopback listener that never answers), first send.

And once: SIGINT to a child sending in a loop to a dead broker, until it exited; every id
the child got a receipt for is counted (lost = receipted - in the outbox - confirmed).

Run: ``python3 benchmarks/bench_failfast.py`` (prints one line per figure).
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import msgsafe
from msgsafe import Status
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.errors import ConnectError
from msgsafe.outbox.sqlite import SqliteOutbox


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.monotonic()
    try:
        result: object = fn()
    except ConnectError as exc:
        result = exc
    return time.monotonic() - start, result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


#: Kills per protocol for the first-send figure (one sample says more about the machine).
ROUNDS = 3


def _until_confirmed(producer: msgsafe.Producer, destination: str, seconds: float = 90) -> None:
    # After a restart the refusal pause and the outbox's drain come first: poll.
    deadline = time.monotonic() + seconds
    while producer.send(destination, b"x").status is not Status.CONFIRMED:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no confirm within {seconds} s of the restart")
        time.sleep(0.05)


def measure(
    name: str,
    url: str,
    kill: Callable[[], None],
    restart: Callable[[], None],
    options: dict[str, object],
    destination: str = "bench_ff",
) -> None:
    work = Path(tempfile.mkdtemp(prefix="msgsafe-bench-ff-"))
    producer = msgsafe.Producer(url, outbox=work / "outbox.db", **options)
    firsts: list[float] = []
    for round_ in range(ROUNDS):
        if round_:
            restart()
        _until_confirmed(producer, destination)
        for _ in range(4):
            producer.send(destination, b"x")
        kill()
        took, first = _timed(lambda: producer.send(destination, b"x"))
        assert getattr(first, "status", None) is Status.STORED, first
        firsts.append(took)
    print(
        f"{name}: first send after the broker died: median {_ms(statistics.median(firsts))}, "
        f"worst {_ms(max(firsts))} over {ROUNDS} kills (STORED)"
    )
    worst = 0.0
    for _ in range(50):
        took, receipt = _timed(lambda: producer.send(destination, b"x"))
        assert getattr(receipt, "status", None) is Status.STORED, receipt
        worst = max(worst, took)
    print(f"{name}: worst of 50 sends during the outage (STORED): {_ms(worst)}")
    bare = msgsafe.Producer(url, outbox=False, **options)
    took, error = _timed(lambda: bare.send(destination, b"x"))
    print(f"{name}: new producer, outbox=False, first send: {_ms(took)} ({type(error).__name__})")
    bare.close()
    took, _ = _timed(producer.close)
    print(f"{name}: close() during the outage: {_ms(took)}")


def black_holed(scheme: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    producer = msgsafe.Producer(f"{scheme}://127.0.0.1:{port}/", outbox=False)
    took, error = _timed(lambda: producer.send("bench_ff", b"x"))
    print(f"{scheme}: black-holed host, first send: {_ms(took)} ({type(error).__name__})")
    took, _ = _timed(producer.close)
    print(f"{scheme}: close() after a black-holed send: {_ms(took)}")
    listener.close()


CHILD = textwrap.dedent(
    """
    import sys, msgsafe
    producer = msgsafe.Producer(sys.argv[1], outbox=sys.argv[2])
    print("ready", flush=True)
    try:
        while True:
            receipt = producer.send("bench_ff", b"x")
            print(receipt.message_id, receipt.status.name, flush=True)
    except KeyboardInterrupt:
        producer.close(1.0)
    """
)


def ctrl_c(url: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="msgsafe-bench-ff-"))
    path = work / "outbox.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 2.0
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines.append(child.stdout.readline())
    start = time.monotonic()
    os.kill(child.pid, signal.SIGINT)
    rest, _ = child.communicate(timeout=30)
    took = time.monotonic() - start
    lines.extend(rest.splitlines())
    receipted = {line.split()[0] for line in lines if line.strip()}
    store = SqliteOutbox(path)
    waiting = {entry.envelope.message_id for entry in store.list(limit=10**9)}
    store.close()
    lost = len(receipted - waiting)
    print(f"Ctrl-C: SIGINT to exit: {_ms(took)}; receipted {len(receipted)}, lost {lost}")


def main() -> None:
    rabbit = RabbitCluster(size=1)
    rabbit.start()
    try:
        restart = lambda: rabbit.restart(0)  # noqa: E731
        measure("amqp", rabbit.node_url(0), rabbit.kill_all, restart, {"declare": "classic"})
        ctrl_c(rabbit.node_url(0))  # the node is dead: every send is STORED
        rabbit.restart(0)
        first = msgsafe.Producer(rabbit.node_url(0), outbox=False, declare="classic")
        first.send("bench_ff", b"declare")  # the queue the AMQP 1.0 sends go to
        first.close()
        url10 = rabbit.amqp10_url(0)
        measure("amqp10", url10, rabbit.kill_all, restart, {}, "/amq/queue/bench_ff")
    finally:
        rabbit.stop()
    kafka = KafkaCluster(nodes=1)
    kafka.start()
    try:
        # One node: the topic's one replica is its whole ISR.
        kafka.create_topic("bench_ff", partitions=1, config={"min.insync.replicas": "1"})
        measure("kafka", kafka.url, lambda: kafka.kill(0), lambda: kafka.restart(0), {})
    finally:
        kafka.stop()
    for scheme in ("amqp", "amqp10", "kafka"):
        black_holed(scheme)


if __name__ == "__main__":
    main()
