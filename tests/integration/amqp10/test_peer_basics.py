"""The AMQP 1.0 adapter against the proton test peer: outcomes, flow, settlement, TLS."""

from __future__ import annotations

import gc
import os
import socket
import time

import pytest

from msgsafe.adapters import open_receiver, open_transport
from msgsafe.adapters.amqp10 import Amqp10Receiver, Amqp10Transport
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    CertificateError,
    ConfigurationError,
    ConfirmTimeout,
    ConnectError,
    MessageTooLarge,
    Refused,
    Rejected,
)
from msgsafe.message import Envelope
from msgsafe.ports import Receiver, Transport
from tests.fixtures.amqp10 import PeerFactory, TlsFiles
from tests.integration.amqp10._tally import wait_until
from tests.support.amqp10_peer import stored_count

pytestmark = pytest.mark.integration


def _transport(url: str, **options: object) -> Amqp10Transport:
    transport = open_transport(parse_url(url), options)
    assert isinstance(transport, Amqp10Transport)
    return transport


def _receiver(url: str, **options: object) -> Amqp10Receiver:
    receiver = open_receiver(parse_url(url), options)
    assert isinstance(receiver, Amqp10Receiver)
    return receiver


def test_protocols_are_implemented(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    with (
        _transport(f"amqp10://127.0.0.1:{peer.port}") as t,
        _receiver(f"amqp10://127.0.0.1:{peer.port}") as r,
    ):
        assert isinstance(t, Transport)
        assert isinstance(r, Receiver)
        assert t.target == f"amqp10://127.0.0.1:{peer.port}"


def test_accepted_message_round_trips_with_id_key_and_headers(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{peer.port}"
    env = Envelope.build("orders", b"\x00payload", key="k1", headers={"trace": "abc"})
    with _transport(url) as t:
        t.publish(env).result(10)
    assert stored_count(amqp10_peers.store(), "orders") == 1
    with _receiver(url) as r:
        r.subscribe("orders")
        [got] = r.receive(max_messages=10, timeout=10)
        assert got.message_id == env.message_id
        assert got.body == b"\x00payload"
        assert got.key == b"k1"
        assert dict(got.headers) == {"trace": "abc"}
        assert got.destination == "orders"
        got.ack()
        wait_until(lambda: stored_count(amqp10_peers.store()) == 0, 10, "the ack to remove it")


def test_outcomes_map_to_typed_errors(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    with _transport(f"amqp10://127.0.0.1:{peer.port}", confirm_timeout=1.0) as t:
        rejected = t.publish(Envelope.build("reject/orders", b"x")).exception(10)
        assert isinstance(rejected, Rejected)
        assert rejected.condition is not None
        assert "amqp:precondition-failed" in rejected.condition
        released = t.publish(Envelope.build("release/orders", b"x")).exception(10)
        assert isinstance(released, Refused) and "released" in str(released)
        modified = t.publish(Envelope.build("modify/orders", b"x")).exception(10)
        assert isinstance(modified, Refused) and "modified" in str(modified)
        started = time.monotonic()
        silent = t.publish(Envelope.build("silent/orders", b"x")).exception(10)
        assert isinstance(silent, ConfirmTimeout) and silent.maybe_delivered
        assert time.monotonic() - started < 2.0
        # The connection is still good after every refusal.
        t.publish(Envelope.build("orders", b"ok")).result(10)


def test_unreachable_broker_fails_within_confirm_timeout() -> None:
    from msgsafe.cluster._process import free_port

    port = free_port()  # nobody listens there
    with _transport(f"amqp10://127.0.0.1:{port}", confirm_timeout=1.0) as t:
        started = time.monotonic()
        err = t.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, ConnectError) and not err.maybe_delivered
        assert time.monotonic() - started < 2.0


def test_oversized_message_is_refused_before_sending(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    with _transport(f"amqp10://127.0.0.1:{peer.port}", max_message_size=10) as t:
        err = t.publish(Envelope.build("orders", b"x" * 11)).exception(1)
        assert isinstance(err, MessageTooLarge)


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="credits"):
        open_transport(parse_url("amqp10://127.0.0.1:1"), {"credits": 5})
    with pytest.raises(ConfigurationError, match="failover_merge"):
        open_transport(parse_url("amqp10://127.0.0.1:1?failover_merge=sometimes"), {})


def test_credit_window_bounds_unsettled_deliveries(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{peer.port}"
    with _transport(url) as t:
        for f in [t.publish(Envelope.build("orders", b"m")) for _ in range(30)]:
            f.result(10)
    with _receiver(url, credit=5) as r:
        r.subscribe("orders")
        held = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            held += r.receive(max_messages=100, timeout=0.1)
        assert len(held) == 5, "credit must bound deliveries not yet settled"
        for d in held:
            d.ack()
        more = []
        wait_until(
            lambda: bool(more.extend(r.receive(max_messages=100, timeout=0.05)) or len(more) >= 5),
            10,
            "credit to be topped up after settling",
        )
        assert len(more) == 5
        for d in more:
            d.ack()


def test_nack_requeues_and_reject_discards(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{peer.port}"
    with _transport(url) as t:
        first = Envelope.build("jobs", b"1")
        second = Envelope.build("jobs", b"2")
        t.publish(first).result(10)
        t.publish(second).result(10)
    with _receiver(url) as r:
        r.subscribe("jobs")
        batch = []
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
        assert again.redelivered
        again.ack()
    wait_until(lambda: stored_count(amqp10_peers.store()) == 0, 10, "the queue to empty")


def test_tls_verifies_the_peer_name(amqp10_peers: PeerFactory, amqp10_tls: TlsFiles) -> None:
    peer = amqp10_peers.start(tls=amqp10_tls)
    url = f"amqp10s://localhost:{peer.port}"
    with _transport(url, tls_ca_file=str(amqp10_tls.ca)) as t:
        t.publish(Envelope.build("orders", b"over tls")).result(10)
    # Not trusted (system CAs only): refused for good (no retry can fix it), nothing sent.
    with _transport(url, confirm_timeout=1.0) as t:
        err = t.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, CertificateError), repr(err)
    # Explicit opt-out.
    with _transport(url, tls_verify=False) as t:
        t.publish(Envelope.build("orders", b"unverified")).result(10)
    assert stored_count(amqp10_peers.store(), "orders") == 2


def test_silent_listener_is_skipped_after_connect_timeout(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    with socket.socket() as hole:  # accepts TCP (backlog) but never speaks AMQP
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"amqp10://127.0.0.1:{hole.getsockname()[1]},127.0.0.1:{peer.port}"
        started = time.monotonic()
        with _transport(url, connect_timeout=0.5, confirm_timeout=10.0) as t:
            t.publish(Envelope.build("orders", b"x")).result(15)
            assert t.history[-1].port == peer.port
        assert time.monotonic() - started < 5.0


def test_closed_transports_and_receivers_release_their_descriptors(
    amqp10_peers: PeerFactory,
) -> None:
    peer = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{peer.port}"

    def cycle() -> None:
        with _transport(url) as t:
            t.publish(Envelope.build("fd", b"x")).result(10)
        with _receiver(url) as r:
            r.subscribe("fd")
            for d in r.receive(max_messages=1, timeout=10):
                d.ack()

    cycle()  # imports, caches
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        cycle()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2
