"""The ActiveMQ Artemis primary/backup pair of ``msgsafe.cluster``, and msgsafe's AMQP 1.0
client against it.

One pair serves the whole module. Each test starts from a whole pair (primary live,
backup synchronized): the ``pair`` fixture restarts what an earlier test killed, which is
itself a fail-back. Every reliability test counts ids sent, receipted and received:
lost (receipted, never received) must be 0; duplicates must all be ids that were sent.

What these tests establish about Artemis 2.40 (and the client must cope with):

- the primary's open frame carries ``failover-server-list``: a list of ONE map with the
  symbol keys ``network-host``, ``hostname``, ``port`` (int) and ``scheme`` ("amqp")
  naming the backup's acceptor; a promoted backup advertises no list at all;
- the backup does not listen while the primary lives: connecting is refused at TCP
  level (no open frame, no redirect);
- SIGKILL of the primary: the backup serves within about a second, with every message
  the primary had confirmed;
- under Artemis's default routing (MULTICAST, which the pair here keeps), a link
  attached without the ``queue`` capability auto-creates a multicast address with no
  queue: every send is accepted and routed nowhere. The client sends the capability as
  Qpid JMS does, so a first send creates an anycast queue.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

from msgsafe import Consumer, Producer
from msgsafe.cluster import ClusterError
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.message import new_message_id
from tests.support.ledger import Ledger
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

_INSTALL = (
    "the Artemis pair needs Java 17 and Maven with Maven Central reachable "
    "(apt-get install -y openjdk-17-jre-headless maven); the first run fetches "
    "org.apache.activemq:apache-artemis:2.40.0:bin into ~/.cache/msgsafe/brokers"
)


# --- the pair ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artemis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArtemisCluster]:
    try:
        started = time.monotonic()
        ArtemisCluster.fetch()
        fetched = time.monotonic() - started
        # Artemis's own default routing (MULTICAST), not the ANYCAST `msgsafe cluster`
        # configures: the client must not depend on a friendly broker configuration.
        cluster = ArtemisCluster(dir=tmp_path_factory.mktemp("artemis"), routing="MULTICAST")
        started = time.monotonic()
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"{_INSTALL}\n{exc}")
    print(f"[artemis] fetch {fetched:.1f}s, pair up in {time.monotonic() - started:.1f}s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pair(artemis: ArtemisCluster) -> ArtemisCluster:
    """The module's pair, whole again: primary live, backup synchronized."""
    if not artemis.nodes()[0].running:
        artemis.restart(0)  # a fail-back when the backup is live
    if not artemis.nodes()[1].running:
        artemis.restart(1)
    roles = [n.role for n in artemis.nodes()]
    assert roles == ["live", "backup"], f"the pair could not be made whole: {roles}"
    return artemis


def _address() -> str:
    return f"msgsafe.test.{uuid.uuid4().hex[:12]}"


# --- raw proton: what the broker says in its open frame ------------------------------------


class _Probe(MessagingHandler):  # type: ignore[misc]
    """Opens one connection, records what the peer answered, closes it."""

    def __init__(self, url: str, user: str, password: str) -> None:
        super().__init__()
        self.url = url
        self.user = user
        self.password = password
        self.properties: dict[Any, Any] | None = None
        self.opened = False
        self.errors: list[str] = []

    def on_start(self, event: Any) -> None:
        event.container.connect(
            self.url,
            user=self.user,
            password=self.password,
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            reconnect=False,
        )
        # A safety stop: a peer that never answers must not hang the suite.
        event.container.schedule(15.0, self)

    def on_timer_task(self, event: Any) -> None:
        self.errors.append("no answer within 15 s")
        event.container.stop()

    def on_connection_opened(self, event: Any) -> None:
        self.opened = True
        self.properties = dict(event.connection.remote_properties or {})
        event.connection.close()

    def on_connection_closed(self, event: Any) -> None:
        event.container.stop()

    def on_connection_error(self, event: Any) -> None:
        cond = event.connection.remote_condition
        self.errors.append(f"close: {cond.name if cond else None}")

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        self.errors.append(f"transport: {cond.description if cond else None}")
        event.container.stop()


