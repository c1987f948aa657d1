"""A real RabbitMQ cluster on loopback, for users, tests, benchmarks and the chaos suite.

::

    from msgsafe.cluster.rabbitmq import RabbitCluster

    with RabbitCluster(nodes=3) as cluster:
        url = cluster.url                    # amqp://guest:guest@127.0.0.1:P1,...:P2,...:P3
        cluster.kill(0)                      # SIGKILL node 0's Erlang VM
        cluster.restart(0)                   # start it again; it rejoins the cluster

Each node is Debian's ``rabbitmq-server`` started from ``/usr/lib/rabbitmq/bin`` with its
own name (random suffix, so runs never clash with each other or with the system node
``rabbit@<host>``), its own data, log and pid files under the cluster's dir, and its own
AMQP and distribution ports (free ones, or ``base_port + i`` and ``base_port + nodes + i``).
The cluster runs with ``cluster_partition_handling = pause_minority`` and the AMQP 1.0
plugin (which in 3.10 listens on the AMQP 0-9-1 port).

Layout of ``dir``: ``home/`` (the Erlang cookie every node and ``rabbitmqctl`` share),
``rabbitmq-env.conf``, ``n<I>/`` per node (``rabbitmq.conf``, ``mnesia/``, ``log/``,
``rabbit.pid``), ``cluster.json`` when detached.

Erlang nodes always run detached from the process that starts them (``-detached``); a
cluster that is not ``detached`` kills them on :meth:`RabbitCluster.stop`, on context
exit and, as a last resort, at interpreter exit. One node's files, environment and
scripts are :class:`~msgsafe.cluster._rabbit_node.RabbitNode`'s.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Self, TypeVar

from msgsafe.cluster import tls as cluster_tls
from msgsafe.cluster._process import (
    free_ports,
    pause_pid,
    pid_alive,
    pid_paused,
    port_open,
    signal_pid,
    wait_gone,
)
from msgsafe.cluster._rabbit_node import CTL, SERVER, RabbitNode
from msgsafe.cluster.base import ClusterError, LocalCluster, NodeInfo, TlsFiles

_R = TypeVar("_R")

__all__ = ["INSTALL_HINT", "RabbitCluster", "RabbitNode", "management_url_for"]

log = logging.getLogger("msgsafe.cluster")

#: What to run when the broker is missing (the test command does it on fresh machines).
INSTALL_HINT = "apt-get install -y rabbitmq-server"

_LIVE: set[RabbitCluster] = set()
_LIVE_LOCK = threading.Lock()


def _whole(status: dict[str, Any] | None, names: set[str]) -> bool:
    """True when a node's ``cluster_status`` shows every node running and no partition."""
    return (
        status is not None
        and set(status.get("running_nodes", [])) == names
        and not status.get("partitions")
    )


