"""What every adapter and every outbox store promises, checked the same way for each (see
msgsafe/ports.py): the required contract, and each capability as declared — a flag set
to True is a promise kept, a flag left False a seam neither offered nor used."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest

from msgsafe import Consumer, Delivery, Producer, Status
from msgsafe.adapters import open_transport
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    InvalidMessage,
    MessageTooLarge,
    MsgsafeError,
)
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.ports import (
    BatchPutStore,
    BatchTransport,
    CallbackTransport,
    CountingStore,
    ErrorListeningTransport,
    FastPathTransport,
    HurryingTransport,
    NotifyingStore,
    OutboxStore,
    ReleasingStore,
    RenewingStore,
    RowClaimingStore,
    StoreCapabilities,
    TransactionalStore,
    Transport,
    TransportCapabilities,
)
from msgsafe.testing import MemoryBroker
from tests.contract.conftest import SIZE_LIMIT, BrokerCase, StoreCase
from tests.support.waiting import wait_until


def _consumer(case: BrokerCase, destination: str) -> Consumer:
    group = f"g-{uuid.uuid4().hex[:8]}" if case.needs_group else None
    return Consumer(case.url, group=group, **case.consumer_options).subscribe(destination)


def _collect(consumer: Consumer, n: int, patience: float, *, ack: bool = False) -> list[Delivery]:
    """Poll until ``n`` deliveries arrived or ``patience`` seconds passed; ``ack`` settles
    each as it comes (brokers stop sending at the prefetch window until acks arrive)."""
    got: list[Delivery] = []
    deadline = time.monotonic() + patience
    while len(got) < n and time.monotonic() < deadline:
        batch = consumer.poll(max_messages=n - len(got), timeout=0.5)
        if ack:
            for d in batch:
                d.ack()
        got += batch
    return got


def test_confirmed_message_round_trips_with_id_key_headers(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        r = p.send(dest, b"\x00body\xff", key="k-1", headers={"trace": "t-1"})
    assert r.status is Status.CONFIRMED
    with _consumer(case, dest) as c:
        [d] = _collect(c, 1, case.patience)
        assert d.body == b"\x00body\xff"
        assert d.message_id == r.message_id
        assert d.key == b"k-1"
        assert d.headers.get("trace") == "t-1"
        d.ack()


def test_pipelined_sends_all_confirmed_and_per_key_order_kept(case: BrokerCase) -> None:
    dest = case.new_destination()
    n = 500
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        futures = [p.send_async(dest, str(i).encode(), key=f"k{i % 5}") for i in range(n)]
        receipts = [f.result(timeout=case.patience) for f in futures]
    assert all(r.status is Status.CONFIRMED for r in receipts)
    with _consumer(case, dest) as c:
        got = _collect(c, n, case.patience * 2, ack=True)
    assert {d.message_id for d in got} == {r.message_id for r in receipts}
    for k in range(5):
        seq = [int(d.body) for d in got if d.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"


def test_unacked_messages_come_back_after_consumer_closes(case: BrokerCase) -> None:
    dest = case.new_destination()
    group = f"g-{uuid.uuid4().hex[:8]}" if case.needs_group else None
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        ids = {p.send(dest, b"x").message_id for _ in range(3)}
    first = Consumer(case.url, group=group, **case.consumer_options).subscribe(dest)
    assert {d.message_id for d in _collect(first, 3, case.patience)} == ids
    first.close()  # nothing acked
    with Consumer(case.url, group=group, **case.consumer_options).subscribe(dest) as second:
        again = _collect(second, 3, case.patience)
        assert {d.message_id for d in again} == ids
        if "redelivered" in case.features:
            assert all(d.redelivered for d in again)
        for d in again:
            d.ack()


def test_nack_requeue_and_reject(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        mid = p.send(dest, b"x").message_id
    with _consumer(case, dest) as c:
        [d] = _collect(c, 1, case.patience)
        d.nack(requeue=True)
        [again] = _collect(c, 1, case.patience)
        assert again.message_id == mid
        again.nack(requeue=False)
        assert c.poll(max_messages=1, timeout=0.5) == []


def test_release_gives_back_for_another_delivery(case: BrokerCase) -> None:
    # Every receiver settles RELEASE (msgsafe/ports.py, Receiver): uncounted where the
    # protocol can say so, a requeue elsewhere; never a reject, never an ack.
    dest = case.new_destination()
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        mid = p.send(dest, b"x").message_id
    with _consumer(case, dest) as c:
        [d] = _collect(c, 1, case.patience)
        d.release()
        [again] = _collect(c, 1, case.patience)
        assert again.message_id == mid
        again.ack()
        assert c.poll(max_messages=1, timeout=0.5) == []


def test_oversize_is_refused_before_sending(case: BrokerCase) -> None:
    dest = case.new_destination()
    with Producer(case.url, outbox=False, max_message_size=1024, **case.producer_options) as p:
        with pytest.raises(MessageTooLarge):
            p.send(dest, b"x" * 1025)
        assert p.send(dest, b"x" * 1024).status is Status.CONFIRMED


def test_closed_producer_raises_closed_error(case: BrokerCase) -> None:
    p = Producer(case.url, outbox=False, **case.producer_options)
    p.close()
    with pytest.raises(ClosedError):
        p.send(case.new_destination(), b"x")


# --- what each transport declares (msgsafe.ports.TransportCapabilities) -------------------

#: The flags that promise a method, and the Protocol that method belongs to.
_TRANSPORT_SEAMS: dict[str, type] = {
    "callback": CallbackTransport,
    "batch": BatchTransport,
    "hurry": HurryingTransport,
    "listen_errors": ErrorListeningTransport,
    "fast_path": FastPathTransport,
}


def test_a_transport_declares_exactly_the_seams_it_offers(transport: Transport) -> None:
    """Its record is declared (not the fallback for a transport without one), the same
    whenever asked, and names every optional method it has and no other: a method
    without its flag is never called, a flag without its method would fail the caller."""
    caps = transport.capabilities
    assert isinstance(caps, TransportCapabilities)
    assert transport.capabilities == caps
    declared = {name: flag for name, flag in asdict(caps).items() if name in _TRANSPORT_SEAMS}
    offered = {name: isinstance(transport, seam) for name, seam in _TRANSPORT_SEAMS.items()}
    assert declared == offered


def test_callback_as_declared_reports_each_message_exactly_once(
    case: BrokerCase, transport: Transport
) -> None:
    """``callback``: ``publish_callback`` calls back once per message — None when
    confirmed, the error when not (here a message over the size limit) — and never
    again, not even when the transport closes. Undeclared, the producer confirms
    through ``publish`` alone."""
    dest = case.new_destination()
    if not transport.capabilities.callback:
        with Producer(case.url, outbox=False, **case.producer_options) as p:
            assert p.send(dest, b"x", key="k").status is Status.CONFIRMED
        return
    seam = cast(CallbackTransport, transport)
    outcomes: dict[int, list[MsgsafeError | None]] = defaultdict(list)
    lock = threading.Lock()

    def record(index: int, error: MsgsafeError | None) -> None:
        with lock:
            outcomes[index].append(error)

    n = 50
    for i in range(n):
        seam.publish_callback(Envelope.build(dest, b"m%d" % i, key=f"k{i % 3}"), partial(record, i))
    seam.publish_callback(Envelope.build(dest, b"x" * (SIZE_LIMIT + 1)), partial(record, n))
    wait_until(lambda: len(outcomes) == n + 1, case.patience, "a callback for every message")
    transport.close(case.patience)
    with lock:
        assert {i: len(calls) for i, calls in outcomes.items()} == dict.fromkeys(range(n + 1), 1)
        assert [outcomes[i][0] for i in range(n)] == [None] * n
        assert isinstance(outcomes[n][0], MessageTooLarge)
    with _consumer(case, dest) as c:
        assert len(_collect(c, n, case.patience, ack=True)) == n


class _Tally:
    """A BatchReport that counts, and fails the test on a message reported twice."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.confirmed_count = 0
        self.failures: dict[int, MsgsafeError] = {}
        self._lock = threading.Lock()

    def confirmed(self, count: int) -> None:
        with self._lock:
            self.confirmed_count += count

    def failed(self, index: int, error: MsgsafeError) -> None:
        with self._lock:
            assert 0 <= index < self.size and index not in self.failures, index
            self.failures[index] = error

    def reported(self) -> int:
        with self._lock:
            return self.confirmed_count + len(self.failures)


