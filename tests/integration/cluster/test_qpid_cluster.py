"""A real Qpid Broker-J 9.2.0 BDB HA group of three nodes (msgsafe.cluster.qpid), and
msgsafe's AMQP 1.0 client against it.

- the group starts with one master and two attached replicas, as the REST API says;
- raw python-qpid-proton: the master takes and gives back durable messages; a replica
  opens the connection and closes it at once with ``amqp:connection:forced`` (no
  redirect, no ``failover-server-list`` anywhere);
- ``msgsafe.Producer`` / ``msgsafe.Consumer`` with an ``amqp10://`` URL naming all three
  nodes, replicas first: the client must skip the replicas and lose nothing;
- the master SIGKILLed while counted sends flow: every id sent is receipted, and every
  receipted id is read back from the new master (lost == 0);
- two of three nodes down (no quorum): sends go to the outbox and reach the group once a
  majority is back;
- the master SIGSTOPped: the others elect a new master; the resumed old one refuses work
  for a moment while it still calls itself master, and a client given every node must
  treat that refusal as transient (fail over or store), never as a permanent error.

One group for the module (``qpid``); the tests run in file order, each leaves the group
whole (three nodes, one master) for the next.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from msgsafe import Consumer, Producer, Status
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.qpid import MASTER, REPLICA, QpidCluster
from msgsafe.message import Receipt
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

_HINT = (
    "the Broker-J group needs Java 17+ and Maven (apt-get install -y "
    "openjdk-17-jre-headless maven); its jars come from Maven Central on first use "
    "(python -m msgsafe.cluster.cli fetch qpid)"
)


@pytest.fixture(scope="module")
def qpid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QpidCluster]:
    started = time.monotonic()
    try:
        QpidCluster.fetch()
    except ClusterError as exc:
        pytest.fail(f"cannot fetch Broker-J: {exc}\n{_HINT}")
    fetched = time.monotonic() - started
    cluster = QpidCluster(dir=tmp_path_factory.mktemp("qpid"))
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"cannot start the Broker-J group: {exc}\n{_HINT}")
    print(
        f"[qpid] fetch {fetched:.1f}s, start {cluster.start_seconds:.1f}s, roles {cluster.roles()}"
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not any(node.running for node in cluster.nodes()), "stop() left a node running"


def read_back(url: str, address: str, wanted: set[str], timeout: float = 90.0) -> list[str]:
    """Every message id read (and acknowledged) from ``address`` until ``wanted`` are all
    in, then one more second of quiet for late duplicates."""
    received: list[str] = []
    with Consumer(url, credit=500) as consumer:
        consumer.subscribe(address)
        quiet: list[float] = []

        def done() -> bool:
            for delivery in consumer.poll(max_messages=500, timeout=0.2):
                assert delivery.message_id is not None
                received.append(delivery.message_id)
                delivery.ack()
            if not wanted <= set(received):
                return False
            quiet.append(time.monotonic())
            return quiet[-1] - quiet[0] >= 1.0

        wait_until(done, timeout, f"{len(wanted)} ids on {address}")
    return received


def counts(label: str, sent: int, receipts: list[Receipt], received: list[str]) -> dict[str, int]:
    ids = {r.message_id for r in receipts}
    got = set(received)
    status = collections.Counter(r.status for r in receipts)
    result = {
        "sent": sent,
        "receipted": len(receipts),
        "confirmed": status[Status.CONFIRMED],
        "stored": status[Status.STORED],
        "received": len(received),
        "duplicates": len(received) - len(got),
        "lost": len(ids - got),
        "unknown": len(got - ids),
    }
    print(f"[{label}] " + " ".join(f"{k}={v}" for k, v in result.items()))
    return result


# --- raw proton ------------------------------------------------------------------------------


class _Peer(MessagingHandler):
    """One connection: send ``bodies`` to ``address``, then read as many back, recording
    what the peer said in its open and close frames."""

    def __init__(self, url: str, address: str | None, bodies: list[str]) -> None:
        super().__init__(auto_accept=True)
        self.url, self.address = url, address
        self.bodies, self.total = bodies, len(bodies)
        self.properties: dict[str, Any] | None = None
        self.condition: Any = None
        self.accepted = 0
        self.received: list[str] = []

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(
            self.url, user="msgsafe", password="msgsafe", allowed_mechs="PLAIN", reconnect=False
        )
        self.timer = event.container.schedule(20.0, self)
        if self.address is not None:
            event.container.create_sender(self.conn, self.address)

    def on_timer_task(self, event: Any) -> None:
        self.conn.close()

    def on_connection_opened(self, event: Any) -> None:
        properties = event.connection.remote_properties or {}
        self.properties = {str(k): v for k, v in properties.items()}

    def on_sendable(self, event: Any) -> None:
        while self.bodies and event.sender.credit:
            event.sender.send(Message(body=self.bodies.pop(0), durable=True))

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.total:
            event.container.create_receiver(self.conn, self.address)

    def on_message(self, event: Any) -> None:
        self.received.append(str(event.message.body))
        if len(self.received) == self.total:
            self.conn.close()

    def _end(self, event: Any) -> None:
        # A replica's close frame and the end of the stream can arrive together: proton
        # then reports only the disconnect, with the close's condition on the connection.
        if self.condition is None:
            self.condition = event.connection.remote_condition
        self.timer.cancel()
        event.container.stop()

    def on_connection_error(self, event: Any) -> None:
        self._end(event)

    def on_connection_closed(self, event: Any) -> None:
        self._end(event)

    def on_disconnected(self, event: Any) -> None:
        self._end(event)


def _run(port: int, address: str | None = None, bodies: list[str] | None = None) -> _Peer:
    peer = _Peer(f"amqp://127.0.0.1:{port}", address, list(bodies or []))
    Container(peer).run()
    return peer


# --- the tests -------------------------------------------------------------------------------


def test_group_starts_with_one_master_and_two_attached_replicas(qpid: QpidCluster) -> None:
    nodes = qpid.nodes()
    assert [n.running for n in nodes] == [True, True, True]
    assert sorted(str(n.role) for n in nodes) == [MASTER, REPLICA, REPLICA]
    assert qpid.master() is not None
    hosts = ",".join(f"127.0.0.1:{p}" for p in qpid.ports)
    assert qpid.url == f"amqp10://msgsafe:msgsafe@{hosts}"
    assert qpid.node_url(1) == f"amqp10://msgsafe:msgsafe@127.0.0.1:{qpid.ports[1]}"
    described = qpid.describe()
    assert described["kind"] == "qpid" and len(described["nodes"]) == 3
    # Found again from its state, as `msgsafe cluster status` does from another process.
    again = QpidCluster.from_state(qpid.dir, qpid.state())
    assert [n.role for n in again.nodes()] == [n.role for n in nodes]


def test_raw_proton_master_serves_and_replicas_close_the_connection(qpid: QpidCluster) -> None:
    master = qpid.wait_master()
    bodies = [f"raw-{i}" for i in range(20)]
    peer = _run(qpid.ports[master], "raw.proton", bodies)
    assert peer.accepted == 20
    assert sorted(peer.received) == sorted(f"raw-{i}" for i in range(20))
    assert peer.properties is not None
    print(f"[raw] master open properties: {peer.properties}")
    assert "failover-server-list" not in peer.properties
    for node in range(qpid.count):
        if node == master:
            continue
        replica = _run(qpid.ports[node], "raw.proton", ["never"])
        print(f"[raw] replica {node}: open {replica.properties is not None}, {replica.condition}")
        assert replica.properties is not None, "a replica sends open before it closes"
        assert replica.accepted == 0
        assert replica.condition is not None
        assert replica.condition.name == "amqp:connection:forced"
        assert "is not active" in replica.condition.description


def test_producer_and_consumer_skip_the_replicas(qpid: QpidCluster) -> None:
    master = qpid.wait_master()
    order = [n for n in range(qpid.count) if n != master] + [master]
    url = "amqp10://msgsafe:msgsafe@" + ",".join(f"127.0.0.1:{qpid.ports[n]}" for n in order)
    with Producer(url, outbox=False, confirm_timeout=20.0) as producer:
        receipts = [
            producer.send("sdk.orders", b"order-%d" % i, key=f"k{i % 4}") for i in range(200)
        ]
    assert {r.status for r in receipts} == {Status.CONFIRMED}
    received = read_back(url, "sdk.orders", {r.message_id for r in receipts})
    result = counts("sdk round trip", 200, receipts, received)
    assert result["lost"] == 0 and result["unknown"] == 0


def test_master_killed_during_counted_sends_loses_nothing(
    qpid: QpidCluster, tmp_path: Path
) -> None:
    total = 3_000
    master = qpid.wait_master()
    futures: list[Future[Receipt]] = []
    confirmed = [0]
    lock = threading.Lock()

    def count(future: Future[Receipt]) -> None:
        if future.exception() is None and future.result().status is Status.CONFIRMED:
            with lock:
                confirmed[0] += 1

    elected = 0.0
    after_kill = 0
    with Producer(qpid.url, outbox=tmp_path / "outbox.db", confirm_timeout=10.0) as producer:
        killed_at: float | None = None
        for i in range(total):
            future = producer.send_async("failover.orders", b"%06d" % i, key=f"k{i % 16}")
            future.add_done_callback(count)
            futures.append(future)
            if killed_at is None and confirmed[0] >= total // 3:
                killed_at = time.monotonic()
                qpid.kill(master)
                new = qpid.wait_master(60.0, exclude=[master])
                elected = time.monotonic() - killed_at
                print(f"[failover] killed master {master}; node {new} master after {elected:.2f}s")
            elif killed_at is not None:
                after_kill += 1
        assert killed_at is not None, "the master was never killed: nothing was confirmed"
        receipts = [f.result(120) for f in futures]
        wait_until(lambda: producer.drain(5) == 0, 120, "the outbox to drain")
    assert after_kill > 0
    received = read_back(qpid.url, "failover.orders", {r.message_id for r in receipts})
    result = counts("failover", total, receipts, received)
    assert result["receipted"] == total
    assert result["lost"] == 0 and result["unknown"] == 0
    started = time.monotonic()
    qpid.restart(master)
    qpid.wait_group(60.0)
    print(
        f"[failover] node {master} back as {qpid.role(master)} in {time.monotonic() - started:.1f}s"
    )


def test_without_quorum_sends_are_stored_and_forwarded_when_a_majority_is_back(
    qpid: QpidCluster, tmp_path: Path
) -> None:
    master = qpid.wait_master()
    down = [master, (master + 1) % qpid.count]
    for node in down:
        qpid.kill(node)
    alone = (master + 2) % qpid.count
    wait_until(lambda: qpid.role(alone) == "waiting", 30, f"node {alone} to wait for a quorum")
    with Producer(qpid.url, outbox=tmp_path / "outbox.db", confirm_timeout=3.0) as producer:
        receipts = [
            f.result(60)
            for f in [producer.send_async("quorum.orders", b"q%d" % i) for i in range(100)]
        ]
        assert {r.status for r in receipts} == {Status.STORED}, "no quorum: nothing confirmed"
        started = time.monotonic()
        for node in down:
            qpid.restart(node)
        qpid.wait_group(60.0)
        print(f"[quorum] majority back in {time.monotonic() - started:.1f}s, roles {qpid.roles()}")
        wait_until(lambda: producer.drain(5) == 0, 120, "the outbox to drain")
    received = read_back(qpid.url, "quorum.orders", {r.message_id for r in receipts})
    result = counts("no quorum", 100, receipts, received)
    assert result["lost"] == 0 and result["unknown"] == 0


def test_a_paused_master_is_replaced_and_its_stale_refusal_is_not_permanent(
    qpid: QpidCluster, tmp_path: Path
) -> None:
    """SIGSTOP the master: the replicas elect a new one (about 50 s with Broker-J's
    default JE timeouts). SIGCONT it: for a moment it still calls itself master, but it
    can commit nothing and refuses to create a new address (``amqp:not-found``) before it
    steps down. That refusal is transient: a client given every node must fail over to
    the real master or store the message, never raise it as a permanent error."""
    old = qpid.wait_master()
    order = [old] + [n for n in range(qpid.count) if n != old]
    url = "amqp10://msgsafe:msgsafe@" + ",".join(f"127.0.0.1:{qpid.ports[n]}" for n in order)
    paused = time.monotonic()
    qpid.pause(old)
    try:
        # Counted sends while the master is paused (its node first in the URL): stored
        # while no node serves, forwarded to the new master once elected.
        with Producer(url, outbox=tmp_path / "paused.db", confirm_timeout=10.0) as during:
            held = [during.send("paused.orders", b"p%d" % i) for i in range(200)]
            sent_in = time.monotonic() - paused
            new = qpid.wait_master(120.0, exclude=[old])
            elected = time.monotonic() - paused
            wait_until(lambda: during.drain(5) == 0, 120, "the outbox to drain")
    finally:
        qpid.resume(old)
    print(
        f"[pause] master {old} paused; 200 sends took {sent_in:.1f}s; "
        f"node {new} master after {elected:.1f}s"
    )
    with Producer(url, outbox=tmp_path / "outbox.db", confirm_timeout=10.0) as producer:
        receipt = producer.send("stale.orders", b"after the pause")
        assert receipt.status in (Status.CONFIRMED, Status.STORED)
        wait_until(lambda: producer.drain(5) == 0, 60, "the outbox to drain")
    qpid.wait_group(60.0)
    received = read_back(qpid.url, "stale.orders", {receipt.message_id})
    assert counts("stale master", 1, [receipt], received)["lost"] == 0
    received = read_back(qpid.url, "paused.orders", {r.message_id for r in held})
    result = counts("paused master", 200, held, received)
    assert result["lost"] == 0 and result["unknown"] == 0


def test_doctor_reports_each_node_role(qpid: QpidCluster) -> None:
    """``msgsafe doctor`` on every node: the master serves, each replica opens and closes
    at once (not serving, with Broker-J's reason); Broker-J advertises no fail-over list,
    so the client's rotation is the URL's."""
    from msgsafe.adapters.amqp10.check import check_amqp10
    from msgsafe.endpoints import parse_url

    # NOTE: every node attached first: the master paused by the test before may still be
    # rejoining, answering "Unknown hostname" (not-found) instead of a replica's refusal.
    master = qpid.wait_group()
    findings = check_amqp10(parse_url(qpid.url))
    roles = {f.subject: f.value for f in findings if f.setting == "role"}
    print(f"[doctor] {roles}")
    for node in range(qpid.count):
        role = roles[f"peer 127.0.0.1:{qpid.ports[node]}"]
        if node == master:
            assert role.startswith("serving") and "Broker-J" in role
        else:
            assert role.startswith("not serving: amqp:connection:forced"), role
    lists = [f for f in findings if f.setting == "failover-server-list"]
    assert [f.value for f in lists] == ["not advertised"]
