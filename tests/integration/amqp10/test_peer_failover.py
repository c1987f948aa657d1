"""Fail-over and session resume against killable proton test peers.

Why the peer: no real broker here can be made to send what these tests need: redirects
(Broker-J replicas close instead, Artemis never redirects), arbitrary or plain-TCP
advertised lists under TLS, a stale master's not-found on demand (the real-broker counts
are in ``test_sdk.py`` and ``tests/integration/cluster/``).

The peers of one test share a store, as the members of a Qpid HA group share their
queues: what one accepted, the others hold. Each test records every id sent, confirmed
and received and asserts ``lost == 0`` (confirmed, never received) and that every
duplicate carries a known id.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe.adapters.amqp10 import Amqp10Transport
from msgsafe.adapters.amqp10._failover import MAX_REDIRECTS
from msgsafe.endpoints import Endpoint, parse_url
from msgsafe.errors import TransientError, Unroutable
from msgsafe.message import Envelope
from tests.fixtures.amqp10 import PeerFactory, TlsFiles
from tests.integration.amqp10._open import receiver_for, transport_for
from tests.support.amqp10_peer import PeerProcess
from tests.support.ledger import Drain, Ledger
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _peer_at(peers: list[PeerProcess], endpoint: Endpoint) -> PeerProcess:
    return next(p for p in peers if p.port == endpoint.port)


def _publish_killing(
    transport: Amqp10Transport,
    ledger: Ledger,
    *,
    count: int,
    kill_after: int,
    victim: PeerProcess,
    destination: str = "orders",
) -> None:
    """Publish ``count`` messages; SIGKILL ``victim`` once ``kill_after`` are confirmed."""
    for i in range(count):
        env = Envelope.build(destination, b"%08d" % i + b"." * 92, key=f"k{i % 16}")
        ledger.track(env.message_id, transport.publish(env))
        if victim.alive and len(ledger.receipted) >= kill_after:
            victim.kill()
    assert not victim.alive, "the peer was never killed: too few confirmed before the end"


def _consume_all(url: str, ledger: Ledger, timeout: float = 60.0) -> None:
    with receiver_for(url, credit=500) as receiver:
        receiver.subscribe("orders")
        drain = Drain(receiver, ledger)
        drain.start()
        try:
            wait_until(lambda: not ledger.missing(), timeout, "every confirmed id to arrive")
        finally:
            drain.stop()


def test_url_host_list_10k_messages_connected_node_killed(amqp10_peers: PeerFactory) -> None:
    peers = [amqp10_peers.start() for _ in range(3)]
    url = "amqp10://" + ",".join(f"127.0.0.1:{p.port}" for p in peers)
    ledger = Ledger()
    with transport_for(url, confirm_timeout=30.0) as transport:
        assert transport.wait_connected(10)
        first = transport.history[0]
        victim = _peer_at(peers, first)
        _publish_killing(transport, ledger, count=10_000, kill_after=3_000, victim=victim)
        wait_until(lambda: ledger.resolved() == 10_000, 60, "every publish to resolve")
        history = transport.history
    survivors = [p for p in peers if p is not victim]
    _consume_all("amqp10://" + ",".join(f"127.0.0.1:{p.port}" for p in survivors), ledger)
    counts = ledger.counts("url-list failover")
    assert counts["lost"] == 0
    assert counts["unknown"] == 0
    assert counts["confirmed"] == 10_000, f"errors: {set(map(repr, ledger.failed.values()))}"
    assert len(history) >= 2 and history[-1] != first
    assert history[-1] in parse_url(url).endpoints, "moved on to another host from the URL"


def test_one_url_resumes_on_advertised_candidate(amqp10_peers: PeerFactory) -> None:
    backups = [amqp10_peers.start() for _ in range(2)]
    primary = amqp10_peers.start(advertise=[f"amqp://127.0.0.1:{p.port}" for p in backups])
    url = f"amqp10://127.0.0.1:{primary.port}"  # ONE host: the candidates come from the peer
    ledger = Ledger()
    with transport_for(url, confirm_timeout=30.0) as transport, receiver_for(url, credit=200) as rx:
        rx.subscribe("orders")
        assert transport.wait_connected(10) and rx.wait_connected(10)
        drain = Drain(rx, ledger)
        drain.start()
        try:
            _publish_killing(transport, ledger, count=5_000, kill_after=1_500, victim=primary)
            received_at_kill = ledger.counts()["received"]
            wait_until(lambda: ledger.resolved() == 5_000, 60, "every publish to resolve")
            wait_until(lambda: not ledger.missing(), 60, "the consumer to receive every id")
        finally:
            drain.stop()
        sender_history, receiver_history = transport.history, rx.history
    counts = ledger.counts("advertised-candidate resume")
    backup_ports = {p.port for p in backups}
    assert sender_history[0].port == primary.port and sender_history[-1].port in backup_ports
    assert receiver_history[0].port == primary.port and receiver_history[-1].port in backup_ports
    assert counts["received"] > received_at_kill, "the consumer kept receiving after the kill"
    assert counts["confirmed"] == 5_000, f"errors: {set(map(repr, ledger.failed.values()))}"
    assert counts["lost"] == 0
    assert counts["unknown"] == 0


def test_tls_connection_never_follows_a_plain_candidate(
    amqp10_peers: PeerFactory, amqp10_tls: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    plain = amqp10_peers.start()
    tls_backup = amqp10_peers.start(tls=amqp10_tls)
    primary = amqp10_peers.start(
        tls=amqp10_tls,
        advertise=[f"amqp://127.0.0.1:{plain.port}", f"amqps://localhost:{tls_backup.port}"],
    )
    url = f"amqp10s://localhost:{primary.port}"
    ledger = Ledger()
    caplog.set_level(logging.WARNING, logger="msgsafe.adapters.amqp10")
    with transport_for(url, tls_ca_file=str(amqp10_tls.ca), confirm_timeout=20.0) as transport:
        assert transport.wait_connected(10)
        refusals = [r for r in caplog.records if "downgrade" in r.getMessage()]
        assert refusals, "the refused plain candidate must be logged"
        assert f"127.0.0.1:{plain.port}" in refusals[0].getMessage()
        _publish_killing(transport, ledger, count=2_000, kill_after=500, victim=primary)
        wait_until(lambda: ledger.resolved() == 2_000, 60, "every publish to resolve")
        history = transport.history
    assert plain.connections == 0, "a plain-TCP candidate was followed from a TLS session"
    assert all(e.tls for e in history)
    assert history[-1].port == tls_backup.port
    assert all(isinstance(e, TransientError) for e in ledger.failed.values())
    _consume_all(f"amqp10://127.0.0.1:{plain.port}", ledger)  # same store, read in the clear
    counts = ledger.counts("tls downgrade refused")
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_tls_session_with_only_plain_candidates_fails_transiently(
    amqp10_peers: PeerFactory, amqp10_tls: TlsFiles
) -> None:
    plain = amqp10_peers.start()
    primary = amqp10_peers.start(tls=amqp10_tls, advertise=[f"amqp://127.0.0.1:{plain.port}"])
    url = f"amqp10s://localhost:{primary.port}"
    with transport_for(url, tls_ca_file=str(amqp10_tls.ca), confirm_timeout=2.0) as transport:
        transport.publish(Envelope.build("orders", b"before")).result(10)
        primary.kill()
        err = transport.publish(Envelope.build("orders", b"after")).exception(10)
        assert isinstance(err, TransientError)
    assert plain.connections == 0


def test_allow_list_and_ignore_policy(amqp10_peers: PeerFactory) -> None:
    outsider = amqp10_peers.start()
    primary = amqp10_peers.start(advertise=[f"amqp://127.0.0.1:{outsider.port}"])
    url = f"amqp10://127.0.0.1:{primary.port}"
    allow = transport_for(url, confirm_timeout=1.0, failover_allow=f"127.0.0.1:{primary.port}")
    ignore = transport_for(url, confirm_timeout=1.0, failover_merge="ignore")
    try:
        for transport in (allow, ignore):
            transport.publish(Envelope.build("orders", b"before")).result(10)
        primary.kill()
        for transport in (allow, ignore):
            err = transport.publish(Envelope.build("orders", b"after")).exception(10)
            assert isinstance(err, TransientError)
    finally:
        allow.close(0)
        ignore.close(0)
    assert outsider.connections == 0


def test_member_without_quorum_is_skipped(
    amqp10_peers: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A member that opens and closes at once (a Broker-J replica) is never counted as
    connected: it is not in the history, ``wait_connected`` stays False, and the
    broker's reason for the close is what the log says."""
    no_quorum = amqp10_peers.start(refuse=True)
    healthy = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{no_quorum.port},127.0.0.1:{healthy.port}"
    with transport_for(url, confirm_timeout=10.0) as transport:
        transport.publish(Envelope.build("orders", b"x")).result(15)
        assert [e.port for e in transport.history] == [healthy.port]
    caplog.set_level(logging.INFO, logger="msgsafe.adapters.amqp10")
    with transport_for(f"amqp10://127.0.0.1:{no_quorum.port}", confirm_timeout=1.0) as transport:
        err = transport.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, TransientError) and not err.maybe_delivered
        assert transport.history == () and not transport.wait_connected(0)
    assert any("is not active" in r.getMessage() for r in caplog.records), caplog.text


