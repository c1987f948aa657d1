"""The test suite's Apache Kafka: a :class:`~msgsafe.cluster.kafka.KafkaCluster` whose nodes
also listen for clients behind fault proxies, and the healing every fault test ends with.

Each node has two client listeners. ``PLAINTEXT`` (``cluster.bootstrap``) is the direct
one, also used between brokers. ``PROXIED`` binds ``proxied_ports[i]`` and advertises
``proxy_ports[i]``, where a :class:`~msgsafe.testing.faultproxy.FaultProxy` forwards to
it: a client that bootstraps through a proxy learns only proxy addresses from metadata, so
every byte it exchanges with any broker goes through a proxy, while replication between
the brokers does not (a proxy fault is a client-side network fault, not a partition).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from msgsafe.cluster import kafka_admin
from msgsafe.cluster._process import port_free, spawn, wait_for
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.nemesis.proxied_kafka import ProxiedKafka
from msgsafe.testing.faultproxy import FaultProxy
from tests.support.netns import socket_in_netns

__all__ = ["LabKafka", "NetKafka", "all_in_sync", "heal", "kill_all", "restart"]

#: Install hint of a Kafka test failure: what the test command runs on a fresh machine.
INSTALL_HINT = (
    "needs Java 17 and Maven (apt-get install -y openjdk-17-jre-headless maven), then "
    "`python3 -m msgsafe cluster fetch kafka` (bash scripts/bootstrap.sh all does both)"
)


class LabKafka(ProxiedKafka):
    """A Kafka cluster with a proxied client listener per node (see the module doc).
    The proxies exist from :meth:`open_proxies` on, until :meth:`close_proxies`."""

    def __init__(self, nodes: int = 3, *, heap_mb: int = 384) -> None:
        super().__init__(nodes, heap_mb=heap_mb)
        self.proxies: list[FaultProxy] = []
        self._proxy_lock = threading.Lock()

    def open_proxies(self) -> list[FaultProxy]:
        """One proxy per node, listening on the advertised ``proxy_ports`` (made once)."""
        with self._proxy_lock:
            if not self.proxies:
                proxies: list[FaultProxy] = []
                try:
                    for upstream, listen in zip(self.proxied_ports, self.proxy_ports, strict=True):
                        proxies.append(
                            FaultProxy(
                                "127.0.0.1", upstream, listen_port=listen, connect_timeout=2.0
                            )
                        )
                except BaseException:
                    for proxy in proxies:
                        proxy.close()
                    raise
                self.proxies = proxies
            return self.proxies

    def close_proxies(self) -> None:
        with self._proxy_lock:
            for proxy in self.proxies:
                proxy.close()
            self.proxies = []

    @property
    def proxied_url(self) -> str:
        """``kafka://`` URL of every node's proxy (what a client behind the proxies uses)."""
        return "kafka://" + ",".join(f"127.0.0.1:{p}" for p in self.proxy_ports)

    def stop(self, grace: float = 30.0) -> None:
        self.close_proxies()
        super().stop(grace)


def all_in_sync(bootstrap: str, brokers: int) -> bool:
    """True when ``brokers`` brokers are registered and every partition of every topic
    has a leader and all its replicas in sync."""
    meta = kafka_admin.metadata(bootstrap, timeout=3.0)
    if meta is None or len(meta.brokers) < brokers:
        return False
    for topic in meta.topics.values():
        if topic.error is not None:
            return False
        for part in topic.partitions.values():
            if part.leader < 0 or sorted(part.isrs) != sorted(part.replicas):
                return False
    return True


def kill_all(cluster: KafkaCluster) -> None:
    """SIGKILL every running node (their data stays, as after a power cut)."""
    for index, node in enumerate(cluster.nodes()):
        if node.running:
            cluster.kill(index)


def restart(cluster: KafkaCluster, nodes: Sequence[int], timeout: float = 240.0) -> None:
    """Start every node of ``nodes`` (killed before) and wait until each is registered.

    All are launched before any is waited for: when most nodes are down, none registers
    until a majority of controllers runs. They are launched from the calling thread:
    a node dies with the thread that started it (it is started with PR_SET_PDEATHSIG,
    which the kernel ties to the forking thread), so no short-lived worker may start
    one. NOTE: this reaches into :class:`KafkaCluster`'s launch steps, which its public
    ``restart(node)`` runs one node at a time.
    """
    if not nodes:
        return
    lib = cluster._lib()
    started = time.monotonic()
    for node in nodes:
        wait_for(
            lambda n=node: port_free(cluster.ports[n]) and port_free(cluster.controller_ports[n]),
            30.0,
            f"the ports of kafka node {node} to be free",
        )
        cluster._spawn(node, lib)
    cluster._wait_registered(list(nodes), started + timeout)


