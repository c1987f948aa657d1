"""msgsafe.compat.proton without a broker: URLs to one msgsafe URL, a proton ``Message``
to an envelope, and ``BlockingSender.send`` against the memory broker (returns once
accepted or stored, within its timeout; proton's exceptions for a failed message)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import proton
import proton.utils
import pytest

from msgsafe.compat import CompatWarning
from msgsafe.compat import proton as compat
from msgsafe.compat._proton_send import envelope_of, msgsafe_url, send_error, set_fields
from msgsafe.errors import (
    ClosedError,
    ConfigurationError,
    ConnectError,
    InvalidMessage,
    OutboxFull,
    Rejected,
    Unroutable,
)
from msgsafe.message import Status
from msgsafe.testing import MemoryBroker


def _connection(
    broker: MemoryBroker, tmp_path: Path | None, *, timeout: float | None = None
) -> compat.BlockingConnection:
    outbox: object = False if tmp_path is None else tmp_path / "outbox.sqlite3"
    return compat.BlockingConnection(
        "amqp://127.0.0.1:1",
        timeout=timeout,
        outbox=outbox,  # type: ignore[arg-type]
        _url=f"memory://{broker.name}",
    )


# --- translation -------------------------------------------------------------------------------


def test_the_module_re_exports_proton_names() -> None:
    assert compat.Message is proton.Message
    assert compat.SendException is proton.utils.SendException
    assert compat.BlockingReceiver is proton.utils.BlockingReceiver
    assert compat.BlockingConnection is not proton.utils.BlockingConnection
    assert compat.__all__ == sorted(compat.__all__)


def test_urls_become_one_msgsafe_url() -> None:
    url, _ = msgsafe_url(["amqp://u:p%40w@h1:5673", "h2:5674", "h3"])
    assert url == "amqp10://u:p%40w@h1:5673,h2:5674,h3:5672"
    assert msgsafe_url(["amqps://h"])[0] == "amqp10s://h:5671"
    assert msgsafe_url(["h"], user="a", password="b")[0] == "amqp10://a:b@h:5672"
    with pytest.raises(ConfigurationError):
        msgsafe_url(["amqp://h1", "amqps://h2"])
    with pytest.raises(ConfigurationError):
        msgsafe_url([])


def test_body_id_and_properties_are_carried() -> None:
    msg = proton.Message(body=b"\x00raw", id="m-1", properties={"a": "x", "n": 3, "b": True})
    envelope = envelope_of("orders", msg)
    assert (envelope.destination, envelope.body, envelope.message_id) == (
        "orders",
        b"\x00raw",
        "m-1",
    )
    assert dict(envelope.headers) == {"a": "x", "n": "3", "b": "True"}
    text = envelope_of(None, proton.Message(body="é", address="q"))
    assert text.body == "é".encode() and text.destination == "q" and text.message_id
    with pytest.raises(InvalidMessage):
        envelope_of("q", proton.Message(body={"a": 1}))
    with pytest.raises(ValueError, match="address"):
        envelope_of(None, proton.Message(body=b"x"))


def test_fields_not_carried_are_named() -> None:
    assert set_fields(proton.Message(body=b"x")) == []
    msg = proton.Message(body=b"x", subject="s", correlation_id="c", ttl=5.0, priority=9)
    assert set(set_fields(msg)) == {"subject", "correlation_id", "ttl", "priority"}


def test_errors_map_to_proton_exceptions() -> None:
    rejected = send_error(Rejected("no"))
    assert isinstance(rejected, proton.utils.SendException)
    assert rejected.state == proton.Delivery.REJECTED
    assert send_error(Unroutable("gone")).state == proton.Delivery.REJECTED  # type: ignore[attr-defined]
    assert send_error(OutboxFull("full")).state == proton.Delivery.RELEASED  # type: ignore[attr-defined]
    assert send_error(ConnectError("down")).state == proton.Delivery.RELEASED  # type: ignore[attr-defined]
    assert isinstance(send_error(ClosedError("closed")), proton.ConnectionException)


# --- sending on the memory broker --------------------------------------------------------------


def test_send_is_accepted_and_returns_a_settled_outcome(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with _connection(memory_broker, tmp_path) as conn:
        sender = conn.create_sender("orders")
        sent = sender.send(proton.Message(body=b"one", properties={"k": "v"}))
        assert sent.remote_state == proton.Delivery.ACCEPTED and sent.settled
        assert sent.receipt is not None and sent.receipt.status is Status.CONFIRMED
        anonymous = conn.create_sender(None)
        anonymous.send(proton.Message(body=b"two", address="orders"))
    [one, two] = memory_broker.messages("orders")
    assert (one.body, one.headers["k"], two.body) == (b"one", "v", b"two")


def test_a_hanging_broker_costs_at_most_the_timeout_and_the_message_is_stored(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.delay_confirms(3.0)
    conn = _connection(memory_broker, tmp_path, timeout=1.0)
    try:
        sender = conn.create_sender("q")
        took = []
        for i in range(3):
            start = time.monotonic()
            sent = sender.send(proton.Message(body=b"%d" % i))
            took.append(time.monotonic() - start)
            assert sent.receipt is not None and sent.receipt.status is Status.STORED
        # Within the 1 s timeout, far from the 3 s the broker hangs; the slack is the
        # scheduler's on a loaded machine (the deadline itself is msgsafe's).
        assert max(took) < 1.5, took
        assert conn.producer.pending() >= 3
    finally:
        memory_broker.delay_confirms(0)
        conn.close()
    assert sorted({m.body for m in memory_broker.messages("q")}) == [b"0", b"1", b"2"]


def test_a_broker_that_refuses_stores_and_close_forwards(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    memory_broker.refuse_writes()
    conn = _connection(memory_broker, tmp_path)
    sender = conn.create_sender("q")
    statuses = [sender.send(proton.Message(body=b"%d" % i)).receipt for i in range(10)]
    assert {r.status for r in statuses if r is not None} == {Status.STORED}
    memory_broker.accept_writes()
    conn.close()
    assert sorted(int(m.body) for m in memory_broker.messages("q")) == list(range(10))


def test_a_rejected_message_raises_send_exception_unless_left_out_of_error_states(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with _connection(memory_broker, tmp_path) as conn:
        sender = conn.create_sender("q")
        memory_broker.reject_next(1)
        with pytest.raises(proton.utils.SendException) as caught:
            sender.send(proton.Message(body=b"bad"))
        assert caught.value.state == proton.Delivery.REJECTED
        memory_broker.reject_next(1)
        sent = sender.send(proton.Message(body=b"bad"), error_states=[])
        assert sent.remote_state == proton.Delivery.REJECTED and sent.receipt is None


def test_without_an_outbox_the_timeout_raises_proton_timeout(memory_broker: MemoryBroker) -> None:
    memory_broker.delay_confirms(1.0)
    conn = _connection(memory_broker, None)
    try:
        with pytest.raises(proton.Timeout):
            conn.create_sender("q").send(proton.Message(body=b"x"), timeout=0.2)
    finally:
        memory_broker.delay_confirms(0)
        conn.close()


def test_fields_not_carried_warn_once_per_sender(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with _connection(memory_broker, tmp_path) as conn:
        sender = conn.create_sender("q")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sender.send(proton.Message(body=b"x", subject="s"))
            sender.send(proton.Message(body=b"y", subject="s"))
        assert [w.category for w in caught] == [CompatWarning]
        assert "subject" in str(caught[0].message)


def test_closed_sender_and_connection_refuse(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    conn = _connection(memory_broker, tmp_path)
    sender = conn.create_sender("q")
    sender.close()
    with pytest.raises(proton.ConnectionException):
        sender.send(proton.Message(body=b"x"))
    conn.close()
    conn.close()  # idempotent, as proton's
    with pytest.raises(proton.ConnectionException):
        conn.create_sender("q")


def test_the_constructor_fails_as_proton_when_no_host_answers(tmp_path: Path) -> None:
    with pytest.raises((proton.ConnectionException, proton.Timeout)):
        compat.BlockingConnection("127.0.0.1:1", timeout=2, outbox=tmp_path / "o.db")


def test_lazy_stores_while_no_broker_answers(tmp_path: Path) -> None:
    conn = compat.BlockingConnection(
        ["127.0.0.1:1", "127.0.0.1:2"], outbox=tmp_path / "o.db", lazy=True
    )
    try:
        sent = conn.create_sender("q").send(proton.Message(body=b"kept"), timeout=5)
        assert sent.receipt is not None and sent.receipt.status is Status.STORED
        assert conn.producer.pending() == 1
    finally:
        conn.producer.close(1)


def test_direct_is_the_former_name_of_fast_path(tmp_path: Path) -> None:
    """``fast_path=False`` sends everything through the producer; ``direct`` still says
    so, warned."""
    hosts = ["127.0.0.1:1"]
    on = compat.BlockingConnection(hosts, outbox=tmp_path / "a.db", lazy=True)
    with pytest.warns(DeprecationWarning, match="fast_path"):
        off = compat.BlockingConnection(hosts, outbox=tmp_path / "b.db", lazy=True, direct=False)
    try:
        assert on._fast is not None and off._fast is None
        assert off.direct_sends == off.fast_sends == 0
    finally:
        on.producer.close(1)
        off.producer.close(1)
