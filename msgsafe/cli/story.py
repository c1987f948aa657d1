"""The demo's story, without any output: start or reach a broker, publish N messages
while the broker is killed and started again, drain the outbox, consume everything back
and count.

Every id the producer accepted (a receipt) is recorded, every copy consumed is counted:
``lost`` is an accepted id never consumed, ``duplicates`` the extra copies (all of
known ids — a copy of an unknown id would be reported as ``unexpected``).
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Protocol, Self

from msgsafe.cli._output import with_options
from msgsafe.cli._readback import start_at_beginning
from msgsafe.consumer import Consumer
from msgsafe.endpoints import BrokerUrl, parse_url, traits
from msgsafe.errors import ConfigurationError, MsgsafeError
from msgsafe.message import Receipt, Status
from msgsafe.producer import Producer

__all__ = [
    "DEMO_CLUSTERS",
    "DemoCluster",
    "DemoConfig",
    "DemoReport",
    "Fault",
    "open_fault",
    "run_story",
]

#: Header naming the demo run, so a shared destination never mixes two runs.
RUN_HEADER = "msgsafe-demo-run"


class Fault(Protocol):
    """How the demo takes the broker away and brings it back."""

    #: What ``kill`` does, for the report (e.g. "SIGKILL embedded tansu broker").
    description: str

    def kill(self) -> None: ...

    def restart(self) -> None: ...


class NoFault:
    """A broker the demo cannot touch: the story runs without the outage."""

    description = "none (no --kill-cmd given)"

    def kill(self) -> None:
        return None

    def restart(self) -> None:
        return None


class MemoryFault:
    """``memory://`` brokers live in this process: down() and up() them."""

    description = "memory broker down() / up()"

    def __init__(self, name: str) -> None:
        from msgsafe.testing import MemoryBroker

        self._broker = MemoryBroker.named(name)

    def kill(self) -> None:
        self._broker.down()

    def restart(self) -> None:
        self._broker.up()


class CommandFault:
    """The user's own commands (e.g. ``systemctl kill``, ``docker restart``)."""

    def __init__(self, kill_cmd: str, restart_cmd: str | None) -> None:
        self._kill = kill_cmd
        self._restart = restart_cmd
        self.description = f"--kill-cmd {kill_cmd!r}"

    def kill(self) -> None:
        _run(self._kill)

    def restart(self) -> None:
        if self._restart:
            _run(self._restart)


