"""Capabilities are declared, not probed (msgsafe/ports.py).

Outside ports.py — whose ``transport_capabilities`` and ``store_capabilities`` are the one
documented fallback — no module of the package looks at a transport or a store for what
it offers: no ``getattr``/``hasattr`` of a capability's name, no ``isinstance`` against an
optional seam's Protocol, no ``__getattr__`` forwarding on a transport wrapper. And the
layers above trust the record both ways: an undeclared method is never called, even
when the object has it; a declared one is used.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import msgsafe.producer
from msgsafe import Producer, Status
from msgsafe.cli.outbox import _LoginGuard
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, InvalidMessage
from msgsafe.message import Batch, Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox, open_store
from msgsafe.ports import (
    BatchReport,
    OutboxStats,
    PublishCallback,
    StoreCapabilities,
    Transport,
    TransportCapabilities,
    is_outbox_store,
    store_capabilities,
    transport_capabilities,
)

PACKAGE = Path(__file__).resolve().parents[2] / "msgsafe"

#: What a probe would look for: the record itself, the methods its flags promise and the
#: properties of the wire it declares. (Not the flags "batch" and "callback": words too
#: common to tell a probe from, say, a receipt's batch.)
CAPABILITY_NAMES = {
    "capabilities",
    "publish_callback",
    "publish_batch",
    "hurry",
    "listen_errors",
    "open_fast_path",
    "tombstones",
    "ordered_rounds",
    "claim_rows",
    "put_batch_async",
    "put_in",
    "transactional",
    "release",
    "pending",
    "notify",
    "listen",
    "renew",
}
#: The optional seams' Protocols: an isinstance against one is a probe.
SEAM_PROTOCOLS = {
    "CallbackTransport",
    "BatchTransport",
    "HurryingTransport",
    "ErrorListeningTransport",
    "FastPathTransport",
    "RowClaimingStore",
    "BatchPutStore",
    "TransactionalStore",
    "ReleasingStore",
    "CountingStore",
    "NotifyingStore",
    "RenewingStore",
}


def _probes(tree: ast.AST, *, wraps_clients: bool = False) -> Iterator[tuple[int, str]]:
    """The probes in ``tree``. ``wraps_clients``: a module of msgsafe.compat, whose
    classes with ``publish`` and ``__getattr__`` stand in for a third-party client's
    object (kombu's producer for Celery), not for a transport: not counted."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if (
                node.func.id in {"getattr", "hasattr"}
                and len(args) >= 2
                and isinstance(args[1], ast.Constant)
                and args[1].value in CAPABILITY_NAMES
            ):
                yield node.lineno, f"{node.func.id}(..., {args[1].value!r})"
            if node.func.id == "isinstance" and len(args) == 2:
                names = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
                for name in names:
                    seam = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "")
                    if seam in SEAM_PROTOCOLS:
                        yield node.lineno, f"isinstance(..., {seam})"
        if isinstance(node, ast.ClassDef) and not wraps_clients:
            methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            if "publish" in methods and "__getattr__" in methods:
                yield node.lineno, f"class {node.name}: __getattr__ forwarding on a transport"


def test_no_module_but_ports_probes_a_transport_or_a_store() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "ports.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        compat = PACKAGE / "compat" in path.parents
        for line, what in _probes(tree, wraps_clients=compat):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert not found, (
        "read the declared record instead (msgsafe.ports.transport_capabilities / "
        "store_capabilities, once, at construction):\n" + "\n".join(found)
    )


def test_the_guard_sees_each_kind_of_probe() -> None:
    """The guard above finds what it is meant to find (it would pass on anything else)."""
    source = """
getattr(t, "publish_batch", None)
hasattr(store, "claim_rows")
isinstance(t, ports.BatchTransport)
isinstance(s, (int, CountingStore))
getattr(t, "unrelated", None)
class Wrapper:
    def publish(self, envelope): ...
    def __getattr__(self, name): ...
"""
    assert [what for _, what in sorted(_probes(ast.parse(source)))] == [
        "getattr(..., 'publish_batch')",
        "hasattr(..., 'claim_rows')",
        "isinstance(..., BatchTransport)",
        "isinstance(..., CountingStore)",
        "class Wrapper: __getattr__ forwarding on a transport",
    ]


