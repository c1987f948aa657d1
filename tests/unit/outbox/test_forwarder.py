"""The forwarder: delivery, strict per-key order, backoff against a refusing broker,
quarantine of poison messages, drain — with a scriptable transport and with the memory
broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from msgsafe.adapters import open_transport
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    AuthenticationError,
    CertificateError,
    ConfigurationError,
    InvalidDestination,
    MsgsafeError,
    ProtocolMismatch,
    Refused,
    Rejected,
)
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import BatchReport, TransportCapabilities
from msgsafe.retry import RetryPolicy
from msgsafe.testing import MemoryBroker
from tests.support.clock import Clock


class ScriptedTransport:
    """A Transport whose outcomes are decided by ``script(envelope)``: None confirms at
    once, an error fails the future, ``"hold"`` leaves it pending until released."""

    def __init__(self, script: Callable[[Envelope], object] = lambda e: None) -> None:
        self.script = script
        self.published: list[Envelope] = []
        self.held: list[tuple[Envelope, Future[None]]] = []
        self.max_in_flight_per_key: dict[bytes, int] = {}
        self._in_flight: dict[bytes, int] = {}
        self._lock = threading.Lock()

    #: publish alone: the forwarder finds no optional seam.
    capabilities = TransportCapabilities()

    @property
    def target(self) -> str:
        return "scripted://"

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        with self._lock:
            self.published.append(envelope)
            if envelope.key is not None:
                n = self._in_flight.get(envelope.key, 0) + 1
                self._in_flight[envelope.key] = n
                self.max_in_flight_per_key[envelope.key] = max(
                    n, self.max_in_flight_per_key.get(envelope.key, 0)
                )
        outcome = self.script(envelope)
        if outcome == "hold":
            with self._lock:
                self.held.append((envelope, future))
            return future
        self._finish(envelope, future, outcome)
        return future

    def _finish(self, envelope: Envelope, future: Future[None], outcome: object) -> None:
        if envelope.key is not None:
            with self._lock:
                self._in_flight[envelope.key] -= 1
        if isinstance(outcome, MsgsafeError):
            future.set_exception(outcome)
        else:
            future.set_result(None)

    def release_held(self) -> int:
        with self._lock:
            held, self.held = self.held, []
        for envelope, future in held:
            self._finish(envelope, future, None)
        return len(held)

    def close(self, timeout: float | None = None) -> None:
        pass


def envs(n: int, keys: int = 0) -> list[Envelope]:
    return [
        Envelope.build("q", b"m%d" % i, key=(f"k{i % keys}" if keys else None)) for i in range(n)
    ]


def test_step_delivers_a_batch_and_removes_it(store: SqliteOutbox, clock: Clock) -> None:
    sent = envs(25)
    store.put(sent)
    transport = ScriptedTransport()
    fwd = Forwarder(store, transport, batch=10, clock=clock)
    assert [fwd.step() for _ in range(4)] == [10, 10, 5, 0]
    assert [e.message_id for e in transport.published] == [e.message_id for e in sent]
    assert store.stats().depth == 0
    assert fwd.stats().delivered == 25


def test_many_messages_of_a_key_in_flight_at_once_in_order(
    store: SqliteOutbox, clock: Clock
) -> None:
    sent = envs(60, keys=3) + envs(20)
    store.put(sent)
    transport = ScriptedTransport(lambda e: "hold")
    fwd = Forwarder(store, transport, batch=100, clock=clock)
    done = threading.Thread(target=fwd.step)
    done.start()
    deadline = time.monotonic() + 10
    while len(transport.held) < 80 and time.monotonic() < deadline:
        done.join(0.001)
    assert len(transport.held) == 80  # the whole batch in flight, not one per key
    transport.release_held()
    done.join(10)
    assert not done.is_alive()
    assert set(transport.max_in_flight_per_key.values()) == {20}
    for k in (b"k0", b"k1", b"k2"):
        expected = [e.message_id for e in sent if e.key == k]
        assert [e.message_id for e in transport.published if e.key == k] == expected
    assert store.stats().depth == 0


def test_a_key_stops_at_its_first_failure_and_is_resent_from_there(
    store: SqliteOutbox, clock: Clock
) -> None:
    """A transient failure in the middle of a key's pipelined run: that message and
    every later one of the key are re-sent (even those the broker confirmed), the key's
    earlier ones and the other keys are delivered; the broker's first sight of each id
    keeps the key's order, and nothing is lost."""
    sent = envs(40, keys=2)
    store.put(sent)
    k0 = [e.message_id for e in sent if e.key == b"k0"]
    # Answers come after everything was published, as from a broker: k0[7] refused.
    answering = [False]
    transport = ScriptedTransport(lambda e: None if answering[0] else "hold")
    fwd = Forwarder(store, transport, batch=100, clock=clock, rng=lambda: 0.0)
    round_ = threading.Thread(target=fwd.step)
    round_.start()
    deadline = time.monotonic() + 10
    while len(transport.held) < 40 and time.monotonic() < deadline:
        round_.join(0.001)
    answering[0] = True
    for env, future in transport.held:
        transport._finish(env, future, Refused("queue full") if env.message_id == k0[7] else None)
    round_.join(10)
    assert not round_.is_alive()
    # k1 and the first 7 of k0 were delivered; k0[7:] wait, in order.
    assert store.pending() == len(k0) - 7
    assert fwd.stats().refusing
    clock.now += fwd.next_attempt_in() + 0.001
    while fwd.step():
        clock.now += fwd.next_attempt_in() + 0.001
    assert store.pending() == 0
    ids = [e.message_id for e in transport.published]
    assert set(ids) == {e.message_id for e in sent}  # lost: 0
    confirmed_k0 = [i for i in ids if i in set(k0)]
    # The first run published all of k0; the second re-sent it from the refused k0[7].
    assert confirmed_k0 == k0 + k0[7:]
    k1 = [e.message_id for e in sent if e.key == b"k1"]
    assert [i for i in ids if i in set(k1)] == k1  # the other key: once each, in order


