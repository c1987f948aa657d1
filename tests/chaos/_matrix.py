"""One cell of the fault matrix: traffic flows, a fault is injected, held and healed, then
everything is drained and consumed and the ledger is checked.

A cell records what it saw — sent, receipted (confirmed / stored), received, lost,
duplicates, time to recover, slowest ``send()`` — in :data:`RESULTS`, which
``tests/chaos/conftest.py`` turns into the summary table at the end of the run.

Time to recover is measured from the heal to the moment the producer is back to normal:
a ``send()`` after the heal came back CONFIRMED *and* the outbox is empty.
"""

from __future__ import annotations

import collections
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgsafe
from msgsafe.errors import MsgsafeError
from msgsafe.message import Status
from msgsafe.retry import RetryPolicy
from msgsafe.testing.faultproxy import FaultProxy
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until

#: The forwarder's backoff in every cell. NOTE: the default caps at 30 s, and while a
#: key has rows in the outbox every new send of that key is stored behind them (per-key
#: order), so after a long outage sends stay STORED until the forwarder's next probe —
#: up to 30 s after the heal. A 2 s cap keeps the cells short and shows the recovery
#: time of the transports rather than of the backoff.
RETRY = RetryPolicy(initial=0.2, maximum=2.0)

#: The AMQP 1.0 client's options in every cell: fail over within a second or two.
AMQP10_OPTIONS: dict[str, object] = {
    "connect_timeout": 1.0,
    "confirm_timeout": 2.0,
    "heartbeat": 2.0,
    "reconnect_maximum": 1.0,
}

#: Every finished cell of this run, in order (read by conftest.py).
RESULTS: list[CellResult] = []


@dataclass(frozen=True)
class CellResult:
    """The figures of one run of one cell."""

    protocol: str
    fault: str
    sent: int
    confirmed: int
    stored: int
    refused: dict[str, int]
    received: int
    lost: int
    duplicates: int
    unknown: int
    order_violations: int
    recover_s: float
    max_send_s: float
    stored_after_heal: int
    detail: str = ""

    @property
    def receipted(self) -> int:
        return self.confirmed + self.stored

    def line(self) -> str:
        refused = ", ".join(f"{k}={v}" for k, v in sorted(self.refused.items())) or "none"
        return (
            f"[{self.protocol} x {self.fault}] sent={self.sent} receipted={self.receipted} "
            f"(confirmed={self.confirmed} stored={self.stored}) received={self.received} "
            f"lost={self.lost} duplicates={self.duplicates} unknown={self.unknown} "
            f"order_violations={self.order_violations} recover={self.recover_s:.1f}s "
            f"max_send={self.max_send_s:.2f}s stored_after_heal={self.stored_after_heal} "
            f"not receipted: {refused} {self.detail}"
        )


@dataclass
class CellLedger(Ledger):
    """The loss ledger (each id's key and sequence in ``positions``) plus what a cell
    times: when each receipt came, the slowest ``send()``."""

    confirmed_at: list[float] = field(default_factory=list)
    stored_at: list[float] = field(default_factory=list)
    max_send_s: float = 0.0

    def confirmed_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for c in self.confirmed_at if c >= t)