def _probe(cluster: ArtemisCluster, node: int) -> _Probe:
    probe = _Probe(f"amqp://127.0.0.1:{cluster.ports[node]}", cluster.user, cluster.password)
    Container(probe).run()
    return probe


# --- counting ------------------------------------------------------------------------------


def _send(ledger: Ledger, producer: Producer, address: str, i: int) -> None:
    """Send message ``i`` with an id chosen here; the ledger records its outcome."""
    message_id = new_message_id()
    future = producer.send_async(address, b"%08d" % i, key=f"k{i % 16}", message_id=message_id)
    ledger.track(message_id, future)


def _read_back(url: str, address: str, ledger: Ledger, timeout: float = 60.0) -> None:
    """Consume ``address`` through ``url`` until every receipted id arrived and one more
    second brings nothing (late duplicates are counted too)."""
    with Consumer(url) as consumer:
        consumer.subscribe(address)
        last_new = [time.monotonic()]

        def take() -> bool:
            for delivery in consumer.poll(max_messages=500, timeout=0.2):
                assert delivery.message_id is not None
                ledger.add_received(delivery.message_id)
                delivery.ack()
                last_new[0] = time.monotonic()
            return not ledger.missing() and time.monotonic() - last_new[0] > 1.0

        wait_until(take, timeout, f"every receipted id on {address}")


# --- the tests -----------------------------------------------------------------------------


def test_pair_reports_a_live_primary_and_a_synchronized_backup(pair: ArtemisCluster) -> None:
    primary, backup = pair.nodes()
    assert (primary.name, primary.role, primary.running) == ("primary", "live", True)
    assert (backup.name, backup.role, backup.running) == ("backup", "backup", True)
    assert primary.pid and backup.pid and primary.pid != backup.pid
    p0, p1 = pair.ports
    auth = f"{pair.user}:{pair.password}@"
    assert pair.url == f"amqp10://{auth}127.0.0.1:{p0},127.0.0.1:{p1}"
    assert pair.node_url(1) == f"amqp10://{auth}127.0.0.1:{p1}"
    described = pair.describe()
    assert described["kind"] == "artemis"
    assert [n["role"] for n in described["nodes"]] == ["live", "backup"]
    again = ArtemisCluster.from_state(pair.dir, pair.state())
    assert again.nodes() == pair.nodes()


def test_primary_open_frame_advertises_exactly_the_backup(pair: ArtemisCluster) -> None:
    probe = _probe(pair, 0)
    assert probe.opened, probe.errors
    props = probe.properties or {}
    print(f"[artemis open frame] {props!r}")
    failover = props[symbol("failover-server-list")]
    assert isinstance(failover, list) and len(failover) == 1
    (entry,) = failover
    assert all(isinstance(k, symbol) for k in entry)
    assert {str(k): v for k, v in entry.items()} == {
        "network-host": "127.0.0.1",
        "hostname": "127.0.0.1",
        "port": pair.ports[1],
        "scheme": "amqp",
    }
    assert props[symbol("product")] == "apache-activemq-artemis"


def test_backup_refuses_connections_while_the_primary_lives(pair: ArtemisCluster) -> None:
    probe = _probe(pair, 1)
    print(f"[artemis backup] opened={probe.opened} errors={probe.errors}")
    assert not probe.opened
    assert any("refused" in e.lower() for e in probe.errors), probe.errors


def test_producer_and_consumer_through_the_live_only(pair: ArtemisCluster) -> None:
    # Under the default MULTICAST routing, a first send (with the client's "queue"
    # capability) creates a durable anycast queue: nothing sent before the consumer
    # subscribes may be dropped.
    address = _address()
    ledger = Ledger()
    with Producer(pair.node_url(0), outbox=False, confirm_timeout=30.0) as producer:
        for i in range(1_000):
            _send(ledger, producer, address, i)
        wait_until(lambda: ledger.resolved() == 1_000, 60, "1000 outcomes")
    _read_back(pair.node_url(0), address, ledger)
    counts = ledger.counts("artemis live only")
    assert counts["failed"] == 0, ledger.failed
    assert counts["receipted"] == 1_000
    assert counts["lost"] == 0 and counts["unknown"] == 0 and counts["duplicates"] == 0