# --- the record, trusted both ways ----------------------------------------------------------


class TemptingTransport:
    """Has every optional method, each recording its calls, and confirms at once; what it
    declares is up to the test."""

    def __init__(self, capabilities: TransportCapabilities) -> None:
        self.capabilities = capabilities
        self.calls: list[str] = []
        self.published: list[Envelope] = []
        self._lock = threading.Lock()

    @property
    def target(self) -> str:
        return "tempting://"

    def _note(self, name: str, *envelopes: Envelope) -> None:
        with self._lock:
            self.calls.append(name)
            self.published.extend(envelopes)

    def publish(self, envelope: Envelope) -> Future[None]:
        self._note("publish", envelope)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        self._note("publish_callback", envelope)
        callback(None)

    def publish_batch(self, batch: Batch, report: BatchReport) -> None:
        self._note("publish_batch", *(batch.envelope(i) for i in range(len(batch))))
        report.confirmed(len(batch))

    def hurry(self, done: Future[Any], timeout: float) -> None:
        self._note("hurry")

    def listen_errors(self, listener: Any) -> None:
        self._note("listen_errors")

    def close(self, timeout: float | None = None) -> None:
        pass


class BareTransport:
    """A transport written before capabilities existed: no ``capabilities`` at all."""

    def __init__(self) -> None:
        self.published: list[Envelope] = []

    @property
    def target(self) -> str:
        return "bare://"

    def publish(self, envelope: Envelope) -> Future[None]:
        self.published.append(envelope)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def close(self, timeout: float | None = None) -> None:
        pass


def _producer(monkeypatch: pytest.MonkeyPatch, transport: object, **kwargs: Any) -> Producer:
    monkeypatch.setattr(msgsafe.producer, "open_transport", lambda url, options: transport)
    return Producer("memory://tempting", require="any", **kwargs)


def _exercise(producer: Producer) -> None:
    assert producer.send("q", b"one", key="k").status is Status.CONFIRMED
    assert producer.send_batch("q", [b"a", b"b"], keys=["k", None]).confirmed == 2
    producer.hurry(producer.send_async("q", b"two"), 1.0)
    producer.listen_errors(None)


def test_an_undeclared_method_is_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = TemptingTransport(TransportCapabilities())
    with _producer(monkeypatch, transport, outbox=False) as producer:
        _exercise(producer)
        assert producer.listen_errors(None) is False
        with pytest.raises(InvalidMessage, match="tombstone"):
            producer.send("q", None)
    assert set(transport.calls) == {"publish"}
    assert [e.body for e in transport.published] == [b"one", b"a", b"b", b"two"]


def test_a_declared_method_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    everything = TransportCapabilities(
        callback=True, batch=True, hurry=True, tombstones=True, listen_errors=True
    )
    transport = TemptingTransport(everything)
    with _producer(monkeypatch, transport, outbox=False) as producer:
        _exercise(producer)
        assert producer.listen_errors(None) is True
        assert producer.send("q", None).status is Status.CONFIRMED
    # A blocking send hurries its one message; so does the caller of hurry().
    assert transport.calls == [
        "publish_callback",
        "hurry",
        "publish_batch",
        "publish_callback",
        "hurry",
        "listen_errors",
        "listen_errors",
        "publish_callback",
        "hurry",
    ]
    assert transport.published[-1].tombstone


def test_a_transport_without_a_record_declares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = BareTransport()
    assert transport_capabilities(transport) == TransportCapabilities()
    with _producer(monkeypatch, transport, outbox=False) as producer:
        assert producer.send("q", b"x").status is Status.CONFIRMED
        assert producer.send_batch("q", [b"a", b"b"]).confirmed == 2
    assert len(transport.published) == 3