def test_not_found_from_a_stale_master_is_transient(amqp10_peers: PeerFactory) -> None:
    """A Broker-J master resumed after a pause refuses a new address (``amqp:not-found``)
    and then steps down (its connection closes): the refusal is not the address's fault.
    The messages stay queued and the next candidate confirms them, with their ids."""
    stale = amqp10_peers.start(stale=True)
    healthy = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{stale.port},127.0.0.1:{healthy.port}"
    ledger = Ledger()
    with transport_for(url, confirm_timeout=15.0) as transport:
        for i in range(100):
            env = Envelope.build("orders", b"%04d" % i, key=f"k{i % 4}")
            ledger.track(env.message_id, transport.publish(env))
        wait_until(lambda: ledger.resolved() == 100, 20, "100 outcomes")
        assert transport.history[-1].port == healthy.port
    _consume_all(f"amqp10://127.0.0.1:{healthy.port}", ledger)
    counts = ledger.counts("stale master")
    assert counts["failed"] == 0, f"errors: {set(map(repr, ledger.failed.values()))}"
    assert counts["confirmed"] == 100
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_not_found_from_a_healthy_connection_is_unroutable(amqp10_peers: PeerFactory) -> None:
    """The same refusal from a connection that stays up is the address's fault: after one
    more attach on that connection it is :class:`Unroutable` (permanent), while another
    address on the same connection is confirmed."""
    peer = amqp10_peers.start()
    with transport_for(f"amqp10://127.0.0.1:{peer.port}", confirm_timeout=15.0) as transport:
        missing = transport.publish(Envelope.build("missing/orders", b"x"))
        fine = transport.publish(Envelope.build("orders", b"y"))
        fine.result(10)
        err = missing.exception(10)
        assert isinstance(err, Unroutable), repr(err)
        assert [e.port for e in transport.history] == [peer.port], "never reconnected"