class Traffic:
    """``threads`` senders calling blocking ``send()``, each on its own keys, paced at
    ``rate`` messages per second per thread, until :meth:`stop`.

    Bodies are ``key:seq`` so the consumer side can check per-key order.
    """

    def __init__(
        self,
        producer: msgsafe.Producer,
        destination: str,
        *,
        threads: int = 4,
        keys_per_thread: int = 4,
        rate: float = 60.0,
        body_size: int = 64,
    ) -> None:
        self.producer = producer
        self.destination = destination
        self.ledger = CellLedger()
        self._keys = keys_per_thread
        self._interval = 1.0 / rate
        self._pad = b"x" * max(0, body_size - 16)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(t,), name=f"chaos-sender-{t}", daemon=True)
            for t in range(threads)
        ]
        self.errors: list[BaseException] = []

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                raise AssertionError(f"{thread.name} still blocked in send() after {timeout}s")

    def _run(self, t: int) -> None:
        seqs = [0] * self._keys
        i = 0
        ledger = self.ledger
        try:
            while not self._stop.is_set():
                k = i % self._keys
                key = f"k{t}-{k}"
                seq = seqs[k]
                seqs[k] += 1
                i += 1
                message_id = msgsafe.new_message_id()
                with ledger.lock:
                    ledger.sent.add(message_id)
                    ledger.positions[message_id] = (key, seq)
                started = time.monotonic()
                try:
                    receipt = self.producer.send(
                        self.destination,
                        f"{key}:{seq}:".encode() + self._pad,
                        key=key,
                        message_id=message_id,
                    )
                except MsgsafeError as exc:
                    took = time.monotonic() - started
                    ledger.add_failure(message_id, exc)
                    with ledger.lock:
                        ledger.max_send_s = max(ledger.max_send_s, took)
                else:
                    now = time.monotonic()
                    ledger.add_receipt(message_id, receipt.status)
                    with ledger.lock:
                        ledger.max_send_s = max(ledger.max_send_s, now - started)
                        if receipt.status is Status.CONFIRMED:
                            ledger.confirmed_at.append(now)
                        else:
                            ledger.stored_at.append(now)
                # Pacing (a traffic rate), not synchronisation.
                self._stop.wait(self._interval)
        except BaseException as exc:  # surfaced by the cell
            self.errors.append(exc)


@dataclass
class Fault:
    """How to break and heal one thing. ``hold_s`` is how long the fault lasts.

    ``recovered`` (optional) is polled after ``heal`` until true — e.g. a broker cluster
    back in one piece — before the recovery clock of the producer is read.
    """

    name: str
    inject: Callable[[], None]
    heal: Callable[[], None]
    hold_s: float
    recovered: Callable[[], bool] | None = None
    #: Checked after the cell: e.g. that the fault really bit (sends stored, disk full).
    expect: Callable[[CellLedger], str | None] | None = None
    #: Errors ``send()`` may raise under this fault; any other is a failure of the cell
    #: (with an outbox, an outage must end STORED, not in an error).
    allowed_failures: frozenset[str] = frozenset()


Consume = Callable[[set[str]], list[tuple[str, bytes]]]
"""Receive until every expected id arrived (plus a quiet tail); returns (id, body) in
arrival order, duplicates included."""


