"""The AMQP 1.0 adapter against a real broker, the session's ActiveMQ Artemis pair
(``artemis_pair``): round trip with id, key and headers, flow control, settlement,
a silent listener skipped, descriptors released."""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import uuid

import pytest

from msgsafe.adapters import open_transport
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, ConnectError, MessageTooLarge
from msgsafe.message import Delivery, Envelope
from msgsafe.ports import Receiver, Transport
from tests.integration.amqp10._open import receiver_for, transport_for
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _address(what: str) -> str:
    return f"basics.{what}.{uuid.uuid4().hex[:8]}"


def _left(url: str, address: str) -> list[Delivery]:
    """What a new receiver still gets from ``address`` within a second (released after)."""
    with receiver_for(url) as r:
        r.subscribe(address)
        got = r.receive(max_messages=10, timeout=1.0)
        for d in got:
            d.nack()
        return got


def test_protocols_are_implemented(artemis_pair: ArtemisCluster) -> None:
    url = artemis_pair.node_url(0)
    with transport_for(url) as t, receiver_for(url) as r:
        assert isinstance(t, Transport)
        assert isinstance(r, Receiver)
        assert t.target == f"amqp10://127.0.0.1:{artemis_pair.ports[0]}"


def test_accepted_message_round_trips_with_id_key_and_headers(
    artemis_pair: ArtemisCluster,
) -> None:
    url = artemis_pair.node_url(0)
    address = _address("orders")
    env = Envelope.build(address, b"\x00payload", key="k1", headers={"trace": "abc"})
    with transport_for(url) as t:
        t.publish(env).result(10)
    with receiver_for(url) as r:
        r.subscribe(address)
        [got] = r.receive(max_messages=10, timeout=10)
        assert got.message_id == env.message_id
        assert got.body == b"\x00payload"
        assert got.key == b"k1"
        assert dict(got.headers) == {"trace": "abc"}
        assert got.destination == address
        got.ack()
    assert _left(url, address) == [], "an acknowledged message came back"


def test_unreachable_broker_fails_within_confirm_timeout() -> None:
    from msgsafe.cluster._process import free_port

    port = free_port()  # nobody listens there
    with transport_for(f"amqp10://127.0.0.1:{port}", confirm_timeout=1.0) as t:
        started = time.monotonic()
        err = t.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, ConnectError) and not err.maybe_delivered
        assert time.monotonic() - started < 2.0


def test_oversized_message_is_refused_before_sending(artemis_pair: ArtemisCluster) -> None:
    with transport_for(artemis_pair.node_url(0), max_message_size=10) as t:
        err = t.publish(Envelope.build(_address("big"), b"x" * 11)).exception(1)
        assert isinstance(err, MessageTooLarge)


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="credits"):
        open_transport(parse_url("amqp10://127.0.0.1:1"), {"credits": 5})
    with pytest.raises(ConfigurationError, match="failover_merge"):
        open_transport(parse_url("amqp10://127.0.0.1:1?failover_merge=sometimes"), {})


def test_credit_window_bounds_unsettled_deliveries(artemis_pair: ArtemisCluster) -> None:
    url = artemis_pair.node_url(0)
    address = _address("credit")
    with transport_for(url) as t:
        for f in [t.publish(Envelope.build(address, b"m")) for _ in range(30)]:
            f.result(10)
    with receiver_for(url, credit=5) as r:
        r.subscribe(address)
        held = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            held += r.receive(max_messages=100, timeout=0.1)
        assert len(held) == 5, "credit must bound deliveries not yet settled"
        for d in held:
            d.ack()
        more: list[Delivery] = []
        wait_until(
            lambda: bool(more.extend(r.receive(max_messages=100, timeout=0.05)) or len(more) >= 5),
            10,
            "credit to be topped up after settling",
        )
        assert len(more) == 5
        for d in more:
            d.ack()


def test_nack_requeues_and_reject_discards(artemis_pair: ArtemisCluster) -> None:
    url = artemis_pair.node_url(0)
    address = _address("jobs")
    with transport_for(url) as t:
        first = Envelope.build(address, b"1")
        second = Envelope.build(address, b"2")
        t.publish(first).result(10)
        t.publish(second).result(10)
    with receiver_for(url) as r:
        r.subscribe(address)
        batch: list[Delivery] = []
        wait_until(
            lambda: bool(batch.extend(r.receive(max_messages=10, timeout=0.1)) or len(batch) >= 2),
            10,
            "two deliveries",
        )
        by_id = {d.message_id: d for d in batch}
        by_id[first.message_id].nack()  # released: comes back
        by_id[second.message_id].nack(requeue=False)  # rejected: gone
        [again] = r.receive(max_messages=10, timeout=10)
        assert again.message_id == first.message_id
        again.ack()
    assert _left(url, address) == [], "the rejected or the acknowledged message came back"


