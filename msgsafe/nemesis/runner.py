"""One nemesis run: a real cluster, producer and consumer processes, the schedule's
faults, then heal, drain, read back and check.

:func:`run` does, in order:

1. draws the schedule from the seed (:func:`msgsafe.nemesis.schedule.draw`) and writes it
   to ``DIR/schedule.json``;
2. starts the cluster through :func:`msgsafe.cluster.create` (what ``msgsafe cluster up``
   runs) in ``DIR/cluster`` (Kafka: :class:`~msgsafe.nemesis.proxied_kafka.ProxiedKafka`,
   the same launcher with a listener per node that advertises its proxy) and a
   :class:`~msgsafe.testing.faultproxy.FaultProxy` per node, through which the
   producers reach the cluster (the consumer does not: it reads back directly);
3. spawns ``producers`` producer processes (each with its own SQLite outbox, keyed
   sends) and one consumer process (:mod:`msgsafe.nemesis.worker`);
4. applies each window of the schedule at its time: broker node SIGKILL and restart,
   SIGSTOP and SIGCONT; producer SIGKILL and a new process on the same outbox, producer
   SIGSTOP and SIGCONT (its heartbeats stop, its confirms wait); a black hole (both
   ways, or one way: the producers' bytes to the node vanish while the node's still
   arrive, or the reverse, so a send reaches the broker and its confirm does not), a
   slow link (latency, bandwidth) or resets on one node's proxy; as root, a full disk
   under one producer's outbox (each on a tmpfs of its own, :data:`DISK_SIZE`, filled
   by a ballast file, freed at the window's end); on kinds whose brokers allow it
   (``KINDS[kind]["leader"]``), leadership moved on purpose
   (:mod:`msgsafe.nemesis.leaders`, on a thread of its own: the tools take seconds to
   start, which must not delay the schedule). Actions run one after
   another on this thread (a cluster is driven from one thread), so a slow restart
   delays the next action; the rest of the schedule is then delayed as much (its clock
   waits for the runner), so that every window lasts at least as long as drawn and keeps
   its order with the others (a forwarder's pause stays longer than its lease however
   late it began), and the run lasts that much longer. The history has the times the
   actions really happened;
5. heals everything (proxies, paused and killed nodes), records ``heal``, stops the
   producers with SIGTERM (each drains its outbox first), waits until the consumer has
   received every receipted id (or ``readback_timeout``), stops it;
6. checks the history (:func:`msgsafe.nemesis.checker.check`), writes ``report.json``
   and ``picture.svg``, stops the cluster. A failing run keeps the cluster's directory
   (broker logs, data) in ``DIR``, and so does one whose outboxes recovered slowly
   (:data:`STALL_KEEP_S`); any other passing one removes it and keeps the history.

With ``outbox="postgres"`` (``msgsafe nemesis KIND --outbox postgres``) the producers
share one PostgreSQL outbox instead: a primary and its synchronous standby
(:class:`~msgsafe.cluster.postgres.PostgresCluster`, what ``msgsafe cluster up postgres
--nodes 2`` runs) in ``DIR/pg``, a table of the run's own with a short lease
(:data:`PG_LEASE_S`). The producers store into it and do not forward it
(``Producer(forward=False)``); ``forwarders`` ``msgsafe outbox forward`` processes (each
through the proxies, as a producer) drain it to the broker. The schedule adds two roles:
``database`` (the primary SIGKILLed and the standby promoted; at the window's end the old
primary is rebuilt as the new one's standby) and ``forwarder`` (SIGKILL and a new
process; SIGSTOP past its lease and SIGCONT). The runner records the table's depth
(``history/outbox.jsonl``); at the end it stops the producers, waits until the
forwarders have emptied the table, then stops them.

Progress goes to the ``say`` callback, one line at a time; the library itself prints
nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from msgsafe import __version__
from msgsafe import cluster as clusters
from msgsafe.cluster.base import ClusterError, LocalCluster
from msgsafe.errors import MsgsafeError
from msgsafe.nemesis import checker, history, leaders, picture, schedule
from msgsafe.nemesis.proxied_kafka import ProxiedKafka
from msgsafe.nemesis.worker import Spec
from msgsafe.testing.faultproxy import FaultProxy

if TYPE_CHECKING:
    from msgsafe.cluster.postgres import PostgresCluster

__all__ = [
    "KINDS",
    "OUTBOXES",
    "PG_LEASE_S",
    "STALL_KEEP_S",
    "Outcome",
    "Plan",
    "fault_targets",
    "keeps_brokers_files",
    "replay_command",
    "run",
]

#: The AMQP 1.0 clients' options (as the chaos matrix's). ``failover_merge=ignore``: the
#: clients use only the URL's hosts, the proxies, and never a node's own address that an
#: Artemis primary advertises (``failover-server-list``), so every byte between a producer
#: and a node passes a proxy.
_AMQP10: dict[str, Any] = {
    "connect_timeout": 1.0,
    "confirm_timeout": 2.0,
    "heartbeat": 2.0,
    "reconnect_maximum": 1.0,
    "failover_merge": "ignore",
}


def _proxied_kafka(nodes: int, dir: Path) -> tuple[LocalCluster, list[FaultProxy]]:
    """A Kafka cluster whose nodes advertise a proxy each (:class:`ProxiedKafka`), and
    those proxies."""
    kafka = ProxiedKafka(nodes, dir)
    proxies = [
        FaultProxy("127.0.0.1", up, listen_port=port, connect_timeout=2.0)
        for up, port in zip(kafka.proxied_ports, kafka.proxy_ports, strict=True)
    ]
    return kafka, proxies


def _kafka_topic(cluster: LocalCluster, topic: str) -> None:
    """The run's topic, 3 partitions on every node, and its consumer group started at
    offset 0: none of the run is skipped."""
    from msgsafe.adapters.kafka.positions import start_group_at_beginning
    from msgsafe.cluster.kafka import KafkaCluster
    from msgsafe.endpoints import parse_url

    assert isinstance(cluster, KafkaCluster)
    cluster.create_topic(topic, partitions=3)
    start_group_at_beginning(parse_url(cluster.url), topic, topic)


def _kafka_mover(cluster: LocalCluster, topic: str) -> leaders.Mover:
    from msgsafe.cluster.kafka import KafkaCluster, fetch_tools

    assert isinstance(cluster, KafkaCluster)
    fetch_tools()  # kafka-reassign-partitions: fetched once, as the brokers' own jars
    return leaders.KafkaMover(cluster, topic)


def _rabbit_mover(cluster: LocalCluster, queue: str) -> leaders.Mover:
    from msgsafe.cluster.rabbitmq import RabbitCluster

    assert isinstance(cluster, RabbitCluster)
    return leaders.RabbitMover(cluster, queue)


def _qpid_mover(cluster: LocalCluster, queue: str) -> leaders.Mover:
    from msgsafe.cluster.qpid import QpidCluster

    assert isinstance(cluster, QpidCluster)
    return leaders.QpidMover(cluster)


def _ordered_rabbitmq_queue(cluster: LocalCluster, queue: str) -> None:
    """Declare ``queue`` a quorum queue with a single active consumer. Per-key order by
    first arrival needs it on RabbitMQ: a consumer whose node is paused or cut off keeps
    what the queue handed it until that node is back or declared down, and without it
    the consumer's next connection, on another node, is handed later messages of the
    same keys first (seed 1796604344: 100 out of order, none lost)."""
    import pika

    from msgsafe.cluster.rabbitmq import RabbitCluster

    assert isinstance(cluster, RabbitCluster)
    conn = pika.BlockingConnection(pika.URLParameters(cluster.node_url(0)))
    try:
        conn.channel().queue_declare(
            queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-single-active-consumer": True},
        )
    finally:
        conn.close()


#: Kinds the nemesis can run: the options their clients use, how many nodes, and what
#: the faults mean on that broker's shape (``limits``: what the schedule's description
#: states). NOTE: timeouts are short so that a fault is noticed within seconds, as in the
#: chaos matrix.
KINDS: dict[str, dict[str, Any]] = {
    "rabbitmq": {
        # The queue is declared before any client starts (``prepare``), by no client.
        "prepare": _ordered_rabbitmq_queue,
        # The leader role: one target, whichever node leads the queue (drained).
        "leader": (_rabbit_mover, 1),
        "options": {
            "connect_timeout": 1.0,
            "confirm_timeout": 2.0,
            "heartbeat": 2,
        },
        "proxied": True,
        "nodes": 3,
        "limits": (
            "RabbitMQ: 3 nodes, a quorum queue with a single active consumer; one broker "
            "fault at a time keeps a majority.",
            "Network faults are between the producers and one node (a proxy per node), "
            "not between the nodes.",
            "A leader move drains the node that leads the queue (rabbitmq-upgrade drain: "
            "its quorum leaderships move to another node, its client connections close) "
            "and revives it at the window's end; RabbitMQ 3.10 has no command that hands "
            "leadership to a chosen node.",
        ),
    },
    "kafka": {
        # A cluster whose nodes advertise a proxy each, then the run's topic and group.
        "launch": _proxied_kafka,
        "prepare": _kafka_topic,
        # The leader role: a target per node, the node every partition is moved to.
        "leader": (_kafka_mover, 0),
        "options": {"connect_timeout": 1.0, "confirm_timeout": 3.0},
        "proxied": True,
        "nodes": 3,
        "limits": (
            "Kafka: 3 KRaft nodes, replication factor 3, min.insync.replicas 2; one broker "
            "fault at a time keeps a majority.",
            "Network faults are between the producers and one node (each node advertises "
            "its proxy), not between the nodes.",
            "A leader move to node N reorders every partition's replicas so that N comes "
            "first (kafka-reassign-partitions; no data moves) and runs a preferred leader "
            "election; its end restores the order as created and elects again. A move to a "
            "node a broker fault hits at the time is not drawn.",
        ),
    },
    "qpid": {
        # The leader role: a target per node, the node mastership is handed to.
        "leader": (_qpid_mover, 0),
        "options": dict(_AMQP10),
        "proxied": True,
        "nodes": 3,
        "limits": (
            "Qpid Broker-J: a BDB HA group of 3 (one master, two replicas; a commit needs "
            "2 of 3); one broker fault at a time keeps a quorum. A master killed makes the "
            "others elect a new one.",
            "A pause (3-12 s) stays under Berkeley DB JE's replica timeout (30 s): a paused "
            "master keeps its role, its clients wait (sends end stored and are forwarded).",
            "Network faults are between the producers and one node (the URL names every "
            "node's proxy; replicas refuse connections), not between the nodes: a partition "
            "of the group itself is tests/chaos/test_qpid_partition.py (network namespaces).",
            "A leader move to node N transfers the group's mastership to N (its virtual host "
            "node's role set to MASTER through the REST API); its end hands it back to the "
            "master before. A move to a node a broker fault hits at the time is not drawn.",
        ),
    },
    "artemis": {
        "options": dict(_AMQP10),
        "proxied": True,
        "nodes": 2,
        "limits": (
            "ActiveMQ Artemis: a primary/backup pair with replication (node 0 primary, "
            "node 1 backup); one broker fault at a time. A primary killed is a fail-over to "
            "the backup, its restart a fail-back.",
            "A pause (3-12 s) stays under the pair's failure check (30 s): a paused primary "
            "keeps its role. A longer one is not drawn: a pair has no third voter, the "
            "backup takes over and both stay active once the primary resumes (split brain, "
            "AMQ222294), which Artemis replication without a quorum cannot prevent.",
            "Network faults are between the producers and one node; the clients ignore the "
            "primary's failover-server-list so that no connection bypasses the proxies.",
            "Known broker loss: the last step of a backup's synchronization sometimes never "
            "gets its answer; the primary then shuts down (AMQ229114) and the backup takes "
            "over without what the primary accepted meanwhile "
            "(scripts/artemis_sync_stall.py reproduces the stall).",
        ),
    },
}


#: The shared PostgreSQL outbox's lease (``lease=`` in its URL): a forwarder paused for
#: longer (every pause the schedule draws: 3-12 s) has its keys taken over.
PG_LEASE_S = 2.0
#: How long a put rides out a fail-over of the database before it fails
#: (``write_timeout=``), and the producers' ``send_timeout`` above it, as docs/fleet.md
#: advises.
PG_WRITE_TIMEOUT_S = 20.0
PG_SEND_TIMEOUT_S = 40.0

#: The size of the tmpfs under each producer's SQLite outbox when the schedule has disk
#: faults. NOTE: not smaller: SQLite's WAL grows to 1000 pages (4 MiB) before its
#: automatic checkpoint (the suite's disk-full fixture says the same).
DISK_SIZE = "8m"

#: The outboxes a run can use, with what their faults mean (the report states it).
OUTBOXES: dict[str, tuple[str, ...]] = {
    "sqlite": (),
    "postgres": (
        "Outbox: one PostgreSQL table shared by every producer (they store and do not "
        "forward), a primary and a synchronous standby; a database fault kills the "
        "primary and promotes the standby (its end rebuilds the old primary as the new "
        "one's standby), one at a time.",
        f"Forwarders: `msgsafe outbox forward` processes through the proxies, lease "
        f"{PG_LEASE_S:g} s: a forwarder paused (3-12 s) is paused past its lease, and "
        "another takes its keys over; a killed one is started again at the window's end.",
    ),
}


#: What a run whose producers' outboxes sit on size-limited mounts adds to its
#: description.
DISK_LINES = (
    f"Disk: each producer's SQLite outbox is on a tmpfs of its own ({DISK_SIZE}; memory, "
    "so the producers take require='any'); a disk fault fills it with a ballast file "
    "and its end deletes the file. A send() that cannot be stored raises OutboxFull "
    "(refused: never receipted, so never lost; in doubt, maybe_delivered, when the "
    "broker did not answer the send before it); the outbox keeps whatever space it "
    "already holds, so a full disk bites when the outbox grows (during an outage).",
)
#: What a run without them says.
NO_DISK_LINE = (
    "Disk faults are not drawn: they need a size-limited tmpfs under each outbox, which "
    "mount(8) makes only as root (--no-disk-faults, or a PostgreSQL outbox)."
)


def can_mount() -> bool:
    """Whether this process can mount a tmpfs: root and mount(8)/umount(8) found."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("mount", "umount"))