def _run(command: str) -> None:
    try:
        subprocess.run(shlex.split(command), check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(f"fault command {command!r} failed: {exc}") from exc


def open_fault(url: BrokerUrl, kill_cmd: str | None, restart_cmd: str | None) -> Fault:
    """The fault for a broker the user named."""
    if kill_cmd:
        return CommandFault(kill_cmd, restart_cmd)
    if not traits(url.protocol).networked:
        return MemoryFault(url.path)
    return NoFault()


@dataclass(frozen=True, slots=True)
class _DemoKind:
    nodes: int
    description: str
    #: Replicated partitions: the kill aims at partition 0's leader, and the restart
    #: waits until the topic's replicas are back in sync.
    replicated: bool = False


#: The clusters ``msgsafe demo --cluster`` can start (kinds of :mod:`msgsafe.cluster`).
DEMO_CLUSTERS: Mapping[str, _DemoKind] = MappingProxyType(
    {
        "tansu": _DemoKind(1, "SIGKILL of the embedded Kafka-protocol broker (tansu)"),
        "kafka": _DemoKind(3, "SIGKILL of the Apache Kafka node leading partition 0", True),
    }
)


class DemoCluster:
    """A local cluster the demo starts, kills a node of and restarts.

    ``tansu``: one Kafka-protocol broker (no Java) whose log is a local S3 bucket (moto),
    so a SIGKILL loses only what the broker had not confirmed. ``kafka``: three Apache
    Kafka KRaft nodes (replication factor 3, ``min.insync.replicas=2``, no unclean
    election); the kill is a SIGKILL of the node leading partition 0 of the demo's topic,
    so in-flight writes meet a leader fail-over, and the restart waits until its replicas
    are back in sync. Harness failures (a missing binary or Java, a node that does not
    start) surface as :class:`~msgsafe.errors.MsgsafeError` saying how to fix them.
    """

    def __init__(self, kind: str = "tansu") -> None:
        if kind not in DEMO_CLUSTERS:
            raise ConfigurationError(f"--cluster {kind!r}: one of {', '.join(DEMO_CLUSTERS)}")
        from msgsafe.cluster import create

        self.kind = kind
        demo = DEMO_CLUSTERS[kind]
        self._replicated = demo.replicated
        self._cluster: Any = create(kind, nodes=demo.nodes)
        self.description = demo.description
        self._topic: str | None = None
        self._killed = 0
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return str(self._cluster.url)

    def create_topic(self, name: str) -> None:
        with _harness():
            self._cluster.create_topic(name, partitions=3)
        self._topic = name
        self._aim()

    def _aim(self) -> None:
        # The node to kill: the one leading partition 0 now (leaders move on restarts).
        if self._replicated and self._topic is not None:
            with _harness():
                self._killed = self._cluster.leader_of(self._topic, 0)
            self.description = (
                f"SIGKILL of Apache Kafka node {self._killed} (of 3), leader of partition 0"
            )

    def kill(self) -> None:
        self._aim()
        with _harness():
            self._cluster.kill(self._killed)

    def restart(self) -> None:
        with _harness():
            self._cluster.restart(self._killed)
            if self._replicated and self._topic is not None:
                self._cluster.wait_in_sync(self._topic)

    def __enter__(self) -> Self:
        started = time.monotonic()
        with _harness():
            self._cluster.start()
        self.start_s = time.monotonic() - started
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cluster.stop()


@contextmanager
def _harness() -> Iterator[None]:
    from msgsafe.cluster.base import ClusterError

    try:
        yield
    except (ClusterError, OSError) as exc:
        raise MsgsafeError(f"demo cluster: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """What the story does."""

    url: str
    destination: str
    count: int = 2000
    keys: int = 64
    kill_at: float = 0.5  #: fraction of the messages sent before the kill
    confirm_timeout: float = 3.0
    consume_timeout: float = 30.0
    #: Messages per second (0: as fast as possible); pacing lets confirms arrive before
    #: the kill, so the story has confirmed, in-flight and stored messages.
    rate: float = 1000.0
    #: Close the producer before the broker restarts and forward its outbox from a new
    #: one (the application restarting too), instead of the same producer forwarding.
    restart_app: bool = False
    options: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class DemoReport:
    """The counts the demo prints."""

    broker: str
    destination: str
    fault: str
    sent: int = 0
    confirmed: int = 0
    stored: int = 0
    stored_then_delivered: int = 0
    failed: int = 0
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    #: Ids read back more than once that were STORED (sent again from the outbox) and
    #: CONFIRMED (never sent again by msgsafe).
    duplicated_stored: int = 0
    duplicated_confirmed: int = 0
    confirm_timeout: float = 0.0
    unexpected: int = 0
    outbox_left: int = 0
    quarantined: int = 0
    outbox_file: str | None = None
    seconds: float = 0.0
    timeline: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class _Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    receipts: dict[str, Status] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    confirmed: int = 0


Progress = Callable[[int, int, int], None]  # (safe so far, confirmed, stored)


def run_story(
    config: DemoConfig,
    fault: Fault,
    *,
    report: DemoReport,
    on_receipt: Progress | None = None,
    note: Callable[[str], None] | None = None,
) -> DemoReport:
    """Run the story against ``config.url``, filling ``report``; returns it."""
    started = time.monotonic()

    def say(text: str) -> None:
        report.timeline.append(f"{time.monotonic() - started:6.2f}s  {text}")
        if note is not None:
            note(text)

    run = secrets.token_hex(4)
    tally = _Tally()
    options: dict[str, str] = {"confirm_timeout": str(config.confirm_timeout)}
    safe_declare = traits(parse_url(config.url).protocol).safe_declare
    if safe_declare:
        # NOTE: RabbitMQ acks unroutable messages unless they are mandatory; the adapter
        # publishes mandatory, so the demo's queue must exist: a quorum queue, the type
        # that keeps confirmed messages through a node's loss.
        options["declare"] = safe_declare
    options.update(config.options)
    url = with_options(config.url, options)
    workdir = Path(tempfile.mkdtemp(prefix="msgsafe-demo-"))
    outbox = workdir / "outbox.sqlite3"
    producer = Producer(url, outbox=outbox, send_timeout=120.0)
    try:
        _publish(config, fault, producer, run, tally, on_receipt, say)
        if config.restart_app:
            say("closing the producer (the stored messages stay in its outbox file)")
            producer.close(30.0)
        say("starting the broker again")
        fault.restart()
        if config.restart_app:
            say("a new producer opens the same outbox and forwards what it holds")
            producer = Producer(url, outbox=outbox, send_timeout=120.0)
        else:
            say("broker back; the same producer forwards its outbox")
        report.outbox_left = producer.drain(timeout=config.consume_timeout)
        store = producer.outbox
        report.quarantined = 0 if store is None else store.stats().quarantined
        say(f"outbox drained: {report.outbox_left} left, {report.quarantined} quarantined")
    finally:
        producer.close(30.0)
        try:
            keep = bool(_outbox_ids(outbox))
        except MsgsafeError:
            keep = True  # unreadable: keep it rather than risk deleting messages
        if keep:
            # Never delete messages that were accepted and not yet delivered.
            report.outbox_file = str(outbox)
            say(f"outbox kept at {outbox} (msgsafe outbox status {outbox})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    received = _consume(config, url, run, tally, say)
    in_outbox = _outbox_ids(outbox) if report.outbox_file else set()
    accepted = tally.receipts
    report.sent = config.count
    report.confirmed = sum(1 for s in accepted.values() if s is Status.CONFIRMED)
    report.stored = sum(1 for s in accepted.values() if s is Status.STORED)
    report.stored_then_delivered = sum(
        1 for i, s in accepted.items() if s is Status.STORED and received[i] > 0
    )
    report.failed = len(tally.failed)
    report.consumed = sum(1 for i in accepted if received[i] > 0)
    report.lost = sum(1 for i in accepted if received[i] == 0 and i not in in_outbox)
    report.duplicates = sum(n - 1 for i, n in received.items() if i in accepted and n > 1)
    repeated = [accepted[i] for i, n in received.items() if i in accepted and n > 1]
    report.duplicated_stored = sum(1 for s in repeated if s is Status.STORED)
    report.duplicated_confirmed = sum(1 for s in repeated if s is Status.CONFIRMED)
    report.confirm_timeout = config.confirm_timeout
    report.unexpected = sum(n for i, n in received.items() if i not in accepted)
    report.seconds = round(time.monotonic() - started, 2)
    return report


def _publish(
    config: DemoConfig,
    fault: Fault,
    producer: Producer,
    run: str,
    tally: _Tally,
    on_receipt: Progress | None,
    say: Callable[[str], None],
) -> None:
    kill_after = min(config.count, max(0, round(config.count * config.kill_at)))

    def done(future: Future[Receipt]) -> None:
        with tally.lock:
            exc = future.exception()
            if exc is None:
                receipt = future.result()
                tally.receipts[receipt.message_id] = receipt.status
                tally.confirmed += receipt.status is Status.CONFIRMED
            else:
                tally.failed.append(f"{type(exc).__name__}: {exc}")
            safe, confirmed = len(tally.receipts), tally.confirmed
        if on_receipt is not None:
            on_receipt(safe, confirmed, safe - confirmed)

    say(f"publishing {config.count} messages to {config.destination!r}")
    begun = time.monotonic()
    for n in range(config.count):
        if config.rate > 0:
            ahead = begun + n / config.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing the sends, not synchronising anything
        if n == kill_after:
            _await_confirms(tally, kill_after // 2, deadline=time.monotonic() + 15.0)
            say(f"killing the broker after {n} sends ({fault.description})")
            fault.kill()
        body = f'{{"run": "{run}", "n": {n}}}'.encode()
        future = producer.send_async(
            config.destination,
            body,
            key=f"key-{n % config.keys}",
            headers={RUN_HEADER: run},
        )
        future.add_done_callback(done)
    if kill_after == config.count:
        say("killing the broker after the last send")
        fault.kill()
    if not producer.flush(config.confirm_timeout * 4 + 60):
        say("some sends did not settle in time")
    with tally.lock:
        confirmed = sum(1 for s in tally.receipts.values() if s is Status.CONFIRMED)
        say(
            f"every send settled: {confirmed} confirmed, "
            f"{len(tally.receipts) - confirmed} stored, {len(tally.failed)} failed"
        )


def _await_confirms(tally: _Tally, wanted: int, *, deadline: float) -> None:
    """Let the first confirms arrive before the kill (a cold client's first requests
    are slow), so the report shows confirmed, in-flight and stored messages side by side."""
    while time.monotonic() < deadline:
        with tally.lock:
            if tally.confirmed >= wanted or tally.failed:
                return
        time.sleep(0.01)  # polling a counter with a deadline


def _consume(
    config: DemoConfig,
    url: str,
    run: str,
    tally: _Tally,
    say: Callable[[str], None],
) -> Counter[str]:
    """Read the destination until every accepted id came back (plus a short grace for
    late duplicates) or nothing arrived for ``consume_timeout`` seconds."""
    wanted = set(tally.receipts)
    received: Counter[str] = Counter()
    missing = set(wanted)
    say("consuming everything back")
    group = f"msgsafe-demo-{run}"
    try:
        start_at_beginning(url, config.destination, group)
        with Consumer(url, group=group) as consumer:
            consumer.subscribe(config.destination)
            last = time.monotonic()
            grace_until: float | None = None
            while True:
                now = time.monotonic()
                if grace_until is not None and now >= grace_until:
                    break
                if now - last >= config.consume_timeout:
                    say(f"nothing new for {config.consume_timeout:.0f}s; stopping")
                    break
                batch = consumer.poll(0.5, max_messages=500)
                if batch and not received:
                    say("first message received")
                for delivery in batch:
                    if delivery.headers.get(RUN_HEADER, run) == run and delivery.message_id:
                        received[delivery.message_id] += 1
                        missing.discard(delivery.message_id)
                        last = time.monotonic()
                    delivery.ack()
                if not missing and grace_until is None:
                    grace_until = time.monotonic() + 1.0
    except MsgsafeError as exc:
        say(f"consuming failed: {type(exc).__name__}: {exc}")
    say(f"consumed {sum(received.values())} copies of {len(received)} ids")
    return received


def _outbox_ids(path: Path) -> set[str]:
    """Ids still held by the outbox file (waiting or quarantined): not lost, not delivered."""
    from msgsafe.outbox import SqliteOutbox

    if not path.exists():
        return set()
    store = SqliteOutbox(path)
    try:
        ids = {e.envelope.message_id for e in store.list(limit=10_000_000)}
        ids.update(e.envelope.message_id for e in store.quarantined(limit=10_000_000))
    finally:
        store.close()
    return ids