def heal(cluster: KafkaCluster, timeout: float = 300.0) -> float:
    """Every node running and resumed, every replica of every topic in sync; returns the
    seconds it took. Only what a test broke is touched: paused nodes get SIGCONT, killed
    nodes are restarted (all at once: a controller quorum needs two of them), running
    ones are left alone. Raises :class:`ClusterError` past ``timeout``."""
    started = time.monotonic()
    if isinstance(cluster, LabKafka):
        for proxy in cluster.proxies:
            proxy.heal()
    dead: list[int] = []
    for index, node in enumerate(cluster.nodes()):
        if not node.running:
            dead.append(index)
        elif node.role == "paused":
            cluster.resume(index)
    restart(cluster, dead, timeout)
    deadline = started + timeout
    while not all_in_sync(cluster.bootstrap, cluster.count):
        if time.monotonic() > deadline:
            raise ClusterError(f"kafka replicas not in sync {timeout:.0f} s after healing")
        time.sleep(0.2)  # polling interval of the deadline loop above
    return time.monotonic() - started


class NetKafka(KafkaCluster):
    """A Kafka cluster with node ``i`` inside host ``i``'s namespace of ``lab``
    (:class:`tests.support.netns.NetLab`), so that :meth:`NetLab.cut` partitions it.

    Nodes talk to each other (replication, controller quorum) on their lab addresses.
    Clients reach node ``i`` only through a fault proxy on ``127.0.0.1:ports[i]`` here,
    which opens its upstream connections in the lab's client namespace: the client keeps
    reaching a node that is cut off from the others, as clients of a partitioned broker
    do. Each node advertises its proxy on a listener of its own. A node's proxy exists
    from its first launch until :meth:`stop`; :meth:`restart` is not supported (the
    proxy holds the node's client port).
    """

    #: Ports every node uses on its own lab address (one namespace each, so no clash).
    BROKER_PORT, CONTROLLER_PORT, CLIENT_PORT = 9092, 9093, 9094

    def __init__(self, lab: Any, dir: Path, *, heap_mb: int = 384) -> None:
        super().__init__(lab.n, dir, heap_mb=heap_mb)
        self.lab = lab
        self.lab_proxies: dict[int, FaultProxy] = {}

    def _properties(self, node: int) -> dict[str, str]:
        props = super()._properties(node)
        addr = self.lab.addr(node)
        props.update(
            {
                "controller.quorum.voters": ",".join(
                    f"{i}@{self.lab.addr(i)}:{self.CONTROLLER_PORT}" for i in range(self.count)
                ),
                "listeners": (
                    f"PLAINTEXT://{addr}:{self.BROKER_PORT},"
                    f"CONTROLLER://{addr}:{self.CONTROLLER_PORT},"
                    f"CLIENT://{addr}:{self.CLIENT_PORT}"
                ),
                "advertised.listeners": (
                    f"PLAINTEXT://{addr}:{self.BROKER_PORT},CLIENT://127.0.0.1:{self.ports[node]}"
                ),
                "listener.security.protocol.map": (
                    "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT"
                ),
            }
        )
        return props

    def _spawn(self, node: int, lib: Path) -> None:
        if node not in self.lab_proxies:
            self.lab_proxies[node] = FaultProxy(
                self.lab.addr(node),
                self.CLIENT_PORT,
                listen_port=self.ports[node],
                upstream_socket=functools.partial(socket_in_netns, self.lab.client_netns),
                connect_timeout=2.0,
            )
        config = self._node_dir(node) / "server.properties"
        java = self._java(lib, "kafka.Kafka", str(config), heap_mb=self.heap_mb)
        argv = ["ip", "netns", "exec", self.lab.netns(node), *java]
        self.pids[node] = spawn(argv, log=self._log(node), cwd=self.dir)

    def restart(self, node: int, timeout: float | None = None) -> None:
        raise ClusterError("NetKafka nodes are not restarted: heal the lab's links instead")

    def stop(self, grace: float = 30.0) -> None:
        try:
            super().stop(grace)
        finally:
            for proxy in self.lab_proxies.values():
                proxy.close()
            self.lab_proxies = {}