def fault_targets(plan: Plan) -> dict[str, int]:
    """What each role of the schedule can hit in ``plan``'s run (role -> how many)."""
    targets = {
        "broker": plan.nodes,
        "producer": plan.producers,
        "network": plan.nodes if KINDS[plan.kind]["proxied"] else 0,
    }
    leader = KINDS[plan.kind].get("leader")
    if leader is not None and plan.nodes > 1:
        # 0: a target per node (the node moved to); else that many.
        targets["leader"] = leader[1] or plan.nodes
    if plan.disk_faults:
        targets["disk"] = plan.producers
    if plan.outbox == "postgres":
        # One target: whichever node is the primary at the time.
        targets["database"] = 1
        targets["forwarder"] = plan.forwarders
    return targets


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run: ``kind`` for ``minutes`` of faults from ``seed``, in ``dir``."""

    kind: str
    minutes: float
    seed: int
    dir: Path
    #: One per node by default: each starts on its own node (see producer_url).
    producers: int = 3
    #: 0: the kind's own (``KINDS[kind]["nodes"]``: 3; an Artemis pair: 2).
    nodes: int = 0
    rate: float = 40.0
    readback_timeout: float = 180.0
    #: ``sqlite``: an outbox file per producer, forwarded by the producer; ``postgres``:
    #: one shared PostgreSQL outbox drained by ``forwarders`` forwarder processes.
    outbox: str = "sqlite"
    forwarders: int = 2
    #: Each producer's SQLite outbox on a size-limited tmpfs, and ``disk`` faults that
    #: fill it. None: when this process can mount one (:func:`can_mount`) and the outbox
    #: is SQLite; the plan holds the answer (the report and the replay state it).
    disk_faults: bool | None = None

    def __post_init__(self) -> None:
        if self.nodes == 0 and self.kind in KINDS:
            object.__setattr__(self, "nodes", KINDS[self.kind]["nodes"])
        if self.outbox not in OUTBOXES:
            raise ValueError(f"unknown outbox {self.outbox!r} (known: {', '.join(OUTBOXES)})")
        if self.outbox == "postgres" and self.forwarders < 1:
            raise ValueError("a PostgreSQL outbox needs at least one forwarder")
        if self.disk_faults is None:
            object.__setattr__(self, "disk_faults", self.outbox == "sqlite" and can_mount())
        elif self.disk_faults and self.outbox != "sqlite":
            raise ValueError(
                "disk faults fill a producer's SQLite outbox: not with --outbox postgres"
            )


@dataclass
class Outcome:
    """What a run found: the verdict, where its files are, what went wrong on the way."""

    plan: Plan
    verdict: checker.Verdict
    schedule: schedule.Schedule
    notes: list[str] = field(default_factory=list)
    #: When the run ended, UTC, to the minute ("" when not run).
    finished: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.notes

    def report(self) -> dict[str, Any]:
        """``report.json``: the plan, the schedule's windows, the verdict, the replay."""
        plan = asdict(self.plan)
        plan["dir"] = str(self.plan.dir)
        return {
            "ok": self.ok,
            "finished": self.finished,
            "msgsafe": __version__,
            "plan": plan,
            "replay": replay_command(self.plan),
            "faults": len(self.schedule.windows),
            "schedule": self.schedule.to_json(),
            "verdict": self.verdict.to_json(),
            "notes": self.notes,
            "history": str(self.plan.dir / "history"),
            "picture": str(self.plan.dir / "picture.svg"),
        }


