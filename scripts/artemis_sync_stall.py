"""The Artemis replication stall: restart the backup of a ``msgsafe cluster`` Artemis pair
N times under a producer and an acking consumer, and count how often the primary's last
synchronization step timed out (AMQ229114, after which the primary shuts itself down).

    python3 scripts/artemis_sync_stall.py --rounds 16
    python3 scripts/artemis_sync_stall.py --rounds 3 --threads 1   # every restart stalls

Each round SIGKILLs the backup and starts it again (``ArtemisCluster.restart(1)``, which
also starts a primary that shut down meanwhile). A msgsafe producer (SQLite outbox,
``confirm_timeout`` 2 s) sends about 500 messages a second through both nodes; a consumer
acks each delivery. Afterwards every receipted id is read back. It prints a line a round
and one result line; exit 0 when nothing receipted was lost (stalls are counted, not
failed). ``--threads N`` gives the clients' acceptor N Netty threads (Artemis's default:
three a core); ``--dir`` keeps the pair's directory (node logs) there.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from msgsafe import Consumer, Producer
from msgsafe.cluster import _artemis_xml
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.cluster.base import ClusterError
from msgsafe.errors import MsgsafeError
from msgsafe.message import Receipt, new_message_id

_ADDRESS = "stall.q"
#: Artemis's critical IO error line: after AMQ229114 the primary shuts down with it.
_SHUTDOWN = "AMQ222010"


class _Counts:
    def __init__(self) -> None:
        self.sent = 0
        self.receipted: set[str] = set()
        self.received: set[str] = set()
        self.lock = threading.Lock()

    def done(self, mid: str, future: Future[Receipt]) -> None:
        if future.exception() is None:
            with self.lock:
                self.receipted.add(mid)


def _produce(url: str, outbox: Path, counts: _Counts, stop: threading.Event) -> None:
    producer = Producer(url, outbox=str(outbox), confirm_timeout=2.0, send_timeout=60.0)
    try:
        while not stop.is_set():
            mid = new_message_id()
            counts.sent += 1
            future = producer.send_async(_ADDRESS, b"x" * 100, message_id=mid)
            future.add_done_callback(partial(counts.done, mid))
            stop.wait(0.002)  # pacing (a traffic rate), not synchronisation
        producer.drain(180)
    finally:
        producer.close()


def _take(consumer: Consumer, counts: _Counts, timeout: float) -> None:
    """One poll: each delivery counted and acked."""
    for delivery in consumer.poll(timeout, max_messages=500):
        assert delivery.message_id is not None
        counts.received.add(delivery.message_id)
        delivery.ack()


def _consume(url: str, counts: _Counts, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with Consumer(url) as consumer:
                consumer.subscribe(_ADDRESS)
                while not stop.is_set():
                    _take(consumer, counts, 0.2)
        except MsgsafeError:
            stop.wait(0.5)


def _stalls(pair: ArtemisCluster) -> int:
    logs = (pair.dir / f"node{n}" / "console.log" for n in (0, 1))
    return sum(p.read_text(errors="replace").count(_SHUTDOWN) for p in logs if p.exists())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="client acceptor threads")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        _artemis_xml._AMQP_OPTIONS += f";remotingThreads={args.threads}"
    where = args.dir or Path(tempfile.mkdtemp(prefix="msgsafe-stall-"))
    pair = ArtemisCluster(dir=where / "pair")
    pair.start()
    counts = _Counts()
    stop = threading.Event()
    workers = [
        threading.Thread(target=_produce, args=(pair.url, where / "outbox.db", counts, stop)),
        threading.Thread(target=_consume, args=(pair.url, counts, stop)),
    ]
    try:
        for worker in workers:
            worker.start()
        for r in range(args.rounds):
            started = time.monotonic()
            try:
                pair.kill(1)
                pair.restart(1)
            except ClusterError as exc:
                print(f"round {r}: {str(exc).splitlines()[0]}", flush=True)
                for node in (0, 1):
                    if not pair.nodes()[node].running:
                        pair.restart(node)
            took = time.monotonic() - started
            roles = [n.role for n in pair.nodes()]
            print(
                f"round {r}: {took:.1f} s, stalls so far {_stalls(pair)}, roles {roles}", flush=True
            )
        stop.set()
        workers[0].join(240)
        deadline = time.monotonic() + 120
        with Consumer(pair.url) as consumer:
            consumer.subscribe(_ADDRESS)
            while time.monotonic() < deadline and not counts.receipted <= counts.received:
                _take(consumer, counts, 0.5)
        lost = len(counts.receipted - counts.received)
        print(
            f"rounds {args.rounds}, threads {args.threads or 'default'}: stalls "
            f"{_stalls(pair)}, sent {counts.sent}, receipted {len(counts.receipted)}, "
            f"lost {lost} (logs in {pair.dir})",
            flush=True,
        )
        return 0 if lost == 0 else 1
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
        pair.stop()


if __name__ == "__main__":
    sys.exit(main())