def test_multicast_default_without_the_queue_capability_routes_nowhere(
    pair: ArtemisCluster,
) -> None:
    """Why the client sends the ``queue`` capability: with it off, Artemis accepts every
    send to a new address and keeps none of them (what a client without it loses)."""
    address = _address()
    ledger = Ledger()
    with Producer(
        pair.node_url(0), outbox=False, confirm_timeout=30.0, address_capability=""
    ) as producer:
        for i in range(100):
            _send(ledger, producer, address, i)
        wait_until(lambda: ledger.resolved() == 100, 60, "100 outcomes")
    with Consumer(pair.node_url(0), address_capability="") as consumer:
        consumer.subscribe(address)
        got = consumer.poll(max_messages=100, timeout=2.0)
    counts = ledger.counts("artemis multicast, no capability")
    assert counts["receipted"] == 100 and counts["failed"] == 0
    assert got == [], "Artemis kept a message sent to a queue-less multicast address"


def test_primary_sigkill_during_counted_sends_loses_nothing(
    pair: ArtemisCluster, tmp_path: Path
) -> None:
    """The producer knows only the primary's address; the backup it fails over to comes
    from the primary's failover-server-list. Every send is receipted: CONFIRMED by the
    primary before the kill or by the backup after it, or STORED while no node served
    (fail fast) and forwarded to the backup; the backup alone then holds every one."""
    address = _address()
    ledger = Ledger()
    total = 6_000
    producer = Producer(pair.node_url(0), outbox=tmp_path / "outbox.db", confirm_timeout=60.0)
    try:

        def sender() -> None:
            for i in range(total):
                _send(ledger, producer, address, i)
                if i % 250 == 0:  # pace: the kill must land with sends in flight
                    time.sleep(0.002)

        thread = threading.Thread(target=sender, name="artemis-sender")
        thread.start()
        wait_until(lambda: ledger.resolved() >= 1_500, 60, "1500 outcomes before the kill")
        in_flight = ledger.unresolved()
        killed = time.monotonic()
        pair.kill(0)
        wait_until(lambda: pair.nodes()[1].role == "live", 30, "the backup to become live")
        promoted = time.monotonic() - killed
        thread.join(120)
        wait_until(lambda: ledger.resolved() == total, 120, "every send to resolve")
        resolved = time.monotonic() - killed
        assert producer.drain(timeout=120) == 0, "stored messages must reach the backup"
    finally:
        producer.close()
    print(
        f"[artemis kill] in flight at kill={in_flight} backup live after {promoted:.2f}s, "
        f"all sends resolved {resolved:.2f}s after the kill"
    )
    assert in_flight > 0, "the kill must land while sends are unresolved"
    # Everything the pair confirmed must be readable from the backup alone.
    _read_back(pair.node_url(1), address, ledger)
    counts = ledger.counts("artemis primary SIGKILL")
    assert counts["failed"] == 0, sorted({repr(e) for e in ledger.failed.values()})[:5]
    assert counts["receipted"] == total
    assert counts["lost"] == 0
    assert counts["unknown"] == 0