def test_silent_listener_is_skipped_after_connect_timeout(artemis_pair: ArtemisCluster) -> None:
    live = f"127.0.0.1:{artemis_pair.ports[0]}"
    with socket.socket() as hole:  # accepts TCP (backlog) but never speaks AMQP
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        base = f"amqp10://{artemis_pair.user}:{artemis_pair.password}@"
        url = f"{base}127.0.0.1:{hole.getsockname()[1]},{live}"
        started = time.monotonic()
        with transport_for(url, connect_timeout=0.5, confirm_timeout=10.0) as t:
            t.publish(Envelope.build(_address("silent"), b"x")).result(15)
            assert t.history[-1].port == artemis_pair.ports[0]
        assert time.monotonic() - started < 5.0


def test_closed_transports_and_receivers_release_their_descriptors(
    artemis_pair: ArtemisCluster,
) -> None:
    url = artemis_pair.node_url(0)
    address = _address("fd")

    def cycle() -> None:
        with transport_for(url) as t:
            t.publish(Envelope.build(address, b"x")).result(10)
        with receiver_for(url) as r:
            r.subscribe(address)
            for d in r.receive(max_messages=1, timeout=10):
                d.ack()

    cycle()  # imports, caches
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        cycle()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_redelivered_means_redelivered_on_artemis(artemis_pair: ArtemisCluster) -> None:
    """Artemis never sets first-acquirer (its default is false) and counts redeliveries
    in delivery-count: a first delivery is not redelivered, one after a nack is."""
    url = artemis_pair.node_url(0)
    address = _address("redelivered")
    with transport_for(url) as t:
        t.publish(Envelope.build(address, b"x")).result(10)
    with receiver_for(url) as r:
        r.subscribe(address)
        [first] = r.receive(max_messages=10, timeout=10)
        assert first.redelivered is False
        first.nack()
        [again] = r.receive(max_messages=10, timeout=10)
        assert again.message_id == first.message_id
        assert again.redelivered is True
        again.ack()


def test_deliveries_dropped_by_the_application_release_no_proton_object_there(
    artemis_pair: ArtemisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proton's reference counts are not thread-safe: a proton delivery released on the
    application's thread while the container thread runs can corrupt them and abort the
    process (a chaos run did). Ten deliveries are received, five acknowledged, and all
    dropped on this thread: no proton ``Delivery`` may be released here, the acknowledged
    ones are settled (not received again) and the others come back."""
    import proton._wrapper

    url = artemis_pair.node_url(0)
    address = _address("drop")
    with transport_for(url) as t:
        for i in range(10):
            t.publish(Envelope.build(address, b"%d" % i)).result(10)
    released_here: list[str] = []
    original = proton._wrapper.Wrapper.__del__

    def recording_del(self: proton._wrapper.Wrapper) -> None:
        if threading.get_ident() == main and type(self).__name__ == "Delivery":
            released_here.append(repr(self))
        original(self)

    main = threading.get_ident()
    gc.collect()  # what earlier tests left is not this test's
    monkeypatch.setattr(proton._wrapper.Wrapper, "__del__", recording_del)
    with receiver_for(url, credit=10) as r:
        r.subscribe(address)
        got: list[Delivery] = []
        wait_until(
            lambda: got.extend(r.receive(max_messages=10, timeout=0.5)) or len(got) == 10,
            30,
            "ten deliveries",
        )
        acked = {d.message_id for d in got[:5]}
        for d in got[:5]:
            d.ack()
        got.clear()
        del d
        gc.collect()
        assert released_here == [], "proton deliveries released on the application's thread"
    left: set[str | None] = set()
    with receiver_for(url) as r:
        r.subscribe(address)

        def five_back() -> bool:
            for d in r.receive(max_messages=10, timeout=0.5):
                left.add(d.message_id)
                d.ack()
            return len(left) >= 5

        wait_until(five_back, 30, "the five deliveries not acknowledged")
        assert not r.receive(max_messages=10, timeout=1.0), "an acknowledged one came back"
    assert not left & acked