def test_keyless_messages_are_pipelined(store: SqliteOutbox, clock: Clock) -> None:
    store.put(envs(50))
    transport = ScriptedTransport(lambda e: "hold")
    fwd = Forwarder(store, transport, batch=100, clock=clock)
    t = threading.Thread(target=fwd.step)
    t.start()
    deadline = time.monotonic() + 10
    while len(transport.held) < 50 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(transport.held) == 50  # all in flight at once
    transport.release_held()
    t.join(10)
    assert store.stats().depth == 0


def test_refusing_broker_gets_one_probe_per_backoff_then_full_batches(
    store: SqliteOutbox, clock: Clock
) -> None:
    store.put(envs(100, keys=4))
    refusing = True
    transport = ScriptedTransport(lambda e: Refused("nope") if refusing else None)
    policy = RetryPolicy(initial=1.0, maximum=8.0)
    fwd = Forwarder(store, transport, batch=50, clock=clock, rng=lambda: 1.0, policy=policy)
    fwd.step()
    first_round = len(transport.published)
    assert first_round <= 50
    assert fwd.stats().refusing
    # While the backoff runs, nothing is sent at all.
    assert fwd.step() == 0
    waits = []
    for _ in range(5):
        waits.append(fwd.next_attempt_in())
        clock.now += fwd.next_attempt_in() + 0.001
        before = len(transport.published)
        assert fwd.step() == 1  # a single probe
        assert len(transport.published) == before + 1
    assert waits == sorted(waits) and waits[-1] <= 8.0 + 1e-6  # capped, growing
    assert store.stats().depth == 100  # nothing lost, nothing quarantined
    refusing = False
    clock.now += fwd.next_attempt_in() + 0.001
    assert fwd.step() == 1  # the probe succeeds ...
    assert not fwd.stats().refusing
    clock.now += 100  # released rows' retry times have passed
    while fwd.step():
        pass
    assert store.stats().depth == 0
    # Per-key order held in what the broker accepted (UUIDv7 ids of one key sort in send
    # order; the refused attempts before are not deliveries).
    accepted = transport.published[first_round + 5 :]
    by_key: dict[bytes | None, list[str]] = {}
    for e in accepted:
        by_key.setdefault(e.key, []).append(e.message_id)
    for k, ids in by_key.items():
        assert ids == sorted(ids), k
    assert sum(len(ids) for ids in by_key.values()) == 100


def test_permanent_error_quarantines_and_the_key_continues(
    store: SqliteOutbox, clock: Clock
) -> None:
    sent = envs(6, keys=1)
    store.put(sent)
    poison = sent[2].message_id
    transport = ScriptedTransport(
        lambda e: Rejected("bad", condition="amqp:decode-error") if e.message_id == poison else None
    )
    seen: list[tuple[str, str]] = []
    fwd = Forwarder(
        store, transport, clock=clock, on_quarantine=lambda e, err: seen.append((e.message_id, err))
    )
    fwd.step()
    assert store.stats().depth == 0 and store.stats().quarantined == 1
    [q] = store.quarantined()
    assert q.envelope.message_id == poison and "Rejected" in q.error
    assert seen and seen[0][0] == poison
    assert [e.message_id for e in transport.published] == [e.message_id for e in sent]


