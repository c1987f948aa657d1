"""Apache Kafka in KRaft mode: N nodes on loopback, each a combined controller + broker.

The jars (``kafka_2.13`` with its runtime dependencies and the Log4j 2 binding the binary
distribution ships) come from Maven Central once, through
``msgsafe/cluster/poms/kafka-<version>.xml``, into the cache of :mod:`msgsafe.cluster.maven`.
Each node is ``java -cp 'lib/*' kafka.Kafka server.properties`` after
``kafka.tools.StorageTool format`` with one cluster id for all nodes and a static
controller quorum of every node.

The cluster keeps acknowledged writes through the loss of one node: replication factor 3
for every topic (also ``__consumer_offsets`` and ``__transaction_state``),
``min.insync.replicas=2``, no unclean leader election. Timings are shortened so that tests
see a killed node fenced and its partitions led elsewhere within seconds.

Layout of ``dir``: ``node-I/server.properties``, ``node-I/data`` (log and metadata),
``node-I/kafka.log`` (the JVM's output), ``log4j2.properties``, ``cluster.json``. Node
``I`` has ``node.id=I``, its client listener on ``ports[I]`` and its controller listener
on ``controller_ports[I]``; with ``base_port=P`` those are ``P+I`` and ``P+nodes+I``.

The helpers tests need (:meth:`KafkaCluster.create_topic`, :meth:`KafkaCluster.leader_of`,
:meth:`KafkaCluster.wait_in_sync`) use confluent-kafka (``pip install 'msgsafe[kafka]'``).

Kafka's own command-line tools (``kafka-topics``, ``kafka-console-consumer``, ...) are
not among the broker's jars: :func:`fetch_tools` (``msgsafe cluster fetch kafka-tools``)
resolves ``org.apache.kafka:kafka-tools`` of the same :data:`VERSION` through
``poms/kafka-tools-<version>.xml``, and :meth:`KafkaCluster.describe` names the commands
that run them against the cluster.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import shlex
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from msgsafe.cluster import _kafka_listeners, kafka_admin, maven
from msgsafe.cluster import tls as cluster_tls
from msgsafe.cluster._jvm import JvmCluster
from msgsafe.cluster._process import port_open, spawn, wait_for
from msgsafe.cluster.base import ClusterError

__all__ = ["TOOLS_FETCH", "KafkaCluster", "fetch_tools", "tools_lib"]

log = logging.getLogger(__name__)

#: The Kafka release this launcher runs (a pom ``poms/kafka-<VERSION>.xml`` pins it).
VERSION = "4.1.2"
_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
#: Written with acks=all by start() to prove the cluster takes replicated writes.
_READY_TOPIC = "msgsafe-ready"
#: The command that installs Kafka's own tools (:func:`fetch_tools`).
TOOLS_FETCH = "msgsafe cluster fetch kafka-tools"
#: The main classes behind bin/kafka-topics.sh and bin/kafka-console-consumer.sh.
_TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
_CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
#: The main class behind bin/kafka-reassign-partitions.sh.
_REASSIGN_COMMAND = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


def _tools_name() -> str:
    return f"kafka-tools-{VERSION}"


def tools_lib() -> Path:
    """Where :func:`fetch_tools` puts the jars of Kafka's own tools (the classpath is
    this dir + ``/*``); a path only: it need not exist yet."""
    return maven.cache_root() / _tools_name() / "lib"


def fetch_tools() -> None:
    """Resolve ``org.apache.kafka:kafka-tools`` of :data:`VERSION` with its dependencies
    into :func:`tools_lib` (once; a damaged cache is fetched again). :class:`ClusterError`
    naming what to install or delete when it cannot."""
    maven.fetch_lib(
        _tools_name(),
        [f"kafka-tools-{VERSION}.jar"],
        what="Kafka tools",
        kind="kafka-tools",
        m2="org/apache/kafka",
    )


def _cluster_id() -> str:
    # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding. Like
    # Kafka's Uuid.randomUuid, never one starting with "-": kafka-storage would read it
    # as an option ("--cluster-id/-t: expected one argument", 1 start in 64).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaCluster(JvmCluster):
    """``nodes`` KRaft nodes (controller + broker each) on 127.0.0.1; see the module doc.

    ``dir`` None: a temp dir, removed by :meth:`stop`. ``base_port`` None: free ports.
    ``detached``: nodes outlive this process (``msgsafe cluster up``) and ``cluster.json``
    is kept current; otherwise they die with it. ``heap_mb`` is each JVM's ``-Xmx``.
    ``overrides`` replace or add ``server.properties`` entries on every node.
    ``tls``: certificates made in ``dir/tls`` (:mod:`msgsafe.cluster.tls`) and two more
    listeners per node, by the name ``localhost``: ``SSL`` (:meth:`tls_url`), which
    requires a client certificate, and ``EXPIRED``, which presents the expired one (for
    checking that clients refuse it); brokers still talk among themselves in plain TCP.
    ``scram_users`` (name -> password): a ``SASL`` listener per node (SASL_PLAINTEXT,
    SCRAM-SHA-256/512, :meth:`sasl_url`) and these users, created at format time.

    :meth:`start` formats each node's storage and returns once every broker is registered
    and a topic replicated on every node (up to 3) takes an ``acks=all`` write;
    :meth:`restart` once the node is an unfenced broker again (it may still be catching
    up replicas: see :meth:`wait_in_sync`).
    """

    kind: ClassVar[str] = "kafka"
    supports_tls: ClassVar[bool] = True

    def __init__(
        self,
        nodes: int = 3,
        dir: str | Path | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        heap_mb: int = 384,
        overrides: Mapping[str, str] | None = None,
        tls: bool = False,
        scram_users: Mapping[str, str] | None = None,
    ) -> None:
        lists = self._setup(
            nodes,
            dir,
            base_port,
            detached,
            heap_mb=heap_mb,
            version=VERSION,
            what="Kafka cluster",
            port_lists=2 + (2 if tls else 0) + (1 if scram_users else 0),
        )
        self.controller_ports = lists[1]
        #: Each node's SSL and EXPIRED listener (empty without ``tls``).
        self.tls_ports: list[int] = lists[2] if tls else []
        self.expired_ports: list[int] = lists[3] if tls else []
        #: Each node's SASL listener (empty without ``scram_users``).
        self.sasl_ports: list[int] = lists[-1] if scram_users else []
        self.scram_users = dict(scram_users or {})
        self.tls: cluster_tls.ClusterTls | None = None
        if tls:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.tls = cluster_tls.make(self.dir, java_stores=True)
        self.overrides = dict(overrides or {})
        self.cluster_id = _cluster_id()

    # --- jars -----------------------------------------------------------------------------

    @classmethod
    def fetch(cls) -> None:
        """Resolve the Kafka jars into the cache (once); a damaged cache is fetched again."""
        maven.fetch_lib(
            f"kafka-{VERSION}",
            [f"kafka_2.13-{VERSION}.jar"],
            what="Kafka",
            kind="kafka",
            m2="org/apache/kafka",
        )

    def _lib(self) -> Path:
        required = [f"kafka_2.13-{self.version}.jar"]
        return maven.checked_lib(f"kafka-{self.version}", required, what="Kafka", kind="kafka")

    # --- configuration --------------------------------------------------------------------

    def _node_dir(self, node: int) -> Path:
        return self.dir / f"node-{node}"

    def _log(self, node: int) -> Path:
        return self._node_dir(node) / "kafka.log"

    def _properties(self, node: int) -> dict[str, str]:
        replication = min(3, self.count)
        min_isr = min(2, replication)
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(self.controller_ports))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self._node_dir(node) / "data"),
            # Durability: every write on 3 nodes, acks=all needs 2 in sync, and a replica
            # that was out of sync never becomes leader (it would drop acknowledged data).
            "default.replication.factor": str(replication),
            "min.insync.replicas": str(min_isr),
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": str(replication),
            "transaction.state.log.replication.factor": str(replication),
            "transaction.state.log.min.isr": str(min_isr),
            "share.coordinator.state.topic.replication.factor": str(replication),
            "share.coordinator.state.topic.min.isr": str(min_isr),
            # Default 9 s / 2 s: the controller fences a SIGKILLed node, and moves the
            # leadership of its partitions, after 3 s of missed heartbeats.
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "500",
            # Default 30 s: a SIGSTOPped or cut-off follower leaves the ISR after 5 s, so
            # acks=all writes go on with the two others instead of stalling.
            "replica.lag.time.max.ms": "5000",
            # Default 3 s: a test's first consumer gets its partitions at once.
            "group.initial.rebalance.delay.ms": "0",
            # Default 6 s: consumers with a short session timeout (tests use 3 s) are
            # accepted instead of refused with INVALID_SESSION_TIMEOUT.
            "group.min.session.timeout.ms": "1000",
            # Default 50 each: fewer internal partitions to create, replicate and elect
            # on a small machine; start and fail-over are faster.
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.num.partitions": "5",
            # Defaults 3 / 8 / 128 MiB: fewer threads per JVM (several share 2 cores),
            # and the log cleaner's dedupe buffer fits a small heap.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "4",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            # Default 500 ms: the active controller appends a no-op record that every
            # node replicates and applies; an idle 3-node cluster spent about a third
            # of a core on them. Fencing runs on heartbeats, not on these.
            "metadata.max.idle.interval.ms": "5000",
        }
        props.update(_kafka_listeners.properties(self._listeners(node), self.tls))
        props.update(self.overrides)
        return props

    def _listeners(self, node: int) -> _kafka_listeners.NodeListeners:
        return _kafka_listeners.NodeListeners(
            plain=self.ports[node],
            controller=self.controller_ports[node],
            tls=self.tls_ports[node] if self.tls_ports else None,
            expired=self.expired_ports[node] if self.expired_ports else None,
            sasl=self.sasl_ports[node] if self.sasl_ports else None,
        )

    def _write_config(self, node: int) -> Path:
        path = self._node_dir(node) / "server.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self._properties(node).items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def _java(self, lib: Path, main: str, *args: str, heap_mb: int) -> list[str]:
        jvm = [f"-Xmx{heap_mb}m", f"-Xms{min(heap_mb, 128)}m", "-XX:+UseG1GC"]
        jvm += [
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
        ]
        jvm.append(f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}")
        return [maven.java(), *jvm, "-cp", f"{lib}/*", main, *args]

    def _format(self, lib: Path) -> None:
        """Format the storage of every node that has none yet (one cluster id for all)."""
        jobs: list[tuple[int, subprocess.Popen[str]]] = []
        for node in range(self.count):
            config = self._write_config(node)
            meta = self._node_dir(node) / "data" / "meta.properties"
            if meta.exists():
                if f"cluster.id={self.cluster_id}" not in meta.read_text():
                    raise ClusterError(
                        f"{meta.parent} holds another Kafka cluster's data: "
                        "use a new --dir or delete that one"
                    )
                continue
            argv = self._java(
                lib,
                _STORAGE_TOOL,
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(config),
                *_kafka_listeners.scram_arguments(self.scram_users),
                heap_mb=128,
            )
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            jobs.append((node, proc))
        for node, proc in jobs:
            output, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise ClusterError(f"formatting the storage of kafka node {node} failed:\n{output}")

    # --- lifecycle ------------------------------------------------------------------------

    def _prepare(self, lib: Path) -> None:
        # Before any JVM: the readiness probe of start() needs confluent-kafka.
        kafka_admin.confluent()
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        self._format(lib)

    def _wait_serving(self, deadline: float) -> None:
        # Serving: every broker registered, and a topic replicated on every node (up to
        # 3) takes an acks=all write.
        self._wait_registered(range(self.count), deadline)
        log.info("every broker registered, writing with acks=all")
        self._probe_write(deadline)

    def _spawn(self, node: int, lib: Path) -> None:
        config = self._node_dir(node) / "server.properties"
        argv = self._java(lib, _MAIN, str(config), heap_mb=self.heap_mb)
        self.pids[node] = spawn(argv, log=self._log(node), cwd=self.dir, detached=self.detached)
        log.info("node %d launched (pid %d)", node, self.pids[node])

    # --- hooks of JvmCluster ----------------------------------------------------------------

    def _marker(self, node: int) -> Path:
        return self._node_dir(node) / "server.properties"

    def _node_ports(self, node: int) -> list[int]:
        ports = self._listeners(node)
        optional = [p for p in (ports.tls, ports.expired, ports.sasl) if p is not None]
        return [ports.plain, ports.controller, *optional]

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start ``node`` again and wait until it serves, as :meth:`JvmCluster.restart`.

        Every node is a KRaft controller, and a controller alone never serves: when the
        nodes that still run (paused ones do not vote) and this one are fewer than a
        majority, paused nodes are resumed and stopped ones started with it, lowest
        first, until they are (after a whole-cluster kill, ``restart 0`` brings back
        nodes 0 and 1 of three); a warning names them.
        """
        self._check_index(node)
        limit = 240.0 if timeout is None else timeout
        deadline = time.monotonic() + limit
        majority = self.count // 2 + 1
        voting = {n for n in range(self.count) if self._running(n) and not self._paused(n)}
        voting.add(node)
        resumed, started = [], []
        for other in range(self.count):
            if len(voting) >= majority:
                break
            if other not in voting and self._running(other):
                self.resume(other)
                resumed.append(other)
                voting.add(other)
        lib = self._lib()
        for other in range(self.count):
            if len(voting) >= majority:
                break
            if other not in voting:
                self._spawn(other, lib)
                started.append(other)
                voting.add(other)
        if resumed or started:
            self._save()
            log.warning(
                "kafka: a KRaft quorum needs %d of %d controllers: also %s",
                majority,
                self.count,
                "; ".join(
                    part
                    for part in (
                        f"resumed node(s) {resumed}" if resumed else "",
                        f"started node(s) {started}" if started else "",
                    )
                    if part
                ),
            )
        super().restart(node, max(1.0, deadline - time.monotonic()))
        if started:
            self._wait_registered(started, deadline)

    def _wait_back(self, node: int, deadline: float) -> None:
        # Registered as an unfenced broker; it may still be catching up replicas (see
        # wait_in_sync).
        self._wait_registered([node], deadline)

    # --- waiting on the brokers -------------------------------------------------------------

    def _wait_registered(self, nodes: range | list[int], deadline: float) -> None:
        waiting = list(nodes)

        def registered() -> bool:
            self._check_alive(waiting)
            for node in list(waiting):
                # Asking each node itself: it answers only once its broker side is up,
                # and it lists itself only once the controller has unfenced it.
                if not port_open(self.ports[node]):
                    continue
                meta = kafka_admin.metadata(f"127.0.0.1:{self.ports[node]}")
                if meta is not None and node in meta.brokers:
                    waiting.remove(node)
                    log.info("broker %d registered (%d to go)", node, len(waiting))
            return not waiting

        wait_for(
            registered,
            max(0.0, deadline - time.monotonic()),
            "every kafka broker to register",
            interval=0.2,
            on_timeout=lambda: self._tails(waiting),
        )

    def _probe_write(self, deadline: float) -> None:
        ck = kafka_admin.confluent()
        refusals: list[ClusterError] = []

        def created() -> bool:
            # NOTE: on a loaded machine a just-registered broker can drop the admin
            # request (_DESTROY_BROKER, a timeout): ask again until the deadline.
            self._check_alive(list(range(self.count)))
            left = max(1.0, min(15.0, deadline - time.monotonic()))
            try:
                self.create_topic(_READY_TOPIC, partitions=1, timeout=left)
            except ClusterError as exc:
                refusals.append(exc)
                return False
            return True

        wait_for(
            created,
            max(0.0, deadline - time.monotonic()),
            f"the topic {_READY_TOPIC!r} to be created",
            interval=0.5,
            on_timeout=lambda: f"last error: {refusals[-1] if refusals else 'none'}",
        )
        producer = ck.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "message.timeout.ms": 5000,
                "log_level": 0,
            }
        )
        errors: list[Any] = []

        def written() -> bool:
            self._check_alive(list(range(self.count)))
            outcome: list[Any] = []
            producer.produce(_READY_TOPIC, b"ready", on_delivery=lambda e, _m: outcome.append(e))
            producer.flush(6.0)
            if outcome and outcome[0] is None:
                return True
            errors.append(outcome[0] if outcome else "no delivery report")
            return False

        wait_for(
            written,
            max(0.0, deadline - time.monotonic()),
            "an acks=all write to succeed",
            interval=0.2,
            on_timeout=lambda: f"last error: {errors[-1] if errors else 'none'}",
        )

    # --- what it looks like ---------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...`` for ``bootstrap.servers``."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:P1,127.0.0.1:P2,...``"""
        return f"kafka://{self.bootstrap}"

    def tls_url(self, *, expired: bool = False) -> str:
        """``kafka+ssl://localhost:P1,...`` of the SSL listeners (``expired``: of the
        listeners presenting the expired certificate) with the CA and client certificate."""
        if self.tls is None:
            raise ClusterError("this cluster has no TLS listeners: make it with tls=True")
        ports = self.expired_ports if expired else self.tls_ports
        hosts = ",".join(f"{cluster_tls.HOST}:{p}" for p in ports)
        return f"kafka+ssl://{hosts}?{self.tls.query()}"

    def sasl_url(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> str:
        """``kafka://user:password@127.0.0.1:P1,...?sasl_mechanism=...`` of the SASL
        listeners (any user and password: wrong ones are for tests of refusal)."""
        if not self.sasl_ports:
            raise ClusterError("this cluster has no SASL listeners: make it with scram_users=")
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sasl_ports)
        creds = f"{quote(user, safe='')}:{quote(password, safe='')}"
        return f"kafka://{creds}@{hosts}?sasl_mechanism={mechanism}"

    def tools(self) -> dict[str, Any]:
        """How to use Kafka's own tools against this cluster: ``what`` they are;
        ``fetch``, the command that installs them once; their ``classpath``; and
        ``commands``: ``topics`` (a kafka-topics listing) and ``console_consumer`` (TOPIC
        to fill in) on the plain listeners, ready to paste into a shell."""
        java = f"java -cp {shlex.quote(f'{tools_lib()}/*')}"
        server = f"--bootstrap-server {self.bootstrap}"
        return {
            "what": "Kafka's own tools (kafka-topics, kafka-console-consumer, ...)",
            "fetch": TOOLS_FETCH,
            "classpath": f"{tools_lib()}/*",
            "commands": {
                "topics": f"{java} {_TOPIC_COMMAND} {server} --list",
                "console_consumer": (
                    f"{java} {_CONSOLE_CONSUMER} {server} --topic TOPIC --from-beginning"
                ),
            },
        }

    def describe(self) -> dict[str, Any]:
        """The common description and :meth:`tools`; with ``tls`` also the certificate
        paths, the SSL and EXPIRED listeners' ports and the TLS URL."""
        described = super().describe()
        described["tools"] = self.tools()
        if self.tls is not None:
            described["tls"] = {
                **self.tls.describe(),
                "ports": self.tls_ports,
                "expired_ports": self.expired_ports,
                "url": self.tls_url(),
            }
        if self.sasl_ports:
            described["sasl"] = {
                "ports": self.sasl_ports,
                "mechanisms": list(_kafka_listeners.SCRAM_MECHANISMS),
                "users": sorted(self.scram_users),  # names only: passwords stay in the dir
            }
        return described

    def node_url(self, node: int) -> str:
        """``kafka://127.0.0.1:P`` of ``node`` only."""
        self._check_index(node)
        return f"kafka://127.0.0.1:{self.ports[node]}"

    def controller_leader(self) -> int | None:
        """The node that is the active controller, as the running nodes' ``quorum-state``
        files say (the highest epoch wins); None while no running node knows one."""
        best: tuple[int, int] | None = None
        for node in range(self.count):
            if not self._running(node):
                continue
            path = self._node_dir(node) / "data" / "__cluster_metadata-0" / "quorum-state"
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                state = json.loads(path.read_text())
                epoch, leader = int(state["leaderEpoch"]), int(state["leaderId"])
                if leader >= 0 and (best is None or epoch > best[0]):
                    best = (epoch, leader)
        if best is None or not (0 <= best[1] < self.count) or not self._running(best[1]):
            return None
        return best[1]

    def _roles(self) -> list[str | None]:
        """``controller-leader`` for the active controller, ``controller-follower`` for
        the other running nodes (:meth:`nodes` shows ``paused`` for a SIGSTOPped one)."""
        leader = self.controller_leader()
        return [
            ("controller-leader" if node == leader else "controller-follower")
            if self._running(node)
            else None
            for node in range(self.count)
        ]

    # --- state ----------------------------------------------------------------------------

    def _own_state(self) -> dict[str, Any]:
        return {
            "controller_ports": self.controller_ports,
            "cluster_id": self.cluster_id,
            "overrides": self.overrides,
            "tls_ports": self.tls_ports,
            "expired_ports": self.expired_ports,
            "sasl_ports": self.sasl_ports,
            "scram_users": self.scram_users,
        }

    @classmethod
    def _options(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {"overrides": state.get("overrides") or {}}

    def _restore(self, state: dict[str, Any]) -> None:
        self.controller_ports = [int(p) for p in state["controller_ports"]]
        if state.get("tls_ports"):
            self.tls = cluster_tls.load(self.dir)
            self.tls_ports = [int(p) for p in state["tls_ports"]]
            self.expired_ports = [int(p) for p in state["expired_ports"]]
        self.sasl_ports = [int(p) for p in state.get("sasl_ports") or []]
        self.scram_users = dict(state.get("scram_users") or {})
        if len(self.controller_ports) != self.count:
            raise ValueError("controller ports do not match the node count")
        self.cluster_id = str(state["cluster_id"])

    # --- helpers for tests ------------------------------------------------------------------

    def _running_bootstrap(self) -> str:
        running = [f"127.0.0.1:{p}" for n, p in enumerate(self.ports) if self._running(n)]
        if not running:
            raise ClusterError("no kafka node is running")
        return ",".join(running)

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        replication: int = 3,
        config: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        """Create ``name`` (an existing one is kept) on at most ``nodes`` replicas and wait
        until every partition has a leader. ``config``: topic settings, e.g.
        ``{"min.insync.replicas": "2"}`` (the broker default here already is 2)."""
        kafka_admin.create_topic(
            self._running_bootstrap(),
            name,
            partitions,
            min(replication, self.count),
            config,
            timeout=timeout,
        )

    def leader_of(self, topic: str, partition: int = 0) -> int:
        """The node leading ``topic``/``partition`` now, as the running brokers say."""
        meta = kafka_admin.partitions(self._running_bootstrap(), topic).get(partition)
        if meta is None or meta.leader < 0:
            raise ClusterError(f"{topic!r}/{partition} has no leader")
        return int(meta.leader)

    def replicas(self, topic: str) -> dict[int, list[int]]:
        """``{partition: [node, ...]}`` of ``topic``, the preferred leader first."""
        parts = kafka_admin.partitions(self._running_bootstrap(), topic)
        return {p: [int(r) for r in meta.replicas] for p, meta in sorted(parts.items())}

    def reassign(
        self, topic: str, replicas: Mapping[int, list[int]], timeout: float = 60.0
    ) -> None:
        """Give ``topic``'s partitions these replica lists with Kafka's own
        ``kafka-reassign-partitions`` (its tools: :func:`fetch_tools`), and wait until the
        brokers report them. A list that only reorders a partition's replicas moves no
        data: it names another preferred leader, which :meth:`elect_preferred` then
        makes the leader. :class:`ClusterError` when the tool refuses or the brokers do
        not report the lists within ``timeout``."""
        lib = tools_lib()
        if not lib.is_dir():
            raise ClusterError(f"Kafka's tools are not installed: {TOOLS_FETCH}")
        plan = {
            "version": 1,
            "partitions": [
                {"topic": topic, "partition": p, "replicas": list(r)} for p, r in replicas.items()
            ],
        }
        path = self.dir / f"reassign-{topic}.json"
        path.write_text(json.dumps(plan))
        args = ["--bootstrap-server", self._running_bootstrap()]
        args += ["--reassignment-json-file", str(path), "--execute"]
        command = self._java(lib, _REASSIGN_COMMAND, *args, heap_mb=256)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"kafka-reassign-partitions timed out after {timeout} s") from exc
        if done.returncode != 0:
            # The tool's error, not its INFO logging nor the JVM's notice of
            # JDK_JAVA_OPTIONS; its last lines when no line names an error.
            lines = (done.stdout + "\n" + done.stderr).strip().splitlines()
            errors = [line for line in lines if "rror" in line or "xception" in line]
            said = (errors or [line for line in lines if "JDK_JAVA_OPTIONS" not in line])[-3:]
            raise ClusterError(f"kafka-reassign-partitions failed: {' '.join(said)}")
        wanted = {p: list(r) for p, r in replicas.items()}

        def reported() -> bool:
            try:
                return self.replicas(topic) == wanted
            except ClusterError:
                return False

        wait_for(reported, timeout, f"the new replica lists of {topic!r}", interval=0.2)

    def elect_preferred(self, topic: str, timeout: float = 30.0) -> dict[int, str]:
        """A preferred leader election of ``topic``'s partitions
        (:func:`~msgsafe.cluster.kafka_admin.elect_preferred`): ``{partition: error}`` of
        those not moved."""
        return kafka_admin.elect_preferred(self._running_bootstrap(), topic, timeout)

    def wait_in_sync(self, topic: str, timeout: float = 60.0) -> None:
        """Wait until every replica of ``topic`` is in sync (after :meth:`restart`,
        before the next fault)."""
        kafka_admin.wait_in_sync(self._running_bootstrap(), topic, timeout)