def test_consumer_follows_the_fail_over_to_the_backup(pair: ArtemisCluster) -> None:
    address = _address()
    ledger = Ledger()
    with Producer(pair.node_url(0), outbox=False, confirm_timeout=30.0) as producer:
        for i in range(2_000):
            _send(ledger, producer, address, i)
        wait_until(lambda: ledger.resolved() == 2_000, 60, "2000 outcomes")
    assert not ledger.failed, ledger.failed
    # Consumer knows only the primary; it must continue on the backup after the kill.
    with Consumer(pair.node_url(0), credit=100) as consumer:
        consumer.subscribe(address)

        def take() -> int:
            for delivery in consumer.poll(max_messages=100, timeout=0.2):
                assert delivery.message_id is not None
                ledger.add_received(delivery.message_id)
                delivery.ack()
            with ledger.lock:
                return len(ledger.received)  # distinct ids

        wait_until(lambda: take() >= 500, 60, "the first 500 deliveries")
        pair.kill(0)
        wait_until(lambda: take() >= 2_000, 90, "every delivery after the fail-over")
    counts = ledger.counts("artemis consumer fail-over")
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_backup_restarted_after_a_kill_catches_up_with_the_primary(
    pair: ArtemisCluster,
) -> None:
    """Messages confirmed while the backup was dead reach it by the initial sync when it
    comes back: after that, the primary can die and the backup still has them all."""
    address = _address()
    ledger = Ledger()
    pair.kill(1)
    with Producer(pair.node_url(0), outbox=False, confirm_timeout=30.0) as producer:
        for i in range(1_000):
            _send(ledger, producer, address, i)
        wait_until(lambda: ledger.resolved() == 1_000, 60, "1000 outcomes with the backup down")
    assert not ledger.failed, "the primary alone must confirm (vote-on-replication-failure off)"
    started = time.monotonic()
    pair.restart(1)
    resync = time.monotonic() - started
    assert [n.role for n in pair.nodes()] == ["live", "backup"]
    pair.kill(0)
    wait_until(lambda: pair.nodes()[1].role == "live", 30, "the backup to become live")
    _read_back(pair.node_url(1), address, ledger)
    print(f"[artemis backup restart] restart(1) until synchronized: {resync:.2f}s")
    counts = ledger.counts("artemis backup catch-up")
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_both_killed_the_journal_survives_and_the_backup_waits_for_the_primary(
    pair: ArtemisCluster,
) -> None:
    address = _address()
    ledger = Ledger()
    with Producer(pair.node_url(0), outbox=False, confirm_timeout=30.0) as producer:
        for i in range(500):
            _send(ledger, producer, address, i)
        wait_until(lambda: ledger.resolved() == 500, 60, "500 outcomes")
    assert not ledger.failed
    pair.kill(1)
    pair.kill(0)  # last: the primary's journal is the newest
    pair.restart(1)
    assert [n.role for n in pair.nodes()] == [None, None], "a backup alone never goes live"
    pair.restart(0)
    assert [n.role for n in pair.nodes()] == ["live", "backup"]
    _read_back(pair.node_url(0), address, ledger)
    counts = ledger.counts("artemis both killed")
    assert counts["lost"] == 0 and counts["unknown"] == 0


def test_restarted_primary_takes_over_again_under_traffic(
    pair: ArtemisCluster, tmp_path: Path
) -> None:
    """Fail-back: with the backup live, the old primary comes back, copies the backup's
    journal and becomes live; the backup returns to being its replica. A producer with
    both addresses loses nothing across the two hand-overs (what no node could take
    while they swapped is STORED and forwarded)."""
    address = _address()
    ledger = Ledger()
    pair.kill(0)
    wait_until(lambda: pair.nodes()[1].role == "live", 30, "the backup to become live")
    stop = threading.Event()
    producer = Producer(pair.url, outbox=tmp_path / "outbox.db", confirm_timeout=60.0)
    try:

        def sender() -> None:
            i = 0
            while not stop.is_set():
                _send(ledger, producer, address, i)
                i += 1
                if i % 100 == 0:
                    time.sleep(0.01)

        thread = threading.Thread(target=sender, name="artemis-sender")
        thread.start()
        wait_until(lambda: ledger.resolved() >= 1_000, 60, "1000 outcomes on the backup")
        started = time.monotonic()
        pair.restart(0)
        failback = time.monotonic() - started
        # restart() returns once the primary is live and the backup has synchronized;
        # the roles are read from the logs and ports, which a busy machine may show a
        # moment later.
        wait_until(
            lambda: [n.role for n in pair.nodes()] == ["live", "backup"],
            90,
            "the primary live and the backup a backup again",
        )
        after = len(ledger.sent)
        wait_until(lambda: ledger.resolved() >= after + 1_000, 60, "1000 outcomes after fail-back")
        stop.set()
        thread.join(30)
        wait_until(lambda: ledger.resolved() == len(ledger.sent), 120, "every send to resolve")
        assert producer.drain(timeout=120) == 0, "stored messages must reach the live"
    finally:
        stop.set()
        producer.close()
    print(f"[artemis fail-back] restart(0) until the pair was whole: {failback:.2f}s")
    _read_back(pair.node_url(0), address, ledger)
    counts = ledger.counts("artemis fail-back")
    assert counts["failed"] == 0, sorted({repr(e) for e in ledger.failed.values()})[:5]
    assert counts["lost"] == 0
    assert counts["unknown"] == 0