def test_drain_with_the_memory_broker(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    transport = open_transport(parse_url(f"memory://{memory_broker.name}"), {})
    store = SqliteOutbox(tmp_path / "o.db")
    sent = envs(2000, keys=10)
    store.put(sent)
    memory_broker.refuse_writes()
    fwd = Forwarder(store, transport, policy=RetryPolicy(initial=0.01, maximum=0.05))
    fwd.start()
    fwd.wake()
    assert fwd.drain(0.3) == 2000  # refusing: nothing goes
    memory_broker.accept_writes()
    assert fwd.drain(20) == 0
    fwd.stop(5)
    got = memory_broker.ids("q")
    assert set(got) == {e.message_id for e in sent}
    for k in range(10):
        key = f"k{k}".encode()
        ids = [e.message_id for e in memory_broker.messages("q") if e.key == key]
        assert ids == [e.message_id for e in sent if e.key == key]
    dupes = len(got) - len(set(got))
    print(f"sent={len(sent)} received={len(set(got))} duplicates={dupes} lost=0")
    store.close()
    transport.close()


def test_drain_without_thread_returns_remaining(store: SqliteOutbox) -> None:
    store.put(envs(10))
    transport = ScriptedTransport(lambda e: Refused("down"))
    slept: list[float] = []
    fwd = Forwarder(
        store, transport, sleep=slept.append, policy=RetryPolicy(initial=0.01, maximum=0.02)
    )
    assert fwd.drain(0.2) == 10
    assert slept
    assert fwd.last_error is not None and "Refused" in fwd.last_error


def test_unanswered_publishes_are_released_at_the_lease_deadline(
    store: SqliteOutbox, clock: Clock
) -> None:
    store.put(envs(3))
    transport = ScriptedTransport(lambda e: "hold")
    fwd = Forwarder(store, transport, lease_s=0.2, clock=clock)
    started = time.monotonic()
    assert fwd.step() == 3
    assert time.monotonic() - started < 5
    assert fwd.stats().refusing and store.stats().depth == 3
    clock.now += 3600
    transport.script = lambda e: None
    fwd.drain(5)
    assert store.stats().depth == 0


def test_a_failed_store_update_is_retried_before_the_next_claim(
    store: SqliteOutbox, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from msgsafe.errors import OutboxFull

    sent = envs(5)
    store.put(sent)
    real = store.delivered
    calls: list[list[str]] = []

    def flaky(ids: list[str]) -> None:
        calls.append(list(ids))
        if len(calls) == 1:
            raise OutboxFull("disk full")
        real(ids)

    monkeypatch.setattr(store, "delivered", flaky)
    transport = ScriptedTransport()
    fwd = Forwarder(store, transport, clock=clock, policy=RetryPolicy(initial=0, maximum=0))
    assert fwd.step() == 5
    assert store.stats().depth == 5  # not yet removed: still leased, not resent
    assert fwd.step() == 0  # retried the update first; nothing left to claim
    assert store.stats().depth == 0
    assert len(transport.published) == 5 and calls[0] == calls[1]


def test_drain_pushes_now_after_a_long_outage(store: SqliteOutbox, clock: Clock) -> None:
    store.put(envs(300, keys=3))
    refusing = True
    transport = ScriptedTransport(lambda e: Refused("down") if refusing else None)
    fwd = Forwarder(store, transport, clock=clock, policy=RetryPolicy(initial=1, maximum=30))
    for _ in range(12):  # an outage long enough to reach the 30 s cap
        clock.now += fwd.next_attempt_in() + 0.001
        fwd.step()
    assert fwd.stats().refusing
    refusing = False
    started = time.monotonic()
    assert fwd.drain(10) == 0  # no waiting for the backoff or per-row retry times
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "error",
    [
        AuthenticationError("the broker refused the credentials"),
        CertificateError("the broker's TLS certificate failed verification: expired"),
        ProtocolMismatch("this port speaks AMQP 0-9-1, not AMQP 1.0: use amqp://"),
        ConfigurationError("kafka producer settings: unknown setting"),
    ],
    ids=["login refused", "certificate", "wrong protocol", "configuration"],
)
def test_a_connection_refused_for_good_keeps_every_message_and_pauses(
    store: SqliteOutbox, clock: Clock, caplog: pytest.LogCaptureFixture, error: MsgsafeError
) -> None:
    """Permanent for a send, but about the connection: nothing is quarantined, one ERROR
    says why, the forwarder backs off, and delivers everything once it is fixed. The same
    for a configuration error met while forwarding, which every message shares (a name
    the protocol refuses is InvalidDestination, the message's own: see below)."""
    sent = envs(5, keys=2)
    store.put(sent)
    broken = [True]
    transport = ScriptedTransport(lambda e: error if broken[0] else None)
    fwd = Forwarder(store, transport, clock=clock)
    with caplog.at_level("ERROR", logger="msgsafe.outbox"):
        for _ in range(4):
            fwd.step()
            clock.now += 60  # past any backoff
    assert store.stats().depth == 5 and store.stats().quarantined == 0
    said = "configuration" if isinstance(error, ConfigurationError) else "connection"
    refusals = [r for r in caplog.records if f"refused the {said}" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    assert type(error).__name__ in refusals[0].getMessage()
    # While it refuses, one probe per round (not the whole backlog each time).
    assert len(transport.published) <= 2 * 4
    broken[0] = False
    for _ in range(3):  # a probe is confirmed first, then full batches
        fwd.step()
        clock.now += 60
    assert store.stats().depth == 0 and store.stats().quarantined == 0


def test_a_name_refused_while_forwarding_is_quarantined_with_the_reason(
    store: SqliteOutbox, clock: Clock
) -> None:
    """InvalidDestination is a ConfigurationError too, but the message's own: quarantined
    at once, and the other messages go."""
    bad = Envelope.build("q" * 300, b"bad")
    good = envs(3)
    store.put([bad, *good])
    error = InvalidDestination("queue names are at most 255 bytes")
    transport = ScriptedTransport(lambda e: error if e.message_id == bad.message_id else None)
    Forwarder(store, transport, clock=clock).step()
    assert store.stats().depth == 0 and store.stats().quarantined == 1
    [q] = store.quarantined()
    assert q.envelope.message_id == bad.message_id
    assert q.error == "InvalidDestination: queue names are at most 255 bytes"


class BatchingTransport(ScriptedTransport):
    """A transport with the batch seam: every batch is held until ``answer`` reports it,
    failures by index and confirmations by count, as the adapters do."""

    capabilities = TransportCapabilities(batch=True)

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[Batch, BatchReport]] = []

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        with self._lock:
            self.batches.append((batch, report))
            self.published.extend(batch.envelope(i) for i in range(len(batch)))

    def answer(self, failing: set[str]) -> None:
        with self._lock:
            batches, self.batches = self.batches, []
        for batch, report in batches:
            ok = 0
            for index, message_id in enumerate(batch.message_ids):
                if message_id in failing:
                    report.failed(index, Refused("queue full"))
                else:
                    ok += 1
            report.confirmed(ok)


def test_batches_keep_key_order_when_one_message_fails(store: SqliteOutbox, clock: Clock) -> None:
    """Through publish_batch: runs of one destination go out as one batch; a failure
    by index stops its key there (re-sent from it), the other key is delivered."""
    sent = envs(40, keys=2)
    store.put(sent)
    k0 = [e.message_id for e in sent if e.key == b"k0"]
    transport = BatchingTransport()
    fwd = Forwarder(store, transport, batch=100, clock=clock, rng=lambda: 0.0)
    round_ = threading.Thread(target=fwd.step)
    round_.start()
    deadline = time.monotonic() + 10
    while not transport.batches and time.monotonic() < deadline:
        round_.join(0.001)
    assert sum(len(b) for b, _ in transport.batches) == 40  # all at once, in batches
    transport.answer({k0[3]})
    round_.join(10)
    assert not round_.is_alive()
    assert store.pending() == len(k0) - 3
    while store.pending() and time.monotonic() < deadline:  # a probe, then full rounds
        clock.now += fwd.next_attempt_in() + 0.001
        later = threading.Thread(target=fwd.step)
        later.start()
        while later.is_alive():
            transport.answer(set())
            later.join(0.001)
    assert store.pending() == 0
    ids = [e.message_id for e in transport.published]
    assert [i for i in ids if i in set(k0)] == k0 + k0[3:]


def test_a_batch_unanswered_at_the_lease_deadline_is_sent_again_whole(
    store: SqliteOutbox, clock: Clock
) -> None:
    """Confirmations come by count: a batch whose count never completes is released
    whole (duplicates at worst, never a loss)."""
    store.put(envs(10, keys=2))
    transport = BatchingTransport()
    fwd = Forwarder(store, transport, batch=100, lease_s=0.2, clock=clock, rng=lambda: 0.0)
    fwd.step()  # nothing answers: the round ends at 0.9 of the lease
    assert store.pending() == 10 and fwd.stats().retried == 10
    transport.batches.clear()
    assert "lease deadline" in (fwd.last_error or "")


class LingeringTransport:
    """Holds every message until hurried, as librdkafka holds a batch for ``linger.ms``
    (here the linger never ends): only ``hurry`` sends what it holds."""

    capabilities = TransportCapabilities(hurry=True, ordered_rounds=True)

    def __init__(self) -> None:
        self.held: list[tuple[Envelope, Future[None]]] = []
        self.delivered: list[str] = []
        self.hurried = 0

    @property
    def target(self) -> str:
        return "lingering://"

    def publish(self, envelope: Envelope) -> Future[None]:
        future: Future[None] = Future()
        self.held.append((envelope, future))
        return future

    def hurry(self, done: Future[object], timeout: float) -> None:
        self.hurried += 1
        held, self.held = self.held, []
        for envelope, future in held:
            self.delivered.append(envelope.message_id)
            future.set_result(None)

    def close(self, timeout: float | None = None) -> None:
        pass


def test_a_round_is_hurried_rather_than_left_to_linger(tmp_path: Path) -> None:
    """Nothing joins a round once it is published: the forwarder hurries its tail out
    instead of waiting out the transport's linger (here endless: without the hurry the
    drain would end at its deadline with everything still stored)."""
    store = SqliteOutbox(tmp_path / "o.db")
    transport = LingeringTransport()
    sent = [Envelope.build("q", b"m%d" % i, key=f"k{i % 3}") for i in range(1200)]
    store.put(sent)
    try:
        forwarder = Forwarder(store, transport, batch=500, lease_s=30)
        assert forwarder.drain(20) == 0
        assert transport.delivered == [e.message_id for e in sent]
        assert transport.hurried >= 3  # one round at least per 500 messages
    finally:
        store.close()


def test_a_broker_reachable_again_ends_the_backoff_at_once(
    store: SqliteOutbox, clock: Clock
) -> None:
    """The transport's connection event (``reachable``) cuts a long backoff short: the
    next step probes at once, with no time passing on the forwarder's clock."""
    store.put(envs(10, keys=2))
    refusing = True
    transport = ScriptedTransport(lambda e: Refused("nope") if refusing else None)
    policy = RetryPolicy(initial=60.0, maximum=60.0)
    fwd = Forwarder(store, transport, clock=clock, rng=lambda: 1.0, policy=policy)
    fwd.step()
    assert fwd.stats().refusing
    assert fwd.next_attempt_in() > 30.0
    assert fwd.step() == 0  # the backoff holds
    refusing = False
    fwd.reachable(transport.target)
    assert fwd.step() == 1  # the probe, at once
    assert not fwd.stats().refusing
    clock.now += 100  # released rows' retry times have passed
    while fwd.step():
        pass
    assert store.stats().depth == 0


def test_every_answered_round_is_told(store: SqliteOutbox, clock: Clock) -> None:
    """``on_answered`` hears each round the broker answered whole (the producer ends
    its refusal pause there), not a refused one."""
    store.put(envs(10))
    refusing = True
    transport = ScriptedTransport(lambda e: Refused("nope") if refusing else None)
    answered: list[int] = []
    fwd = Forwarder(
        store,
        transport,
        clock=clock,
        rng=lambda: 1.0,
        policy=RetryPolicy(initial=1.0, maximum=1.0),
        on_answered=lambda: answered.append(1),
    )
    fwd.step()
    assert answered == []
    refusing = False
    clock.now += 2.0
    assert fwd.step() == 1  # the probe
    assert answered == [1]


def test_a_send_after_the_drain_goes_to_the_broker_at_once(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """The refusal pause (sends straight to the outbox for half a second after a
    failure) ends when the forwarder's round is answered: a drain quicker than the
    pause does not send the next message the long way."""
    from msgsafe import Producer, Status

    with Producer(
        f"memory://{memory_broker.name}", outbox=tmp_path / "o.db", connect_timeout=0.2
    ) as producer:
        memory_broker.down()
        stored = [producer.send("q", b"m%d" % i) for i in range(20)]
        assert {r.status for r in stored} == {Status.STORED}
        memory_broker.up()
        assert producer.drain(10) == 0
        assert producer.send("q", b"after").status is Status.CONFIRMED
    assert len(memory_broker.ids("q")) == 21