class RabbitCluster(LocalCluster):
    """Start, break and stop a RabbitMQ cluster of ``nodes`` nodes on 127.0.0.1.

    ``size`` is the older name of ``nodes`` (either may be given). ``dir`` (or
    ``base_dir``) None: a temp dir, removed by :meth:`stop`. ``detached``: the nodes
    outlive this process (``msgsafe cluster up``) and ``cluster.json`` is kept current.
    ``tls``: a TLS listener (AMQP 0-9-1 and 1.0) per node, presenting the given files
    (one set for every node, or one per node); True makes a set with
    :func:`msgsafe.cluster.tls.make` in ``dir/tls`` whose listeners require a client
    certificate (``msgsafe cluster up rabbitmq --tls``). ``management``: the management
    HTTP API on a loopback port per node (what ``msgsafe doctor`` reads for the nodes,
    partitions and every queue: ``--management URL``; see :meth:`management_url`).

    Not thread-safe: drive it from one thread. Nodes are addressed by index
    ``0 .. nodes-1``; node 0 is the one the others join.
    """

    kind: ClassVar[str] = "rabbitmq"
    supports_tls: ClassVar[bool] = True
    #: What doctor reads for the nodes, partitions and queue types.
    up_options: ClassVar[Mapping[str, object]] = MappingProxyType({"management": True})

    def __init__(
        self,
        size: int | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        nodes: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        base_port: int | None = None,
        detached: bool = False,
        net_ticktime: int = 10,
        username: str = "guest",
        password: str = "guest",
        start_timeout: float = 90.0,
        tls: TlsFiles | Sequence[TlsFiles] | bool | None = None,
        management: bool = False,
    ) -> None:
        if size is not None and nodes is not None and size != nodes:
            raise ClusterError("give the number of nodes once (nodes=, or size=)")
        count = nodes if nodes is not None else size if size is not None else 3
        if count < 1:
            raise ClusterError("a cluster needs at least one node")
        if base_dir is not None and dir is not None:
            raise ClusterError("give the directory once (dir=, or base_dir=)")
        where = dir if dir is not None else base_dir
        self.size = count
        self.username = username
        self.password = password
        self.start_timeout = start_timeout
        self.detached = detached
        #: NOTE: Erlang's default net_ticktime (60 s) means a SIGSTOPped node is noticed
        #: only after 45-75 s; a shorter tick lets pause_minority and quorum leader
        #: election act within the time a test can afford.
        self.net_ticktime = net_ticktime
        self._take_dir(where, "msgsafe-rabbit-")
        if base_port is None:
            picked = free_ports(4 * count)
            ports, dist_ports = picked[:count], picked[count : 2 * count]
            tls_ports, api_ports = picked[2 * count : 3 * count], picked[3 * count :]
        else:
            ports = [base_port + i for i in range(count)]
            dist_ports = [base_port + count + i for i in range(count)]
            tls_ports = [base_port + 2 * count + i for i in range(count)]
            api_ports = [base_port + 3 * count + i for i in range(count)]
        #: The certificates made for ``tls=True`` (None otherwise).
        self.tls: cluster_tls.ClusterTls | None = None
        if tls is True:
            self.tls = cluster_tls.make(self.dir)
            tls = self.tls.server
        if tls is False:
            tls = None
        per_node = [tls] * count if tls is None or isinstance(tls, TlsFiles) else list(tls)
        if len(per_node) != count:
            raise ClusterError(f"tls= gives {len(per_node)} sets of files for {count} nodes")
        suffix = secrets.token_hex(3)
        self._nodes = [
            RabbitNode(
                index=i,
                name=f"msgsafe{suffix}n{i}@localhost",
                port=ports[i],
                dist_port=dist_ports[i],
                base=self.dir / f"n{i}",
                tls_port=tls_ports[i] if per_node[i] is not None else None,
                tls=per_node[i],
                management_port=api_ports[i] if management else None,
            )
            for i in range(count)
        ]
        self._started = False

    # --- addresses ----------------------------------------------------------------------

    @property
    def members(self) -> Sequence[RabbitNode]:
        """The nodes' names, ports and files, by index."""
        return tuple(self._nodes)

    @property
    def base_dir(self) -> Path:
        """The directory holding every node's files (``dir``)."""
        return self.dir

    @property
    def url(self) -> str:
        """One AMQP 0-9-1 URL listing every node."""
        return self.cluster_url()

    @property
    def urls(self) -> list[str]:
        """One AMQP 0-9-1 URL per node."""
        return [self.node_url(i) for i in range(self.size)]

    def node_url(self, node: int) -> str:
        """``amqp://guest:guest@127.0.0.1:P`` of ``node``."""
        return f"amqp://{self.username}:{self.password}@127.0.0.1:{self._nodes[node].port}"

    def cluster_url(self, order: Sequence[int] | None = None, *, vhost: str = "") -> str:
        """One AMQP 0-9-1 URL listing every node (or ``order``'s nodes, in that order)."""
        idx = list(order) if order is not None else list(range(self.size))
        hosts = ",".join(f"127.0.0.1:{self._nodes[i].port}" for i in idx)
        path = f"/{vhost}" if vhost else ""
        return f"amqp://{self.username}:{self.password}@{hosts}{path}"

    def amqp10_url(self, node: int) -> str:
        """``amqp10://guest:guest@127.0.0.1:P`` of ``node`` (same port as 0-9-1)."""
        return f"amqp10://{self.username}:{self.password}@127.0.0.1:{self._nodes[node].port}"

    def tls_port(self, node: int) -> int:
        """The TLS listener (AMQP 0-9-1 and 1.0) of ``node``; a cluster made with ``tls=``
        (one :class:`TlsFiles` for every node, or one per node)."""
        port = self._nodes[node].tls_port
        if port is None:
            raise ClusterError("this cluster has no TLS listener: make it with tls=TlsFiles(...)")
        return port

    def tls_url(self, node: int | None = None, *, scheme: str = "amqps") -> str:
        """An ``amqps://`` (or ``amqp10s://``) URL of the TLS listeners (every node's, or
        ``node``'s) by the host name the certificates name, with the CA and the client
        certificate of a cluster made with ``tls=True``."""
        if self.tls is None:
            raise ClusterError("this cluster has no certificates of its own: make it with tls=True")
        idx = range(self.size) if node is None else [node]
        hosts = ",".join(f"{cluster_tls.HOST}:{self.tls_port(i)}" for i in idx)
        path = "/" if scheme == "amqps" else ""
        credentials = f"{self.username}:{self.password}@"
        return f"{scheme}://{credentials}{hosts}{path}?{self.tls.query()}"

    def describe(self) -> dict[str, Any]:
        """The common description; with ``tls=True`` also ``tls``: the certificate paths,
        the TLS ports and a TLS URL; with ``management=True`` also ``management``: each
        node's API URL."""
        described = super().describe()
        if self.tls is not None:
            ports = [self.tls_port(i) for i in range(self.size)]
            described["tls"] = {**self.tls.describe(), "ports": ports, "url": self.tls_url()}
        if self._nodes[0].management_port is not None:
            described["management"] = [self.management_url(i) for i in range(self.size)]
        return described

    def management_url(self, node: int = 0) -> str:
        """The management API of ``node`` (``msgsafe doctor URL --management THIS``)."""
        port = self._nodes[node].management_port
        if port is None:
            raise ClusterError("this cluster runs without the management plugin")
        return f"http://127.0.0.1:{port}"

    def port(self, node: int) -> int:
        """The AMQP port (0-9-1 and 1.0) of ``node``."""
        return self._nodes[node].port

    def pid(self, node: int) -> int | None:
        """The OS pid of ``node``'s Erlang VM, or None when it has no pid file."""
        try:
            text = self._nodes[node].pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def nodes(self) -> list[NodeInfo]:
        """Every node; role ``paused`` for a node stopped by SIGSTOP (:meth:`pause`, here
        or in another process)."""
        result = []
        for node in self._nodes:
            running = self.is_running(node.index)
            role = "paused" if running and self._is_paused(node.index) else None
            result.append(
                NodeInfo(
                    name=node.name,
                    pid=self.pid(node.index) if running else None,
                    host="127.0.0.1",
                    port=node.port,
                    running=running,
                    role=role,
                )
            )
        return result

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start every node, form the cluster and wait until all are running.

        Raises :class:`ClusterError` (naming the package to install when RabbitMQ is
        missing, or quoting the node's log when a node does not come up); on failure
        every node already started is killed.
        """
        if self._started:
            return
        if not SERVER.exists() or not CTL.exists():
            raise ClusterError(f"RabbitMQ is not installed ({SERVER} is missing): {INSTALL_HINT}")
        limit = self.start_timeout if timeout is None else timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        home = self.dir / "home"
        home.mkdir(exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(16).upper())
            cookie.chmod(0o400)
        # NOTE: +sbwt none (and for the dirty schedulers): Erlang's schedulers spin
        # before they sleep, which on a small machine shared with other brokers is CPU
        # taken from them (RabbitMQ's docs advise it for shared hosts).
        (self.dir / "rabbitmq-env.conf").write_text(
            'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}'
            ' +sbwt none +sbwtdcpu none +sbwtdio none"\n'
        )
        joined = self._nodes[0].base.exists()  # a stopped cluster started again
        for node in self._nodes:
            node.write_files(self.net_ticktime)
        if not self.detached:
            with _LIVE_LOCK:
                _LIVE.add(self)
        self._started = True
        try:
            for i in range(self.size):
                self._launch(i)
            deadline = time.monotonic() + limit
            self._each(functools.partial(self._ready_or_relaunched, limit))
            first = self._nodes[0].name
            for i in range(1, self.size):
                if joined and first in self._running_nodes(i):
                    continue
                self.ctl(i, "stop_app")
                self.ctl(i, "join_cluster", first)
                self.ctl(i, "start_app")
            left = max(1.0, deadline - time.monotonic())
            self._each(functools.partial(self._wait_ready_for, left))
        except BaseException:
            self.stop()
            raise
        self._save()

    def stop(self) -> None:
        """Kill every node and remove the files (when the directory was ours). Idempotent."""
        for i in range(self.size):
            with contextlib.suppress(Exception):
                self.kill(i)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._started = False
        self._save()

    # --- faults -------------------------------------------------------------------------

    def kill(self, node: int) -> None:
        """SIGKILL ``node``'s Erlang VM and wait until it is gone."""
        pid = self.pid(node)
        if pid is None:
            return
        # NOTE: a stopped process still dies on SIGKILL; SIGCONT is not needed.
        signal_pid(pid, signal.SIGKILL)
        # -detached VMs are re-parented to init, which reaps them.
        wait_gone(pid, 10.0)
        with contextlib.suppress(OSError):
            self._nodes[node].pid_file.unlink()
        self._save()

    def stop_node(self, node: int, timeout: float = 60.0) -> None:
        """Stop ``node`` cleanly (``rabbitmqctl stop``, a planned shutdown: what a node
        keeps through it is what its disk holds) and wait until its VM is gone;
        :meth:`restart` starts it again with its data."""
        pid = self.pid(node)
        if pid is None:
            return
        self.ctl(node, "stop", str(self._nodes[node].pid_file), timeout=timeout)
        wait_gone(pid, timeout)
        with contextlib.suppress(OSError):
            self._nodes[node].pid_file.unlink()
        self._save()

    def kill_all(self) -> None:
        """SIGKILL every node (a whole-cluster outage), after each has synced its metadata log.

        NOTE: a run once lost a quorum queue declared seconds before every node was
        killed (afterwards every node answered NOT_FOUND for it, and RabbitMQ 3.10's
        AMQP 1.0 plugin accepted messages sent to the vanished queue); the metadata log
        (Mnesia) may still sit in the VM's buffers that soon after a declaration. The
        outage under test is of the messages, not of the declaration, so the declaration
        is made durable first (``mnesia:sync_log()``).

        The same holds for the quorum queues' own registry: Ra keeps which member
        directory serves which queue in a dets table (``names.dets``) saved after
        500 ms without access. Killed before that, a node restarts without its member,
        creates an empty one for the queue and the queue stops there (the followers
        "did not have entry at 203", "await_condition - Leader node might be down",
        every publish unconfirmed); with two such members a leader with an empty log
        could even be elected. Every open dets table is synced first too.
        """
        self._each(self._sync_metadata_log)
        for i in range(self.size):
            self.kill(i)

    def _sync_metadata_log(self, node: int) -> None:
        if self.is_running(node) and not self._is_paused(node):
            with contextlib.suppress(RuntimeError):  # ctl's failures and timeouts
                self.ctl(
                    node,
                    "eval",
                    "mnesia:sync_log(), [dets:sync(T) || T <- dets:all()].",
                    timeout=15,
                )

    def pause(self, node: int) -> None:
        """SIGSTOP ``node``: it holds its sockets open but answers nothing."""
        pause_pid(self._require_pid(node), f"node {self._nodes[node].name}")

    def resume(self, node: int) -> None:
        """SIGCONT ``node``."""
        signal_pid(self._require_pid(node), signal.SIGCONT)

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start ``node`` again (after :meth:`kill`; a running one is killed first) and
        wait until it runs. When every other node is down too, they are started with
        it: a node that was not the last of its cluster to stop waits at boot for its
        peers' metadata (for minutes, saying nothing) until one of them runs.

        NOTE: ``rabbitmq-server -detached`` returns before the VM boots; a VM that exits
        before it writes its pid file says nothing anywhere (a CI run once waited the
        whole 180 s on a node whose log never moved). A node neither running nor
        serving a minute after its launch is launched once more."""
        total = 180.0 if timeout is None else timeout
        self.kill(node)
        peers = [i for i in range(self.size) if i != node]
        together = [node]
        if peers and not any(self.is_running(i) for i in peers):
            together += peers
            log.info(
                "the other nodes are down too: starting %s together (a node waits for "
                "its peers' tables before it boots)",
                ", ".join(self._nodes[i].name for i in together),
            )
        for i in together:
            self._launch(i)
        log.info("waiting for %s to boot", ", ".join(self._nodes[i].name for i in together))
        self._each(functools.partial(self._ready_or_relaunched, total), together)
        self._save()

    def _ready_or_relaunched(self, total: float, node: int) -> None:
        """Wait up to ``total`` seconds until a just launched ``node`` serves; one that
        neither runs nor serves after a minute (or half of ``total``) is launched once
        more (see :meth:`restart`: a VM can exit before its pid file, saying nothing),
        one still booting is waited for."""
        deadline = time.monotonic() + total
        try:
            self.wait_ready(node, timeout=min(60.0, total / 2))
        except ClusterError:
            if time.monotonic() >= deadline:
                raise
            if not self.is_running(node):
                log.warning("rabbitmq node %s did not start: launching it again", node)
                self._launch(node)
            self.wait_ready(node, timeout=max(1.0, deadline - time.monotonic()))

    def status(self, node: int) -> dict[str, Any]:
        """``rabbitmqctl cluster_status`` of ``node`` as a dict (``running_nodes``,
        ``partitions``, ...)."""
        data = json.loads(self.ctl(node, "cluster_status", "--formatter", "json", timeout=30))
        if not isinstance(data, dict):
            raise ClusterError("unexpected cluster_status output")
        return data

    def heal(self, *, timeout: float = 120.0) -> None:
        """Resume paused nodes, restart killed ones, restart the minority of a network
        partition, and wait until every node runs in one cluster: the state the next
        test expects.

        NOTE: a node frozen (SIGSTOP) longer than net_ticktime wakes up believing it
        never left, while the majority recorded a partition; pause_minority does not
        resolve that (the node never saw itself in a minority). RabbitMQ's documented
        recovery is to restart the minority's nodes, which is what happens here.
        """
        deadline = time.monotonic() + timeout
        for i in range(self.size):
            if self._is_paused(i):
                self.resume(i)
        restarted: set[int] = set()
        names = {n.name for n in self._nodes}
        while True:
            for i in range(self.size):
                if not self.is_running(i):
                    self._launch(i)
            # NOTE: every rabbitmqctl call boots an Erlang VM (about a second here), so
            # the nodes are asked at the same time, not one after the other.
            left = max(1.0, deadline - time.monotonic())
            self._each(functools.partial(self._wait_ready_for, left))
            statuses = self._each(self._status_or_none)
            if all(_whole(status, names) for status in statuses):
                self._save()
                return
            minority: set[int] = set()
            for status in statuses:
                running = set((status or {}).get("running_nodes", []))
                if running != names and len(running) * 2 > len(names):
                    minority = {j for j, n in enumerate(self._nodes) if n.name not in running}
                    break
            if time.monotonic() >= deadline:
                raise ClusterError("the cluster did not heal in time")
            todo = minority - restarted
            for j in todo:
                self.kill(j)  # relaunched at the top of the loop
            restarted |= todo
            if not todo:
                time.sleep(0.5)  # polling the cluster status against the deadline

    def _wait_ready_for(self, timeout: float, node: int) -> None:
        self.wait_ready(node, timeout=timeout)

    def _status_or_none(self, node: int) -> dict[str, Any] | None:
        try:
            return self.status(node)
        except (RuntimeError, ValueError):
            return None

    def _running_nodes(self, node: int) -> set[str]:
        status = self._status_or_none(node)
        return set((status or {}).get("running_nodes", []))

    def _each(self, call: Callable[[int], _R], nodes: Sequence[int] | None = None) -> list[_R]:
        """``call(i)`` for every node (or each of ``nodes``) at once, results in that
        order; the first error (in that order) is raised after all have finished."""
        chosen = list(range(self.size)) if nodes is None else list(nodes)
        with concurrent.futures.ThreadPoolExecutor(len(chosen)) as pool:
            futures = [pool.submit(call, i) for i in chosen]
        return [future.result() for future in futures]

    def is_running(self, node: int) -> bool:
        """True when ``node``'s VM process exists (paused counts as running)."""
        return pid_alive(self.pid(node))

    def wait_ready(self, node: int, timeout: float = 60.0) -> None:
        """Wait until ``node`` runs the rabbit application and accepts AMQP connections."""
        member = self._nodes[node]
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.is_running(node) and member.pid_file.exists():
                break
            if port_open(member.port, timeout=0.5):
                left = max(1, int(deadline - time.monotonic()))
                proc = self._run_ctl(node, ["await_startup", "--timeout", str(left)], left + 10)
                if proc.returncode == 0:
                    return
                last = (proc.stderr or proc.stdout).strip()
            time.sleep(0.2)  # polling the node against the deadline
        raise ClusterError(
            f"RabbitMQ node {member.name} not ready within {timeout:.0f} s: {last}\n"
            f"{member.log_tail()}"
        )

    def ctl(self, node: int, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node> ARGS``; returns stdout, raises
        :class:`ClusterError` on failure."""
        proc = self._run_ctl(node, list(args), timeout)
        if proc.returncode != 0:
            raise ClusterError(
                f"rabbitmqctl {' '.join(args)} on {self._nodes[node].name} failed "
                f"({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            )
        return proc.stdout

    def env(self, node: int) -> dict[str, str]:
        """The environment RabbitMQ's own tools (``rabbitmqctl``, ``rabbitmq-plugins``)
        need to reach ``node``: its files and the shared Erlang cookie."""
        return self._nodes[node].env(self.dir)

    # --- found again from another process ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Node names, ports and options (see :meth:`from_state`)."""
        return {
            "nodes": [
                {"name": n.name, "port": n.port, "dist_port": n.dist_port} for n in self._nodes
            ],
            "username": self.username,
            "password": self.password,
            "net_ticktime": self.net_ticktime,
            "started": self._started,
            "tls_ports": [n.tls_port for n in self._nodes] if self.tls is not None else None,
            "management_ports": [n.management_port for n in self._nodes],
        }

    @classmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """The cluster in ``dir`` as :meth:`state` described it (driven detached)."""
        try:
            members = list(state["nodes"])
            cluster = cls(
                nodes=len(members),
                dir=dir,
                detached=True,
                net_ticktime=int(state["net_ticktime"]),
                username=str(state["username"]),
                password=str(state["password"]),
            )
            cluster._nodes = [
                RabbitNode(
                    index=i,
                    name=str(m["name"]),
                    port=int(m["port"]),
                    dist_port=int(m["dist_port"]),
                    base=Path(dir) / f"n{i}",
                )
                for i, m in enumerate(members)
            ]
            if state.get("tls_ports"):
                cluster.tls = cluster_tls.load(Path(dir))
                ports = [int(p) for p in state["tls_ports"]]
                cluster._nodes = [
                    dataclasses.replace(n, tls_port=p, tls=cluster.tls.server)
                    for n, p in zip(cluster._nodes, ports, strict=True)
                ]
            api_ports = state.get("management_ports") or [None] * len(members)
            cluster._nodes = [
                dataclasses.replace(n, management_port=None if p is None else int(p))
                for n, p in zip(cluster._nodes, api_ports, strict=True)
            ]
            cluster._started = bool(state.get("started")) and any(
                cluster.is_running(i) for i in range(len(members))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"{dir}/cluster.json does not describe a rabbitmq cluster") from exc
        return cluster

    def _save(self) -> None:
        if self.detached and self.dir.is_dir():
            self.save_state()

    # --- internals ----------------------------------------------------------------------

    def _launch(self, node: int) -> None:
        self._nodes[node].launch(self.dir)

    def _run_ctl(
        self, node: int, args: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return self._nodes[node].run_ctl(self.dir, args, timeout)

    def _is_paused(self, node: int) -> bool:
        return pid_paused(self.pid(node))

    def _require_pid(self, node: int) -> int:
        pid = self.pid(node)
        if pid is None:
            raise ClusterError(f"node {self._nodes[node].name} is not running")
        return pid


def management_url_for(host: str, port: int, dirs: Sequence[Path]) -> tuple[Path, str] | None:
    """The cluster directory and management API of the running node that listens on
    ``host:port`` (a loopback address), among the detached clusters in ``dirs``; None
    when none of them has such a node with the management plugin."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    for folder in dirs:
        try:
            state = json.loads((folder / "cluster.json").read_text(encoding="utf-8"))
            if not isinstance(state, dict) or state.get("kind") != RabbitCluster.kind:
                continue
            cluster = RabbitCluster.from_state(folder, state)
        except (OSError, ValueError, ClusterError):
            continue
        for node in cluster.members:
            managed = node.management_port is not None
            if node.port == port and managed and cluster.is_running(node.index):
                return folder, cluster.management_url(node.index)
    return None


@atexit.register
def _stop_leftovers() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop()