def test_a_backup_that_ends_during_the_fail_back_is_running_again_after_it(
    pair: ArtemisCluster,
) -> None:
    """``restart(0)`` returns the pair whole when the backup was running before it, even
    if the backup's process ended meanwhile: a nemesis run (artemis seed 976727860) saw
    the backup's process end right after it handed the role back, and then paused a
    backup that was gone. Here the backup is SIGKILLed as the primary's process starts."""
    pair.kill(0)
    wait_until(lambda: pair.nodes()[1].role == "live", 30, "the backup to become live")
    backup = pair.pids[1]
    assert backup is not None
    _restart_killing(pair, 0, backup)
    assert pair.pids[1] != backup and pair.nodes()[1].running, "the backup was not started again"
    _wait_whole(pair)


def test_a_primary_that_ends_while_the_backup_restarts_is_running_again_after_it(
    pair: ArtemisCluster,
) -> None:
    """``restart(1)`` returns the pair whole when the primary's process ends while the
    backup synchronizes with it: the suite's nemesis slice (artemis seed 1938571766) saw
    the primary shut itself down (AMQ229114, its last synchronization step timed out)
    and the restart wait 180 s for a backup that had become live. Here the primary is
    SIGKILLed as the backup's process starts."""
    pair.kill(1)
    primary = pair.pids[0]
    assert primary is not None
    _restart_killing(pair, 1, primary)
    assert pair.pids[0] != primary and pair.nodes()[0].running, "the primary was not started again"
    _wait_whole(pair)


def _wait_whole(pair: ArtemisCluster) -> None:
    wait_until(
        lambda: [n.role for n in pair.nodes()] == ["live", "backup"],
        60,
        "the primary live and the backup a backup again",
    )


def _restart_killing(pair: ArtemisCluster, node: int, victim: int) -> None:
    """``pair.restart(node)``, SIGKILLing process ``victim`` as ``node``'s process starts."""

    def kill_once_started() -> None:
        wait_until(lambda: pair.pids[node] is not None, 30, f"node {node}'s process started")
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_started)
    killer.start()
    try:
        pair.restart(node)
    finally:
        killer.join(30)


def _started_at(pid: int) -> str | None:
    # The start time tells a process from a later one (or a thread) given the same id.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def test_stop_leaves_no_process(artemis: ArtemisCluster) -> None:
    before = {n.pid: _started_at(n.pid) for n in artemis.nodes() if n.pid is not None}
    artemis.stop()
    assert [n.running for n in artemis.nodes()] == [False, False]
    survivors = [pid for pid, t in before.items() if t is not None and _started_at(pid) == t]
    assert not survivors, f"still running after stop(): {survivors}"


def test_doctor_reports_roles_and_what_the_client_does_with_the_list(
    pair: ArtemisCluster,
) -> None:
    """``msgsafe doctor`` on the live and the backup: the live serves and advertises the
    backup, which the client adds to its rotation (REPLACE keeps the live); the backup
    does not listen while its live runs. With ``failover_allow`` naming only the live,
    the advertised backup is reported as not followed."""
    from msgsafe.adapters.amqp10.check import check_amqp10
    from msgsafe.endpoints import parse_url

    live, backup = (f"127.0.0.1:{p}" for p in pair.ports)
    base = f"amqp10://{pair.user}:{pair.password}@"
    findings = check_amqp10(parse_url(f"{base}{live},{backup}"))
    roles = {f.subject: f.value for f in findings if f.setting == "role"}
    print(f"[doctor] {roles}")
    assert roles[f"peer {live}"] == "serving (apache-activemq-artemis)"
    assert roles[f"peer {backup}"].startswith("unreachable")
    plan = next(f for f in findings if f.setting == "client fail-over plan")
    print(f"[doctor] {plan.value} | {plan.why}")
    assert plan.value == f"replace: tries {backup}, {live}"
    only_live = check_amqp10(parse_url(f"{base}{live}?failover_allow={live}"))
    plan = next(f for f in only_live if f.setting == "client fail-over plan")
    assert plan.value == f"replace: tries {live}" and backup in plan.why