def replay_command(plan: Plan) -> str:
    """The command that draws the same schedule again."""
    extra = "" if plan.producers == 3 else f" --producers {plan.producers}"
    if plan.nodes != KINDS.get(plan.kind, {}).get("nodes", plan.nodes):
        extra += f" --nodes {plan.nodes}"
    if plan.outbox != "sqlite":
        extra += f" --outbox {plan.outbox}"
        if plan.forwarders != 2:
            extra += f" --forwarders {plan.forwarders}"
    elif not plan.disk_faults:
        extra += " --no-disk-faults"
    return f"msgsafe nemesis {plan.kind} --minutes {plan.minutes:g} --seed {plan.seed}{extra}"


class _Tally:
    """Reads the run's history files as they grow: which ids were receipted and received."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.offsets: dict[Path, int] = {}
        self.receipted: set[str] = set()
        self.received: set[str] = set()
        self.stored = 0

    def poll(self) -> None:
        for path in sorted(self.dir.glob("*.jsonl")):
            with path.open(encoding="utf-8") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            done = data.rfind("\n") + 1  # a line being written waits for the next poll
            self.offsets[path] = self.offsets.get(path, 0) + len(data[:done].encode())
            for e in history.read(data[:done].splitlines()):
                if e["e"] == "receipted":
                    self.receipted.add(e["id"])
                    self.stored += e["status"] == "stored"
                elif e["e"] == "received":
                    self.received.add(e["id"])

    @property
    def unseen(self) -> int:
        return len(self.receipted - self.received)


class _Run:
    def __init__(self, plan: Plan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.say = say
        self.dir = plan.dir
        self.hist_dir = plan.dir / "history"
        self.log_dir = plan.dir / "logs"
        self.setup = KINDS[plan.kind]
        self.cluster: LocalCluster | None = None
        self.proxies: list[FaultProxy] = []
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.incarnations: dict[str, int] = {}
        self.notes: list[str] = []
        self.destination = f"nemesis-{plan.seed}"
        self.group = f"nemesis-{plan.seed}"
        self.next_status = 15.0
        self.t0 = 0.0
        self.tally = _Tally(self.hist_dir)
        self.own: history.History | None = None
        #: The shared outbox's database (``outbox="postgres"``), its table and URL.
        self.pg: PostgresCluster | None = None
        self.table = f"nemesis_{plan.seed}"
        self.store_url = ""
        self.depth_stop = threading.Event()
        self.depth_thread: threading.Thread | None = None
        self.depth_seen: int | None = None
        #: Workers stopped on purpose at the end: not started again when they exit.
        self.stopped: set[str] = set()
        #: The tmpfs mounted under the producers' outboxes (disk faults).
        self.mounts: list[Path] = []
        #: The kind's leadership mover (a leader role), and its move under way.
        self.mover: leaders.Mover | None = None
        self.moving: threading.Thread | None = None
        #: The windows in effect now, and how many broker windows have begun so far.
        self.active: set[schedule.Window] = set()
        self.broker_faults_begun = 0

    # --- set up ------------------------------------------------------------------------

    def start_cluster(self) -> LocalCluster:
        plan = self.plan
        self.say(f"starting {plan.kind} ({plan.nodes} nodes) in {self.dir / 'cluster'}")
        started = time.monotonic()
        cluster: LocalCluster
        launch = self.setup.get("launch")
        if launch is not None:
            cluster, self.proxies = launch(plan.nodes, self.dir / "cluster")
        else:
            cluster = clusters.create(plan.kind, dir=self.dir / "cluster", nodes=plan.nodes)
            self.proxies = [
                FaultProxy(node.host, node.port, connect_timeout=2.0) for node in cluster.nodes()
            ]
        self.cluster = cluster
        cluster.start()
        self.say(f"{plan.kind} up in {time.monotonic() - started:.1f} s: {cluster.url}")
        prepare = self.setup.get("prepare")
        if prepare is not None:
            prepare(cluster, self.destination)
        if "leader" in fault_targets(plan):
            self.mover = self.setup["leader"][0](cluster, self.destination)
        return cluster

    def mount_disks(self) -> None:
        """A tmpfs of :data:`DISK_SIZE` under each producer's outbox (disk faults)."""
        for i in range(self.plan.producers):
            mount = self.dir / "outboxes" / f"p{i}"
            mount.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise ClusterError(
                    f"cannot mount a tmpfs under {mount} (disk faults need root; "
                    f"--no-disk-faults runs without them): {done.stderr.strip()}"
                )
            self.mounts.append(mount)

    def unmount_disks(self) -> None:
        """Unmount the outboxes' tmpfs, their files copied to ``outboxes-kept`` first (a
        failing run keeps them, as its cluster's files; a passing one deletes them)."""
        for mount in self.mounts:
            with contextlib.suppress(OSError):
                shutil.copytree(
                    mount,
                    self.dir / "outboxes-kept" / mount.name,
                    ignore=shutil.ignore_patterns("ballast"),
                    dirs_exist_ok=True,
                )
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        self.mounts.clear()

    def fill_disk(self, producer: int) -> int:
        """Fill producer's tmpfs with a ballast file up to ENOSPC; the bytes written.

        NOTE: unbuffered (``os.write``): a buffered file keeps the part of a chunk the
        disk did not take and raises ENOSPC again when it is closed (seed 205468141 on
        Artemis: the fault action failed after the disk was full)."""
        path = self.dir / "outboxes" / f"p{producer}" / "ballast"
        chunk = b"\0" * 65536
        written = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                n = os.write(fd, chunk)
                if n <= 0:
                    break
                written += n
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        return written

    def free_disk(self, producer: int) -> None:
        (self.dir / "outboxes" / f"p{producer}" / "ballast").unlink(missing_ok=True)

    def move_leader(self, w: schedule.Window, on: bool) -> None:
        """Start the move (``on``) or the move back on a thread of its own: the tools
        take seconds (a JVM, an Erlang VM), which must not delay the schedule. A move
        waits for the previous one. A move the brokers refuse while a broker fault is in
        effect (at any time during the move) is declined (noted in the history, not a
        failure); otherwise, or any other exception (a defect), it fails the run, as any
        fault action that fails."""
        assert self.mover is not None and self.own is not None
        previous, mover, own = self.moving, self.mover, self.own

        def work() -> None:
            if previous is not None:
                previous.join()
            # A broker fault in effect at any time during the move: at its start, at its
            # failure, or one that began and ended meanwhile (seed 1449592700: a
            # reassignment that waited on a paused node failed just after its resume).
            began = self.broker_faults_begun
            under = any(a.role == "broker" for a in self.active)
            try:
                done = mover.move(w.target) if on else mover.back(w.target)
            # Any exception: one escaping this thread would end it unseen, the run passing.
            except Exception as exc:
                text = f"{w.name} {'on' if on else 'off'}: {type(exc).__name__}: {exc}"
                text = text.splitlines()[0]
                refused = isinstance(exc, (ClusterError, MsgsafeError, OSError))
                under = (
                    under
                    or self.broker_faults_begun != began
                    or any(a.role == "broker" for a in self.active)
                )
                if refused and under:
                    own.write("note", text=f"declined under a broker fault: {text}")
                    self.say(f"declined under a broker fault: {text}")
                else:
                    self.notes.append(text)
                    own.write("note", text=text)
                    self.say(text)
                return
            own.write("moved", name=w.name, on=on, what=done)
            self.say(f"[{self.elapsed():6.1f}s] {done}")

        self.moving = threading.Thread(target=work, name="nemesis-leader", daemon=True)
        self.moving.start()

    def start_outbox(self) -> None:
        """The shared PostgreSQL outbox (``outbox="postgres"``): a primary and its
        synchronous standby, and a thread that records the table's depth."""
        from msgsafe.cluster.postgres import PostgresCluster

        self.say(f"starting PostgreSQL (primary + standby) in {self.dir / 'pg'}")
        started = time.monotonic()
        self.pg = PostgresCluster(nodes=2, dir=self.dir / "pg")
        self.pg.start()
        self.store_url = (
            f"{self.pg.url}&table={self.table}&lease={PG_LEASE_S:g}"
            f"&write_timeout={PG_WRITE_TIMEOUT_S:g}"
        )
        self.say(f"PostgreSQL up in {time.monotonic() - started:.1f} s: table {self.table}")
        self.depth_thread = threading.Thread(
            target=self.record_depth, name="nemesis-outbox-depth", daemon=True
        )
        self.depth_thread.start()

    def record_depth(self) -> None:
        """Every half second, the shared table's row count in ``history/outbox.jsonl``
        (none while no primary answers, nor before a producer made the table)."""
        import psycopg

        assert self.pg is not None
        url = self.pg.url
        conn: Any = None
        with history.History(self.hist_dir / "outbox.jsonl", "outbox") as own:
            while not self.depth_stop.wait(0.5):
                try:
                    if conn is None:
                        conn = psycopg.connect(url, connect_timeout=2, autocommit=True)
                    row = conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
                except psycopg.errors.UndefinedTable:
                    continue
                except psycopg.Error:
                    with contextlib.suppress(psycopg.Error):
                        if conn is not None:
                            conn.close()
                    conn = None
                    continue
                self.depth_seen = int(row[0])
                own.write("depth", outbox="pg", n=self.depth_seen)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def producer_url(self, index: int) -> str:
        """The URL of producer ``index``: through the proxies where the kind allows, its
        host list rotated so that the producers start on different nodes."""
        assert self.cluster is not None
        url = self.cluster.url
        if not self.proxies:
            return url
        scheme, _, rest = url.partition("://")
        creds, _, hosts = rest.rpartition("@")
        tail = hosts[hosts.find("/") :] if "/" in hosts else ""
        addrs = [f"127.0.0.1:{p.port}" for p in self.proxies]
        k = index % len(addrs)
        rotated = ",".join(addrs[k:] + addrs[:k])
        return f"{scheme}://{creds}@{rotated}{tail}" if creds else f"{scheme}://{rotated}{tail}"

    def spawn(self, name: str) -> None:
        """Start (or start again) the worker ``name``: ``p0``.., ``f0``.. or ``c``."""
        assert self.cluster is not None
        n = self.incarnations.get(name, -1) + 1
        self.incarnations[name] = n
        if name.startswith("f"):
            self.spawn_forwarder(name)
            return
        before = [str(self.hist_dir / f"{name}.{i}.jsonl") for i in range(n)]
        options = dict(self.setup["options"])
        if name == "c":
            spec = Spec(
                role="consume",
                name=name,
                url=self.cluster.url,
                destination=self.destination,
                history=str(self.hist_dir / f"{name}.{n}.jsonl"),
                options=options,
                group=self.group,
            )
        else:
            spec = Spec(
                role="produce",
                name=name,
                url=self.producer_url(int(name[1:])),
                destination=self.destination,
                history=str(self.hist_dir / f"{name}.{n}.jsonl"),
                options=options,
                outbox=str(self.outbox_path(name)),
                rate=self.plan.rate,
                before=before,
                require="any" if self.plan.disk_faults else "durable",
            )
            if self.pg is not None:
                # The shared table: stored, never forwarded by the producer itself.
                spec = replace(
                    spec, outbox=self.store_url, send_timeout=PG_SEND_TIMEOUT_S, forward=False
                )
        log: IO[bytes]
        with (self.log_dir / f"{name}.log").open("ab") as log:
            self.workers[name] = subprocess.Popen(
                [sys.executable, "-m", "msgsafe.nemesis.worker", json.dumps(asdict(spec))],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )

    def outbox_path(self, name: str) -> Path:
        """Producer ``name``'s SQLite outbox: on its own tmpfs with disk faults."""
        if self.plan.disk_faults:
            return self.dir / "outboxes" / name / f"{name}.db"
        return self.dir / "outboxes" / f"{name}.db"

    def spawn_forwarder(self, name: str) -> None:
        """``msgsafe outbox forward`` on the shared table, as a service runs it: the
        URLs from its environment (never on its command line), through the proxies (its
        host list rotated as a producer's), the kind's client options."""
        args = [
            sys.executable,
            "-m",
            "msgsafe",
            "outbox",
            "forward",
            "env:NEMESIS_OUTBOX_URL",
            "--url",
            "env:NEMESIS_BROKER_URL",
            "--json",
            "--interval",
            "5",
        ]
        for option, value in self.setup["options"].items():
            args += ["-o", f"{option}={value}"]
        env = {
            **os.environ,
            "NEMESIS_OUTBOX_URL": self.store_url,
            "NEMESIS_BROKER_URL": self.producer_url(int(name[1:])),
            # Its warnings in its log, as the workers': a lease lost, a connection lost.
            "MSGSAFE_LOG_LEVEL": "WARNING",
        }
        log: IO[bytes]
        with (self.log_dir / f"{name}.log").open("ab") as log:
            self.workers[name] = subprocess.Popen(
                args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env
            )

    # --- faults ------------------------------------------------------------------------

    def apply(self, w: schedule.Window, on: bool) -> None:
        assert self.cluster is not None and self.own is not None
        self.own.write("fault", name=w.name, on=on)
        (self.active.add if on else self.active.discard)(w)
        if on and w.role == "broker":
            self.broker_faults_begun += 1
        if w.role == "disk":
            if on:
                self.own.write("ballast", name=w.name, bytes=self.fill_disk(w.target))
            else:
                self.free_disk(w.target)
        elif w.role == "leader":
            self.move_leader(w, on)
        elif w.role == "broker":
            if w.action == "kill":
                self.cluster.kill(w.target) if on else self.cluster.restart(w.target)
            elif on:
                self.cluster.pause(w.target)
            else:
                self.cluster.resume(w.target)
        elif w.role == "database":
            self.fail_over(on)
        elif w.role in ("producer", "forwarder"):
            name = f"{w.role[0]}{w.target}"
            if w.action == "pause":
                self.workers[name].send_signal(signal.SIGSTOP if on else signal.SIGCONT)
            elif on:
                self.workers[name].send_signal(signal.SIGKILL)
                self.workers[name].wait()
            else:
                self.spawn(name)
        elif w.role == "network":
            proxy = self.proxies[w.target]
            if not on:
                proxy.heal()
            elif w.action == "blackhole":
                proxy.blackhole()
            elif w.action == "blackhole-to-broker":
                proxy.blackhole(direction="upstream")
            elif w.action == "blackhole-to-client":
                proxy.blackhole(direction="downstream")
            elif w.action == "latency":
                proxy.latency(0.5)
            elif w.action == "bandwidth":
                proxy.bandwidth(20_000)
            else:
                proxy.reset()

    def fail_over(self, on: bool) -> None:
        """On: SIGKILL the primary, promote the standby. Off: start the old primary
        again, rebuilt as the new primary's synchronous standby."""
        assert self.pg is not None
        if on:
            old = self.pg.primary
            self.pg.kill(old)
            self.pg.promote(1 - old)
        else:
            self.heal_database()

    def play(self, events: Sequence[tuple[float, bool, schedule.Window]]) -> float:
        """Apply ``events`` (:meth:`~msgsafe.nemesis.schedule.Schedule.events`) in
        order, each at its time plus how far behind the runner has fallen (an action
        that took long delays the rest, so no window is cut short); return that delay."""
        behind = 0.0
        for t, on, window in events:
            self.wait_until(t + behind)
            late = self.elapsed() - t - behind
            if late > 1.0:
                self.say(f"[{self.elapsed():6.1f}s] the schedule waits {late:.1f} s for the runner")
            behind += max(0.0, late)
            self.say(f"[{self.elapsed():6.1f}s] {window.name} {'on' if on else 'off'}")
            with _noted(self, window.name):
                self.apply(window, on)
        return behind

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def wait_until(self, t: float) -> None:
        """Let the run go on until ``t`` s after its start: a status line every 15 s, and
        a worker that died by itself started again (and noted)."""
        while (left := t - self.elapsed()) > 0:
            time.sleep(min(left, 1.0))  # the schedule's clock, not synchronisation
            self.watch_workers()
            if self.elapsed() >= self.next_status:
                self.next_status += 15.0
                self.status()

    def status(self) -> None:
        self.tally.poll()
        self.say(
            f"[{self.elapsed():6.1f}s] receipted={len(self.tally.receipted)} "
            f"(stored {self.tally.stored}) received={len(self.tally.received)} "
            f"unseen={self.tally.unseen}"
        )

    def watch_workers(self) -> None:
        assert self.own is not None
        for name, proc in list(self.workers.items()):
            code = proc.poll()
            if code is not None and code != -signal.SIGKILL and name not in self.stopped:
                note = f"worker {name} exited with {code} by itself (log: logs/{name}.log)"
                self.notes.append(note)
                self.own.write("note", text=note)
                self.say(note)
                self.spawn(name)

    # --- the end -----------------------------------------------------------------------

    def heal(self) -> None:
        assert self.cluster is not None and self.own is not None
        self.say("healing: proxies, paused and killed nodes")
        for proxy in self.proxies:
            proxy.heal()
        for mount in self.mounts:
            (mount / "ballast").unlink(missing_ok=True)
        from msgsafe.cluster.rabbitmq import RabbitCluster

        if isinstance(self.cluster, RabbitCluster):  # also a partition a long SIGSTOP left
            self.cluster.heal()
        else:
            for i, node in enumerate(self.cluster.nodes()):
                if node.role == "paused":
                    self.cluster.resume(i)
                elif not node.running:
                    self.cluster.restart(i)
        for name, proc in list(self.workers.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a no-op unless a window left it paused
            elif name.startswith(("p", "f")):
                self.spawn(name)  # a producer or forwarder killed by the last window
        if self.pg is not None:
            self.heal_database()
        if self.mover is not None:
            if self.moving is not None:
                self.moving.join(180)
            self.mover.heal()
        self.own.write("heal")

    def heal_database(self) -> None:
        """Both PostgreSQL nodes running, one of them the primary."""
        assert self.pg is not None
        nodes = self.pg.nodes()
        if not nodes[self.pg.primary].running:
            standby = 1 - self.pg.primary
            if nodes[standby].running:
                self.pg.promote(standby)
        for i, node in enumerate(self.pg.nodes()):
            if node.role == "paused":
                self.pg.resume(i)
            elif not node.running:
                self.pg.restart(i)

    def reap(self, procs: dict[str, subprocess.Popen[bytes]], timeout: float, failed: str) -> None:
        """Wait for each of ``procs`` (signalled already) up to ``timeout`` seconds, then
        SIGKILL it; a non-zero exit is noted as ``{role} {name} {failed} (exit N)``."""
        for name, proc in procs.items():
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                role = "forwarder" if name.startswith("f") else "producer"
                self.notes.append(f"{role} {name} {failed} (exit {code})")

    def drain_shared_outbox(self, producers: dict[str, subprocess.Popen[bytes]]) -> None:
        """The producers stopped (they do not drain a shared outbox), wait until the
        forwarders have emptied the table, then stop them."""
        self.reap(producers, 60, "did not stop cleanly")
        self.say("waiting for the forwarders to empty the shared outbox")
        deadline = time.monotonic() + 240.0
        self.depth_seen = None
        while self.depth_seen != 0 and time.monotonic() < deadline:
            time.sleep(0.5)  # polling the depth the sampler records, against the deadline
            self.watch_workers()
        if self.depth_seen != 0:
            self.notes.append(f"the shared outbox still held {self.depth_seen} rows after 240 s")
        forwarders = {n: p for n, p in self.workers.items() if n.startswith("f")}
        self.stopped.update(forwarders)
        for proc in forwarders.values():
            proc.send_signal(signal.SIGTERM)
        self.reap(forwarders, 90, "did not stop cleanly")
        time.sleep(1.0)  # the clock of the depth series: one more sample of the empty table
        self.stop_recording_depth()

    def stop_recording_depth(self) -> None:
        """End :meth:`record_depth` (idempotent; nothing when it never started)."""
        self.depth_stop.set()
        if self.depth_thread is not None:
            self.depth_thread.join(10)

    def drain_and_read_back(self) -> None:
        assert self.own is not None
        producers = {n: p for n, p in self.workers.items() if n.startswith("p")}
        if self.pg is not None:
            self.say(f"stopping {len(producers)} producers of the shared outbox (SIGTERM)")
        else:
            self.say(f"draining {len(producers)} outboxes (SIGTERM: stop sending, drain, exit)")
        self.stopped.update(producers)
        for proc in producers.values():
            proc.send_signal(signal.SIGTERM)
        if self.pg is not None:
            self.drain_shared_outbox(producers)
        else:
            self.reap(producers, 240, "did not drain")
        deadline = time.monotonic() + self.plan.readback_timeout
        self.tally.poll()
        while self.tally.unseen and time.monotonic() < deadline:
            time.sleep(0.5)  # polling the consumer's history against the deadline
            self.tally.poll()
        time.sleep(2.0)  # a quiet tail: duplicates that arrive late are counted too
        self.say(f"read back: unseen={self.tally.unseen} of {len(self.tally.receipted)}")
        consumer = self.workers["c"]
        consumer.send_signal(signal.SIGTERM)
        try:
            consumer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            consumer.kill()
            consumer.wait()

    def stop_everything(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.moving is not None:
            self.moving.join(180)
        self.stop_recording_depth()
        for proxy in self.proxies:
            proxy.close()
        if self.cluster is not None:
            self.cluster.stop()
        if self.pg is not None:
            self.pg.stop()


def _shape(plan: Plan) -> tuple[str, ...]:
    """A line saying the run's cluster is not the kind's usual one (the kind's lines
    below speak of that one)."""
    usual = KINDS[plan.kind]["nodes"]
    if plan.nodes == usual:
        return ()
    return (f"This run: {plan.nodes} broker node(s), not the {usual} the lines below describe.",)


def run(plan: Plan, say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Run ``plan`` (see the module docstring) and return what the checker found."""
    if plan.kind not in KINDS:
        raise ValueError(f"unknown kind {plan.kind!r} (known: {', '.join(sorted(KINDS))})")
    duration = plan.minutes * 60.0
    drawn = schedule.draw(
        plan.seed,
        duration,
        fault_targets(plan),
        description=_shape(plan)
        + KINDS[plan.kind]["limits"]
        + OUTBOXES[plan.outbox]
        + (DISK_LINES if plan.disk_faults else (NO_DISK_LINE,)),
    )
    for sub in ("history", "logs", "outboxes"):
        (plan.dir / sub).mkdir(parents=True, exist_ok=True)
    (plan.dir / "schedule.json").write_text(json.dumps(drawn.to_json(), indent=1))
    say(
        f"seed {plan.seed}: {len(drawn.windows)} faults in {duration:.0f} s; replay: "
        f"{replay_command(plan)}"
    )
    for line in drawn.description:
        say(f"  {line}")
    r = _Run(plan, say)
    try:
        with history.History(r.hist_dir / "runner.jsonl", "runner") as own:
            r.own = own
            if plan.disk_faults:
                r.mount_disks()
            r.start_cluster()
            if plan.outbox == "postgres":
                r.start_outbox()
            r.t0 = time.monotonic()
            for i in range(plan.producers):
                r.spawn(f"p{i}")
            for i in range(plan.forwarders if plan.outbox == "postgres" else 0):
                r.spawn(f"f{i}")
            r.spawn("c")
            behind = r.play(drawn.events())
            r.wait_until(duration + behind)
            with _noted(r, "heal"):
                r.heal()
            r.drain_and_read_back()
    finally:
        r.stop_everything()
        r.unmount_disks()
    verdict, series = checker.check(history.read_dir(r.hist_dir))
    finished = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    outcome = Outcome(plan, verdict, drawn, r.notes, finished)
    title = f"msgsafe nemesis {plan.kind} seed {plan.seed}: " + (
        "ok" if outcome.ok else "; ".join(verdict.problems() + r.notes)
    )
    (plan.dir / "picture.svg").write_text(picture.svg(series, title=title))
    (plan.dir / "report.json").write_text(json.dumps(outcome.report(), indent=1))
    if outcome.ok:
        if not keeps_brokers_files(outcome):
            shutil.rmtree(plan.dir / "cluster", ignore_errors=True)
        shutil.rmtree(plan.dir / "outboxes", ignore_errors=True)
        shutil.rmtree(plan.dir / "outboxes-kept", ignore_errors=True)
        if r.pg is not None:
            r.pg.delete_data()
    return outcome


#: A passing run whose outboxes took longer than this to be empty at once after a fault
#: window's end (``worst_recovery_s``) keeps its brokers' files too: a stall worth reading
#: (RabbitMQ seed 1614532448 confirmed nothing for three minutes, and passed).
STALL_KEEP_S = 60.0


def keeps_brokers_files(outcome: Outcome) -> bool:
    """Whether the run's cluster directory (brokers' logs and data) stays in its ``DIR``:
    when the run failed, or when it recovered slowly (:data:`STALL_KEEP_S`)."""
    worst = outcome.verdict.worst_recovery_s
    return not outcome.ok or worst is None or worst > STALL_KEEP_S


@contextlib.contextmanager
def _noted(r: _Run, what: str) -> Iterator[None]:
    """An action that failed (a node that did not come back) is noted, and the run goes
    on: the final heal and the checker judge what it did."""
    try:
        yield
    except (ClusterError, MsgsafeError, OSError) as exc:
        note = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        r.notes.append(note)
        assert r.own is not None
        r.own.write("note", text=note)
        r.say(note)