def test_batch_as_declared_reports_each_message_exactly_once(
    case: BrokerCase, transport: Transport
) -> None:
    """``batch``: ``publish_batch`` reports every message once — a message over the size
    limit fails alone, by its index, the others are confirmed and arrive in key order.
    Undeclared, the producer's ``send_batch`` goes message by message, confirmed all
    the same."""
    dest = case.new_destination()
    n = 40
    bodies = [b"%d" % i for i in range(n)]
    keys = [f"k{i % 4}" for i in range(n)]
    if not transport.capabilities.batch:
        with Producer(case.url, outbox=False, **case.producer_options) as p:
            receipt = p.send_batch(dest, bodies, keys=keys)
        assert receipt.confirmed == n
        with _consumer(case, dest) as c:
            got = _collect(c, n, case.patience, ack=True)
        assert {d.message_id for d in got} == set(receipt.message_ids)
        return
    bodies[3] = b"x" * (SIZE_LIMIT + 1)
    batch = Batch.build(dest, bodies, keys=keys)
    report = _Tally(n)
    cast(BatchTransport, transport).publish_batch(batch, report)
    wait_until(lambda: report.reported() == n, case.patience, "every message of the batch reported")
    transport.close(case.patience)
    assert report.confirmed_count == n - 1
    assert list(report.failures) == [3] and isinstance(report.failures[3], MessageTooLarge)
    with _consumer(case, dest) as c:
        got = _collect(c, n - 1, case.patience, ack=True)
    assert {d.message_id for d in got} == set(batch.message_ids) - {batch.message_ids[3]}
    for k in range(4):
        seq = [int(d.body) for d in got if d.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"


def test_hurry_as_declared(case: BrokerCase, transport: Transport) -> None:
    """``hurry``: ``hurry(done, timeout)`` returns once ``done`` is resolved (the message
    confirmed) when the broker answers within ``timeout``. Undeclared, the producer's
    ``hurry`` returns at once, even on a future that never resolves."""
    dest = case.new_destination()
    if not transport.capabilities.hurry:
        with Producer(case.url, outbox=False, **case.producer_options) as p:
            never: Future[Any] = Future()
            started = time.monotonic()
            p.hurry(never, timeout=60)
            assert time.monotonic() - started < 30
        return
    future = transport.publish(Envelope.build(dest, b"x"))
    cast(HurryingTransport, transport).hurry(future, case.patience)
    assert future.done() and future.exception() is None


def test_tombstones_as_declared(case: BrokerCase, transport: Transport) -> None:
    """``tombstones``: ``send(body=None)`` is confirmed and the wire holds a null body,
    apart from an empty one. Undeclared, the producer refuses it with InvalidMessage
    before anything is sent, and an empty body still goes."""
    dest = case.new_destination()
    declared = transport.capabilities.tombstones
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        if not declared:
            with pytest.raises(InvalidMessage, match="tombstone"):
                p.send(dest, None, key="k")
        else:
            assert p.send(dest, None, key="k").status is Status.CONFIRMED
        assert p.send(dest, b"", key="k").status is Status.CONFIRMED
    if not declared:
        with _consumer(case, dest) as c:
            [only] = _collect(c, 1, case.patience, ack=True)
            assert only.body == b"" and c.poll(max_messages=1, timeout=0.5) == []
        return
    assert case.read_bodies is not None, f"{case.name} declares tombstones: give read_bodies"
    assert case.read_bodies(dest, 2) == [None, b""]


def test_listen_errors_as_declared(case: BrokerCase, transport: Transport) -> None:
    """``listen_errors``: the producer hands a listener to the transport (True) or says
    there is nothing to hear (False), and None stops it the same way."""
    declared = transport.capabilities.listen_errors
    with Producer(case.url, outbox=False, **case.producer_options) as p:
        assert p.listen_errors(lambda error: None) is declared
        assert p.listen_errors(None) is declared


def test_fast_path_as_declared(case: BrokerCase, transport: Transport, tmp_path: Path) -> None:
    """``fast_path``: the producer's single sends go through the transport's fast path
    (True) or the safe way (False); either way every one is confirmed, and each key keeps its order
    across single sends and a keyed batch between them (which the fast path leaves for)."""
    declared = transport.capabilities.fast_path
    dest = case.new_destination()
    with Producer(case.url, outbox=tmp_path / "o.db", **case.producer_options) as p:
        assert (p._fast is not None) is declared
        first = [p.send_async(dest, b"%d" % i, key=f"k{i % 3}") for i in range(60)]
        batch = p.send_batch_async(
            dest, [b"%d" % i for i in range(60, 120)], keys=[f"k{i % 3}" for i in range(60, 120)]
        )
        last = [p.send_async(dest, b"%d" % i, key=f"k{i % 3}") for i in range(120, 180)]
        assert p.flush(case.patience * 2)
        receipts = [f.result(0) for f in first + last]
        assert all(r.status is Status.CONFIRMED for r in receipts)
        assert batch.result(0).confirmed == 60
    with _consumer(case, dest) as c:
        got = _collect(c, 180, case.patience * 2, ack=True)
    assert sorted(int(d.body) for d in got) == list(range(180))
    for k in range(3):
        seq = [int(d.body) for d in got if d.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"


def test_the_forwarder_drains_through_the_transport_in_key_order(
    case: BrokerCase, transport: Transport, tmp_path: Path
) -> None:
    """Rounds as the transport declares them (as batches with ``batch``, overlapping with
    ``ordered_rounds``): every stored message arrives, each key in order."""
    dest = case.new_destination()
    n = 300
    store = SqliteOutbox(tmp_path / "o.db")
    try:
        sent = [Envelope.build(dest, b"%d" % i, key=f"k{i % 3}") for i in range(n)]
        store.put(sent)
        assert Forwarder(store, transport, batch=50).drain(case.patience * 3) == 0
    finally:
        store.close()
    with _consumer(case, dest) as c:
        got = _collect(c, n, case.patience * 2, ack=True)
    assert {d.message_id for d in got} == {e.message_id for e in sent}
    for k in range(3):
        seq = [int(d.body) for d in got if d.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"


def test_ordered_rounds_as_declared(case: BrokerCase, transport: Transport, tmp_path: Path) -> None:
    """``ordered_rounds``: what is handed over in a later call reaches the broker later on
    each key (three rounds handed over one after another, none waiting for the answers
    of the last, arrive in hand-over order), and the forwarder overlaps its rounds
    through the transport: a step leaves its round in flight, the next claims the next
    round (following each key past the rows in flight) before settling it, and the
    drain keeps every key's order. Undeclared, a step settles its own round."""
    declared = transport.capabilities.ordered_rounds
    dest = case.new_destination()
    store = SqliteOutbox(tmp_path / "o.db")
    try:
        stored = [Envelope.build(dest, b"s%d" % i, key=f"k{i % 3}") for i in range(120)]
        store.put(stored)
        fwd = Forwarder(store, transport, batch=40)
        fwd._limit = 40  # rounds of 40 from the first: three of them
        assert fwd.step() == 40
        assert (fwd._flight is not None) is declared
        assert fwd.drain(case.patience * 3) == 0
    finally:
        store.close()
    handed: list[Envelope] = []
    if declared:
        futures: list[Future[None]] = []
        for r in range(3):
            round_ = [
                Envelope.build(dest, b"h%d" % (r * 30 + i), key=f"k{i % 3}") for i in range(30)
            ]
            handed += round_
            futures += [transport.publish(env) for env in round_]
        for future in futures:
            future.result(case.patience)
    sent = stored + handed
    with _consumer(case, dest) as c:
        got = _collect(c, len(sent), case.patience * 2, ack=True)
    assert {d.message_id for d in got} == {e.message_id for e in sent}
    position = {e.message_id: i for i, e in enumerate(sent)}
    for k in range(3):
        firsts: list[int] = []
        for d in got:
            if d.key == f"k{k}".encode() and position[d.message_id or ""] not in firsts:
                firsts.append(position[d.message_id or ""])
        assert firsts == sorted(firsts), f"key k{k}: first arrivals out of order"


# --- what each store declares (msgsafe.ports.StoreCapabilities) ----------------------------

_STORE_SEAMS: dict[str, type] = {
    "claim_rows": RowClaimingStore,
    "put_batch_async": BatchPutStore,
    "transactional": TransactionalStore,
    "release": ReleasingStore,
    "pending": CountingStore,
    "notify": NotifyingStore,
    "renew": RenewingStore,
}


def _ids(envelopes: Any) -> list[str]:
    return [e.message_id for e in envelopes]


def test_a_store_declares_exactly_the_seams_it_offers(store: OutboxStore) -> None:
    caps = store.capabilities
    assert isinstance(caps, StoreCapabilities)
    assert store.capabilities == caps
    seams = {name: value for name, value in asdict(caps).items() if name != "lease_s"}
    assert set(seams) == set(_STORE_SEAMS)
    assert seams == {name: isinstance(store, seam) for name, seam in _STORE_SEAMS.items()}
    # Not a seam: the longest lease the store grants, where it caps leases.
    assert caps.lease_s is None or caps.lease_s > 0


def test_a_store_that_caps_leases_declares_its_cap(
    store_case: StoreCase, store: OutboxStore
) -> None:
    """PostgreSQL's store caps every lease (rows come back to other processes when a
    forwarder dies): it declares the cap, which a Forwarder then times its rounds by."""
    expected = {"postgres": 10.0}.get(store_case.name)
    assert store.capabilities.lease_s == expected


def test_claim_rows_as_declared_follows_keys_in_flight(store: OutboxStore) -> None:
    """``claim_rows``: a claim as ``claim`` makes it (a prefix of each key's queue, nothing
    past a leased head), and one that continues the keys the caller holds in flight."""
    if not store.capabilities.claim_rows:
        assert not isinstance(store, RowClaimingStore)
        return
    seam = cast(RowClaimingStore, store)
    sent = [Envelope.build("q", b"%d" % i, key="k") for i in range(6)]
    store.put(sent)
    first = seam.claim_rows(limit=3, lease_s=30)
    assert _ids(first) == _ids(sent[:3]) and [e.body for e in first] == [b"0", b"1", b"2"]
    assert list(seam.claim_rows(limit=3, lease_s=30)) == []  # the head is leased
    assert _ids(seam.claim_rows(limit=3, lease_s=30, follow={b"k": 3})) == _ids(sent[3:])


def test_put_batch_async_as_declared_stores_what_put_would(store: OutboxStore) -> None:
    """``put_batch_async``: every message of the batch, as ``put`` stores its envelopes,
    durable once the future resolves."""
    if not store.capabilities.put_batch_async:
        assert not isinstance(store, BatchPutStore)
        return
    batch = Batch.build("q", [b"a", b"b", b"c"], keys=["k", None, "k"], headers={"h": "1"})
    assert cast(BatchPutStore, store).put_batch_async(batch).result(10) is None
    claimed = store.claim(limit=10, lease_s=30)
    expected = [batch.envelope(i) for i in range(3)]
    # Each key's messages in batch order; a store may keep a key's together.
    for key in (b"k", None):
        assert [(e.message_id, e.body, dict(e.headers)) for e in claimed if e.key == key] == [
            (e.message_id, e.body, dict(e.headers)) for e in expected if e.key == key
        ]
    assert len(claimed) == 3


def test_transactional_as_declared(
    store_case: StoreCase, store: OutboxStore, memory_broker: MemoryBroker
) -> None:
    """``transactional``: ``put_in`` writes inside the caller's transaction (a rollback
    leaves nothing, a commit the rows). Undeclared, ``send(transaction=...)`` raises
    ConfigurationError."""
    if not store.capabilities.transactional:
        with (
            Producer(f"memory://{memory_broker.name}", outbox=store) as p,
            pytest.raises(ConfigurationError, match="transactional"),
        ):
            p.send("q", b"x", transaction=object())
        assert memory_broker.count("q") == 0
        return
    assert store_case.connect is not None, f"{store_case.name} is transactional: give connect"
    seam = cast(TransactionalStore, store)
    sent = [Envelope.build("q", b"%d" % i, key="k") for i in range(4)]
    with store_case.connect() as conn:
        seam.put_in(conn, sent[:2])
        conn.rollback()
        seam.put_in(conn, sent[2:])
        conn.commit()
    assert _ids(store.claim(limit=10, lease_s=30)) == _ids(sent[2:])


def test_release_as_declared(store: OutboxStore) -> None:
    """``release``: leased messages are ready again at ``retry_at``, kept in the store."""
    if not store.capabilities.release:
        assert not isinstance(store, ReleasingStore)
        return
    seam = cast(ReleasingStore, store)
    sent = [Envelope.build("q", b"%d" % i) for i in range(3)]
    store.put(sent)
    assert _ids(store.claim(limit=3, lease_s=30)) == _ids(sent)
    seam.release([(e.message_id, "later") for e in sent[:2]], retry_at=time.time() + 3600)
    seam.release([(sent[2].message_id, "now")], retry_at=0.0)
    assert _ids(store.claim(limit=3, lease_s=30)) == _ids(sent[2:])
    assert store.stats().depth == 3


def test_renew_as_declared_fences_a_claim_another_claimer_took_over(
    store_case: StoreCase, store: OutboxStore
) -> None:
    """``renew``: a claim still held is renewed. Once another claimer (another process of
    a fleet) took its rows over after the lease ran out, renew says the claim is lost,
    and the first claimer's late settling (a delete, a release) leaves the rows to the
    new one: still there, still leased."""
    if not store.capabilities.renew:
        assert not isinstance(store, RenewingStore)
        return
    assert store_case.same is not None
    seam = cast(RenewingStore, store)
    sent = [Envelope.build("q", b"%d" % i, key="k") for i in range(4)]
    store.put(sent)
    mine = _ids(store.claim(limit=4, lease_s=0.3))
    assert mine == _ids(sent)
    assert seam.renew(mine, lease_s=0.3)
    other = store_case.same(store)
    try:
        taken: list[str] = []

        def take() -> bool:
            taken.extend(_ids(other.claim(limit=4, lease_s=30)))
            return bool(taken)

        wait_until(take, 10, "the other claimer to take the key once the lease ran out")
        assert taken == mine
        assert not seam.renew(mine, lease_s=30)
        store.delivered(mine)
        seam_release = cast(ReleasingStore, store) if store.capabilities.release else None
        if seam_release is not None:
            seam_release.release([(i, "late") for i in mine], retry_at=0.0)
        store.failed(mine[0], error="late", retry_at=None)
        assert store.stats().depth == 4 and store.stats().quarantined == 0
        assert other.claim(limit=4, lease_s=30) == []  # the other's lease still runs
        other.delivered(taken)
        assert store.stats().depth == 0
    finally:
        other.close()


def test_pending_as_declared_counts_what_waits(store: OutboxStore) -> None:
    """``pending``: ``stats().depth``, quarantined messages not counted."""
    if not store.capabilities.pending:
        assert not isinstance(store, CountingStore)
        return
    seam = cast(CountingStore, store)
    sent = [Envelope.build("q", b"%d" % i) for i in range(5)]
    store.put(sent)
    assert seam.pending() == store.stats().depth == 5
    claimed = store.claim(limit=5, lease_s=30)
    store.delivered(_ids(claimed[:2]))
    store.failed(claimed[2].message_id, error="poison", retry_at=None)
    assert seam.pending() == store.stats().depth == 2


def test_notify_as_declared_wakes_the_listener_on_another_store_s_put(
    store_case: StoreCase, store: OutboxStore
) -> None:
    """``notify``: ``listen(wake)`` calls ``wake`` once it listens, and again after a put
    committed by another store of the same table (another process of a fleet) and after
    one of its own."""
    if not store.capabilities.notify:
        assert not isinstance(store, NotifyingStore)
        return
    assert store_case.same is not None, f"{store_case.name} notifies: give same"
    woken = threading.Semaphore(0)
    cast(NotifyingStore, store).listen(woken.release)
    assert woken.acquire(timeout=30), "no wake-up once it listened"
    other = store_case.same(store)
    try:
        other.put([Envelope.build("q", b"theirs")])
        assert woken.acquire(timeout=30), "no wake-up for another store's put"
        while woken.acquire(timeout=0):
            pass  # a reconnect's wake-up may have come too: count from an empty slate
        store.put([Envelope.build("q", b"mine")])
        assert woken.acquire(timeout=30), "no wake-up for its own put"
    finally:
        other.close()
    assert store.stats().depth == 2


def test_a_store_is_drained_through_the_forwarder_in_key_order(
    store: OutboxStore, memory_broker: MemoryBroker
) -> None:
    """Whatever the store declares, the forwarder claims, releases and counts through it
    (claim_rows, release, pending where declared, the required methods otherwise): a
    refusal mid-way is re-sent from its key's first failure, every message arrives, in
    key order."""
    sent = [Envelope.build("q", b"%d" % i, key=f"k{i % 3}") for i in range(120)]
    store.put(sent)
    transport = open_transport(parse_url(f"memory://{memory_broker.name}"), {})
    try:
        fwd = Forwarder(store, transport, batch=25)
        memory_broker.refuse_writes()
        assert fwd.step() == 25  # refused at once: the round is released, unsent
        assert fwd.stats().retried == 25 and fwd.stats().refusing
        memory_broker.accept_writes()
        assert fwd.drain(30) == 0
    finally:
        transport.close(5)
    got = memory_broker.messages("q")
    assert sorted(_ids(got)) == sorted(_ids(sent))
    for k in range(3):
        seq = [int(e.body) for e in got if e.key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} out of order"