class _MuteListener:
    """A loopback port whose kernel completes TCP handshakes that nothing ever answers
    (what a SIGSTOPped broker is to a client); counts the connections it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self.sock.accept()[0])

    def close(self) -> None:
        for conn in [self.sock, *self.accepted]:
            conn.close()


def test_a_paused_node_costs_connect_timeout_once_not_on_every_pass(
    amqp10_peers: PeerFactory,
) -> None:
    """A node that accepts TCP and never answers is passed over after one timeout, so the
    next fail-over goes straight to a node that answers."""
    mute = _MuteListener()
    try:
        healthy = amqp10_peers.start()
        url = f"amqp10://127.0.0.1:{mute.port},127.0.0.1:{healthy.port}"
        with transport_for(url, confirm_timeout=20.0, connect_timeout=1.0) as transport:
            transport.publish(Envelope.build("orders", b"1")).result(15)
            assert len(mute.accepted) == 1, "the first pass tries the paused node once"
            port = healthy.port
            healthy.kill()
            healthy = amqp10_peers.start(port=port)
            wait_until(lambda: len(transport.history) == 2, 15, "a second connection")
            transport.publish(Envelope.build("orders", b"2")).result(15)
            assert [e.port for e in transport.history] == [port, port]
        assert len(mute.accepted) == 1, "the paused node was dialed again within its hold"
    finally:
        mute.close()


def test_a_silent_node_is_dialed_every_5_s_while_every_other_node_refuses(
    amqp10_peers: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The only node that can serve goes silent (a one-way cut, a pause) while the other
    refuses (an Artemis backup, a Broker-J replica): the silent one is dialed again every
    5 s, not after a hold doubling to 30 s, so the client is back within seconds of the
    heal (``msgsafe nemesis artemis``: 30 s of STORED sends after a heal)."""
    from msgsafe.cluster._process import free_ports
    from msgsafe.testing.faultproxy import FaultProxy

    caplog.set_level(logging.DEBUG, logger="msgsafe.adapters.amqp10")
    peer = amqp10_peers.start()
    (refusing,) = free_ports(1)  # nothing listens: connection refused
    with FaultProxy("127.0.0.1", peer.port, connect_timeout=2.0) as proxy:
        timed_out = f"cannot connect to 127.0.0.1:{proxy.port}: timed out"

        def timeouts() -> int:
            return sum(timed_out in r.getMessage() for r in list(caplog.records))

        url = f"amqp10://127.0.0.1:{proxy.port},127.0.0.1:{refusing}"
        with transport_for(url, confirm_timeout=2.0, connect_timeout=0.5) as transport:
            transport.publish(Envelope.build("orders", b"1")).result(15)
            proxy.reset()  # the connection drops ...
            proxy.blackhole()  # ... and every new one is accepted and never answered
            # Three timeouts, the refusing node failing all along: a doubling hold was 5,
            # 10, then 20 s after the third; healed at its start.
            wait_until(lambda: timeouts() >= 3, 40, "three timed-out dials")
            proxy.heal()
            healed = time.monotonic()
            wait_until(lambda: len(transport.history) == 2, 30, "a connection after the heal")
            back = time.monotonic() - healed
            transport.publish(Envelope.build("orders", b"2")).result(15)
    assert back < 8.0, f"back {back:.1f} s after the heal"