def run_cell(
    protocol: str,
    fault: Fault,
    producer: msgsafe.Producer,
    destination: str,
    consume: Consume,
    *,
    send_timeout: float,
    check_order: bool = False,
    warmup: int = 100,
    recover_timeout: float = 120.0,
    threads: int = 4,
    keys_per_thread: int = 4,
    rate: float = 60.0,
    body_size: int = 64,
) -> CellResult:
    """Run one cell and return its figures; fails on loss, unknown ids, a ``send()`` past
    ``send_timeout``, or (``check_order``) a per-key order violation."""
    traffic = Traffic(
        producer,
        destination,
        threads=threads,
        keys_per_thread=keys_per_thread,
        rate=rate,
        body_size=body_size,
    )
    traffic.start()
    ledger = traffic.ledger
    heal_at = 0.0
    try:
        wait_until(lambda: ledger.confirmed_since(0) >= warmup, 60, f"{warmup} confirmed sends")
        fault.inject()
        try:
            # The fault's duration: traffic runs against it meanwhile.
            time.sleep(fault.hold_s)
        finally:
            fault.heal()
            heal_at = time.monotonic()
        if fault.recovered is not None:
            wait_until(fault.recovered, recover_timeout, f"recovery after {fault.name}")
        try:
            wait_until(
                lambda: ledger.confirmed_since(heal_at) > 0 and producer.pending() == 0,
                recover_timeout,
                "a confirmed send and an empty outbox after heal",
            )
        except AssertionError as exc:
            with ledger.lock:
                state = (
                    f"confirmed since heal={sum(1 for c in ledger.confirmed_at if c >= heal_at)}"
                    f" stored since heal={sum(1 for c in ledger.stored_at if c >= heal_at)}"
                    f" failures={dict(ledger.failures)}"
                )
            raise AssertionError(f"{exc}: pending={producer.pending()} {state}") from None
        recover_s = time.monotonic() - heal_at
    finally:
        traffic.stop()
    if traffic.errors:
        raise AssertionError(f"a sender thread died: {traffic.errors[0]!r}")
    left = producer.drain(60)
    assert left == 0, f"{left} messages still in the outbox after drain"

    with ledger.lock:
        receipted = set(ledger.receipted)
    arrivals = [mid for mid, _ in consume(receipted)]
    for mid in arrivals:
        ledger.add_received(mid)
    lost = ledger.lost
    unknown = ledger.unknown
    violations = len(ledger.order_violations(arrivals, among=receipted)) if check_order else 0
    with ledger.lock:
        stored_after = sum(1 for t in ledger.stored_at if t >= heal_at)
        result = CellResult(
            protocol=protocol,
            fault=fault.name,
            sent=len(ledger.sent),
            confirmed=ledger.statuses[Status.CONFIRMED.value],
            stored=ledger.statuses[Status.STORED.value],
            refused=dict(ledger.failures),
            received=sum(ledger.received.values()),
            lost=len(lost),
            duplicates=ledger.duplicates,
            unknown=len(unknown),
            order_violations=violations,
            recover_s=recover_s,
            max_send_s=ledger.max_send_s,
            stored_after_heal=stored_after,
        )
    RESULTS.append(result)
    print(result.line())
    assert not lost, f"{len(lost)} receipted messages lost, e.g. {sorted(lost)[:5]}"
    assert not unknown, f"{len(unknown)} received ids never sent"
    assert violations == 0, f"{violations} per-key order violations"
    assert result.max_send_s <= send_timeout + 1.0, (
        f"send() blocked {result.max_send_s:.2f}s, send_timeout={send_timeout}s"
    )
    unexpected = {k: v for k, v in result.refused.items() if k not in fault.allowed_failures}
    assert not unexpected, f"send() raised {unexpected} under {fault.name}"
    if fault.expect is not None:
        problem = fault.expect(ledger)
        assert problem is None, problem
    return result


def stored_during_fault(ledger: CellLedger) -> str | None:
    """Expectation of a black hole: some sends ended STORED, none timed out."""
    if not ledger.stored_at:
        return "no send was STORED: the fault did not bite"
    if ledger.failures.get("SendTimeout"):
        return f"{ledger.failures['SendTimeout']} sends raised SendTimeout instead of STORED"
    return None


def consume_with(
    url: str,
    destination: str,
    *,
    group: str | None = None,
    deadline_s: float = 90.0,
    quiet_s: float = 2.0,
    options: dict[str, object] | None = None,
) -> Consume:
    """A :data:`Consume` reading ``destination`` through ``msgsafe.Consumer`` (no dedup:
    duplicates are counted)."""

    def consume(expected: set[str]) -> list[tuple[str, bytes]]:
        arrivals: list[tuple[str, bytes]] = []
        missing = set(expected)
        with msgsafe.Consumer(url, group=group, **(options or {})) as consumer:
            consumer.subscribe(destination)
            deadline = time.monotonic() + deadline_s
            last = time.monotonic()
            while time.monotonic() < deadline:
                batch = consumer.poll(max_messages=500, timeout=0.5)
                for delivery in batch:
                    if delivery.message_id is not None:
                        arrivals.append((delivery.message_id, delivery.body))
                        missing.discard(delivery.message_id)
                    delivery.ack()
                if batch:
                    last = time.monotonic()
                elif not missing and time.monotonic() - last >= quiet_s:
                    break
        return arrivals

    return consume