def test_a_record_of_the_wrong_type_is_refused() -> None:
    transport = TemptingTransport(TransportCapabilities())
    transport.capabilities = {"batch": True}  # type: ignore[assignment]
    with pytest.raises(TypeError, match="TransportCapabilities"):
        transport_capabilities(transport)
    with pytest.raises(TypeError, match="StoreCapabilities"):
        store_capabilities(transport)


class UndeclaringStore:
    """A SqliteOutbox behind the required methods only, written before capabilities
    existed: it has the optional methods (they record their calls) but no record."""

    def __init__(self, inner: SqliteOutbox) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def put(self, envelopes: Any) -> None:
        self._inner.put(envelopes)

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        return self._inner.claim(limit=limit, lease_s=lease_s)

    def delivered(self, ids: Any) -> None:
        self._inner.delivered(ids)

    def failed(self, message_id: str, *, error: str, retry_at: float | None) -> None:
        self._inner.failed(message_id, error=error, retry_at=retry_at)

    def has_key(self, key: bytes) -> bool:
        return self._inner.has_key(key)

    def stats(self) -> OutboxStats:
        return self._inner.stats()

    def close(self) -> None:
        self._inner.close()

    def claim_rows(self, **kwargs: Any) -> Any:
        self.calls.append("claim_rows")
        return self._inner.claim_rows(**kwargs)

    def release(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("release")
        self._inner.release(*args, **kwargs)

    def pending(self) -> int:
        self.calls.append("pending")
        return self._inner.pending()

    def put_batch_async(self, batch: Batch) -> Future[None]:
        self.calls.append("put_batch_async")
        return self._inner.put_batch_async(batch)


def test_a_store_without_a_record_serves_through_its_required_methods(tmp_path: Path) -> None:
    """Accepted as an outbox (its record missing), and used through the required
    methods only: the forwarder claims, releases and counts without the optional ones."""
    store = UndeclaringStore(SqliteOutbox(tmp_path / "o.db"))
    assert is_outbox_store(store) and not is_outbox_store(object())
    assert open_store(store, parse_url("memory://x")) is store  # type: ignore[arg-type]
    assert store_capabilities(store) == StoreCapabilities()
    sent = [Envelope.build("q", b"%d" % i, key="k") for i in range(30)]
    store.put(sent)
    refusing = [True]

    class Refusing(TemptingTransport):
        def publish(self, envelope: Envelope) -> Future[None]:
            if refusing[0]:
                refusing[0] = False
                from msgsafe.errors import Refused

                future: Future[None] = Future()
                future.set_exception(Refused("busy"))
                return future
            return super().publish(envelope)

    transport = Refusing(TransportCapabilities(ordered_rounds=True))
    forwarder = Forwarder(store, transport, batch=10)  # type: ignore[arg-type]
    assert forwarder.drain(30) == 0
    assert store.calls == []
    assert [e.body for e in transport.published] == [b"%d" % i for i in range(30)]
    store.close()


def test_the_login_guard_declares_the_wire_and_no_seam() -> None:
    """msgsafe outbox drain's wrapper: every message through its own publish (no batch,
    no callback), what the wrapped wire does still declared."""
    inner = TemptingTransport(
        TransportCapabilities(
            callback=True,
            batch=True,
            hurry=True,
            tombstones=True,
            ordered_rounds=True,
            listen_errors=True,
        )
    )
    guard = _LoginGuard(inner)
    assert isinstance(guard, Transport)
    assert guard.capabilities == TransportCapabilities(tombstones=True, ordered_rounds=True)
    assert guard.target == inner.target
    assert guard.publish(Envelope.build("q", b"x")).result(1) is None
    assert inner.calls == ["publish"]


def test_a_transactional_send_needs_a_store_that_declares_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    transport = TemptingTransport(TransportCapabilities())
    with (
        _producer(monkeypatch, transport, outbox=tmp_path / "o.db") as producer,
        pytest.raises(ConfigurationError, match="transactional outbox"),
    ):
        producer.send("q", b"x", transaction=object())
    assert transport.calls == []


class ListeningStore(UndeclaringStore):
    """An UndeclaringStore with ``listen`` (recording its calls), declaring ``notify`` or
    nothing as the test says."""

    def __init__(self, inner: SqliteOutbox, capabilities: StoreCapabilities | None) -> None:
        super().__init__(inner)
        if capabilities is not None:
            self.capabilities = capabilities
        self.woken_by: list[Any] = []

    def listen(self, wake: Any) -> None:
        self.calls.append("listen")
        self.woken_by.append(wake)


@pytest.mark.parametrize("declared", [True, False])
def test_a_forwarder_listens_exactly_when_the_store_declares_notify(
    tmp_path: Path, declared: bool
) -> None:
    """``notify`` declared: the first start() has the store wake the forwarder (once,
    however often it is started); undeclared, ``listen`` is never called."""
    store = ListeningStore(
        SqliteOutbox(tmp_path / "o.db"), StoreCapabilities(notify=True) if declared else None
    )
    forwarder = Forwarder(store, TemptingTransport(TransportCapabilities()))  # type: ignore[arg-type]
    assert store.calls == []  # not before the thread starts
    try:
        forwarder.start()
        forwarder.stop(5)
        forwarder.start()
    finally:
        forwarder.stop(5)
        store.close()
    assert store.calls == (["listen"] if declared else [])
    if declared:
        assert store.woken_by == [forwarder.wake]


def test_a_producer_that_does_not_forward_does_not_listen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = ListeningStore(SqliteOutbox(tmp_path / "o.db"), StoreCapabilities(notify=True))
    transport = TemptingTransport(TransportCapabilities())
    with _producer(monkeypatch, transport, outbox=store, forward=False):
        pass
    assert store.calls == []
    store = ListeningStore(SqliteOutbox(tmp_path / "p.db"), StoreCapabilities(notify=True))
    with _producer(monkeypatch, transport, outbox=store) as producer:
        assert store.calls == ["listen"]
        assert producer.send("q", b"x").status is Status.CONFIRMED


class LeaseCappingStore(UndeclaringStore):
    """An UndeclaringStore that records the lease of each claim and declares a cap."""

    def __init__(self, inner: SqliteOutbox, lease_s: float | None) -> None:
        super().__init__(inner)
        self.capabilities = StoreCapabilities(lease_s=lease_s)
        self.leases: list[float] = []

    def claim(self, *, limit: int, lease_s: float) -> list[Envelope]:
        self.leases.append(lease_s)
        return super().claim(limit=limit, lease_s=lease_s)


@pytest.mark.parametrize(
    ("cap", "asked", "claimed"),
    [(None, None, 30.0), (None, 45.0, 45.0), (5.0, None, 5.0), (5.0, 30.0, 5.0), (5.0, 2.0, 2.0)],
)
def test_a_forwarder_claims_with_the_lease_the_store_grants(
    tmp_path: Path, cap: float | None, asked: float | None, claimed: float
) -> None:
    """A store that caps leases (``StoreCapabilities.lease_s``, as PostgreSQL's does)
    gives rows back to other claimers when its cap ends: the forwarder claims, and times
    its rounds, with the shorter of the cap and its own lease (30 s unless asked)."""
    store = LeaseCappingStore(SqliteOutbox(tmp_path / "o.db"), cap)
    transport = TemptingTransport(TransportCapabilities())
    forwarder = Forwarder(store, transport, lease_s=asked)  # type: ignore[arg-type]
    try:
        store.put([Envelope.build("q", b"x")])
        forwarder.drain(10)
    finally:
        store.close()
    assert store.leases and set(store.leases) == {claimed}
    assert len(transport.published) == 1