def test_an_attach_never_answered_is_given_up_for_the_next_node(
    amqp10_peers: PeerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that opens the connection and keeps it alive but never answers the sender's
    attach (Broker-J once did, to a link whose name a dying connection still held) is
    given up after ``confirm_timeout`` (5 s at least): the next node confirms, what timed
    out meanwhile leaves the outbox for it, and every receipted id is read back."""
    caplog.set_level(logging.WARNING, logger="msgsafe.adapters.amqp10")
    muted = amqp10_peers.start(mute_attach=True)
    healthy = amqp10_peers.start()
    url = f"amqp10://127.0.0.1:{muted.port},127.0.0.1:{healthy.port}"
    ledger = Ledger()
    with Producer(url, outbox=tmp_path / "outbox.db", confirm_timeout=2.0) as producer:
        futures = [producer.send_async("orders", b"%04d" % i, key=f"k{i % 4}") for i in range(100)]
        receipts = [f.result(30) for f in futures]
        wait_until(lambda: producer.drain(5) == 0, 30, "the outbox to drain to the next node")
        last = producer.send("orders", b"last")
        assert last.status is Status.CONFIRMED, "the session stayed on the silent node"
    for receipt in [*receipts, last]:
        ledger.add_sent(receipt.message_id)
        ledger.add_receipt(receipt.message_id, receipt.status)
    assert muted.connections >= 1, "the silent node was never dialed: nothing was tested"
    assert any("did not answer the attach" in r.getMessage() for r in caplog.records)
    _consume_all(f"amqp10://127.0.0.1:{healthy.port}", ledger)
    counts = ledger.counts("attach never answered")
    assert counts["confirmed"] + counts["stored"] == 101
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_a_receiver_whose_attach_is_never_answered_reads_from_the_next_node(
    amqp10_peers: PeerFactory,
) -> None:
    """The same silence toward a receiver's attach: it moves on after 5 s and reads every
    message the group holds."""
    muted = amqp10_peers.start(mute_attach=True)
    healthy = amqp10_peers.start()
    ledger = Ledger()
    with transport_for(f"amqp10://127.0.0.1:{healthy.port}") as transport:
        for i in range(50):
            env = Envelope.build("orders", b"%04d" % i)
            ledger.track(env.message_id, transport.publish(env))
        wait_until(lambda: ledger.resolved() == 50, 20, "50 outcomes")
    url = f"amqp10://127.0.0.1:{muted.port},127.0.0.1:{healthy.port}"
    _consume_all(url, ledger, timeout=30.0)
    assert muted.connections >= 1, "the silent node was never dialed: nothing was tested"
    counts = ledger.counts("receiver attach never answered")
    assert counts["confirmed"] == 50 and counts["lost"] == 0 and counts["unknown"] == 0


def test_connection_redirect_is_followed(
    amqp10_peers: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """``amqp:connection:redirect`` from the only node in the URL: the client dials the
    node the redirect names (same TLS), sends there, and logs the redirect."""
    caplog.set_level(logging.INFO, logger="msgsafe.adapters.amqp10")
    target = amqp10_peers.start()
    mover = amqp10_peers.start(redirect=f"127.0.0.1:{target.port}")
    ledger = Ledger()
    with transport_for(f"amqp10://127.0.0.1:{mover.port}", confirm_timeout=15.0) as transport:
        for i in range(50):
            env = Envelope.build("orders", b"%04d" % i)
            ledger.track(env.message_id, transport.publish(env))
        wait_until(lambda: ledger.resolved() == 50, 20, "50 outcomes")
        assert transport.history[-1].port == target.port
    _consume_all(f"amqp10://127.0.0.1:{target.port}", ledger)
    counts = ledger.counts("connection redirect")
    assert counts["confirmed"] == 50 and counts["lost"] == 0 and counts["unknown"] == 0
    assert mover.redirects >= 1
    assert any("redirected the client to" in r.getMessage() for r in caplog.records)


def test_link_redirect_moves_the_session(amqp10_peers: PeerFactory) -> None:
    """``amqp:link:redirect`` on a sender link: the messages stay queued and go to the
    node named, with their ids."""
    target = amqp10_peers.start()
    mover = amqp10_peers.start(link_redirect=f"127.0.0.1:{target.port}")
    ledger = Ledger()
    with transport_for(f"amqp10://127.0.0.1:{mover.port}", confirm_timeout=15.0) as transport:
        for i in range(50):
            env = Envelope.build("orders", b"%04d" % i)
            ledger.track(env.message_id, transport.publish(env))
        wait_until(lambda: ledger.resolved() == 50, 20, "50 outcomes")
        assert [e.port for e in transport.history] == [mover.port, target.port]
    _consume_all(f"amqp10://127.0.0.1:{target.port}", ledger)
    counts = ledger.counts("link redirect")
    assert counts["confirmed"] == 50 and counts["lost"] == 0 and counts["unknown"] == 0


def test_redirect_outside_the_allow_list_is_not_followed(amqp10_peers: PeerFactory) -> None:
    target = amqp10_peers.start()
    mover = amqp10_peers.start(redirect=f"127.0.0.1:{target.port}")
    url = f"amqp10://127.0.0.1:{mover.port}?failover_allow=127.0.0.1:{mover.port}"
    with transport_for(url, confirm_timeout=2.0) as transport:
        err = transport.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, TransientError) and not err.maybe_delivered
        assert target.port not in [e.port for e in transport.history]
    assert target.connections == 0


def test_a_redirect_loop_is_followed_a_bounded_number_of_times(
    amqp10_peers: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="msgsafe.adapters.amqp10")
    loop = amqp10_peers.start(redirect="self")
    with transport_for(f"amqp10://127.0.0.1:{loop.port}", confirm_timeout=2.0) as transport:
        err = transport.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, TransientError) and not err.maybe_delivered
    followed = [r for r in caplog.records if "redirected the client to" in r.getMessage()]
    assert len(followed) == MAX_REDIRECTS, caplog.text
    assert any("a redirect loop?" in r.getMessage() for r in caplog.records)