def proxy_faults(proxies: Sequence[FaultProxy]) -> dict[str, Fault]:
    """The faults a proxy injects, applied to every proxy in ``proxies`` (the client
    cannot escape to another broker)."""

    def each(action: Callable[[FaultProxy], None]) -> Callable[[], None]:
        def run() -> None:
            for proxy in proxies:
                action(proxy)

        return run

    heal = each(lambda p: p.heal())
    return {
        "black-hole": Fault(
            "black-hole", each(lambda p: p.blackhole()), heal, 8.0, expect=stored_during_fault
        ),
        "reset": Fault("reset", each(lambda p: p.reset()), heal, 5.0),
        "latency 2 s": Fault("latency 2 s", each(lambda p: p.latency(2.0)), heal, 6.0),
        "bandwidth 10 KB/s": Fault(
            "bandwidth 10 KB/s", each(lambda p: p.bandwidth(10_000)), heal, 6.0
        ),
    }


def disk_full_fault(proxies: Sequence[FaultProxy], disk: Path, *, leave: int) -> Fault:
    """Brokers unreachable (every connection reset) while the outbox's disk fills up;
    heal frees the disk (a ballast file) and the network. Sends that cannot be stored
    raise OutboxFull; the cell checks that some did."""
    ballast = disk / "ballast"

    def inject() -> None:
        free = shutil.disk_usage(disk).free
        with ballast.open("wb") as f:
            f.write(b"\0" * max(0, free - leave))
        for p in proxies:
            p.reset()

    def heal() -> None:
        ballast.unlink(missing_ok=True)
        for p in proxies:
            p.heal()

    def expect(ledger: CellLedger) -> str | None:
        if not ledger.failures.get("OutboxFull"):
            return f"no send raised OutboxFull: the disk never filled ({dict(ledger.failures)})"
        if not ledger.stored_at:
            return "no send was STORED before the disk filled"
        return None

    return Fault(
        "outbox disk full",
        inject,
        heal,
        6.0,
        expect=expect,
        allowed_failures=frozenset({"OutboxFull"}),
    )


class BackgroundConsumer:
    """A consumer that runs during the whole cell (so it lives through the fault too);
    :meth:`consume` is a :data:`Consume` that waits for the expected ids, then stops."""

    def __init__(
        self,
        url: str,
        destination: str,
        *,
        options: dict[str, object] | None = None,
        deadline_s: float = 120.0,
        quiet_s: float = 2.0,
    ) -> None:
        self._consumer = msgsafe.Consumer(url, **(options or {}))
        self._destination = destination
        self._deadline_s = deadline_s
        self._quiet_s = quiet_s
        self.arrivals: list[tuple[str, bytes]] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-consumer", daemon=True)

    def start(self) -> BackgroundConsumer:
        self._consumer.subscribe(self._destination)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._consumer.poll(max_messages=500, timeout=0.5)
            except MsgsafeError as exc:
                # A transient receive error is the consumer's to survive: keep polling.
                self.errors[type(exc).__name__] += 1
                self._stop.wait(0.2)
                continue
            with self._lock:
                for delivery in batch:
                    if delivery.message_id is not None:
                        self.arrivals.append((delivery.message_id, delivery.body))
                if batch:
                    self._last = time.monotonic()
            for delivery in batch:
                delivery.ack()

    def consume(self, expected: set[str]) -> list[tuple[str, bytes]]:
        deadline = time.monotonic() + self._deadline_s
        try:
            while time.monotonic() < deadline:
                with self._lock:
                    missing = expected - {mid for mid, _ in self.arrivals}
                    quiet = time.monotonic() - self._last >= self._quiet_s
                if not missing and quiet:
                    break
                time.sleep(0.1)
        finally:
            self.close()
        with self._lock:
            return list(self.arrivals)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()
