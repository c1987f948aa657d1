"""What the JVM launchers with N numbered nodes (Kafka, Broker-J) share: one pid per
node, kept in ``cluster.json`` when detached, and the same kill, pause, resume, stop and
restart of those pids.

A launcher subclasses :class:`JvmCluster`, sets :attr:`JvmCluster.count`,
:attr:`JvmCluster.pids` and :attr:`JvmCluster.ports`, and answers the hooks: where a
node lives (:meth:`JvmCluster._node_dir`), the file on its command line that identifies
it (:meth:`JvmCluster._marker`), its log, its ports, how it is spawned and when a
restarted node serves again.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from msgsafe.cluster._process import (
    free_ports,
    kill_pid,
    pause_pid,
    pid_alive,
    pid_paused,
    port_free,
    signal_pid,
    stop_pid,
    stop_pids,
    tail,
    wait_for,
)
from msgsafe.cluster.base import STATE_FILE, ClusterError, LocalCluster, NodeInfo

__all__ = ["HOST", "JvmCluster"]

log = logging.getLogger(__name__)

#: Every node listens on loopback only.
HOST = "127.0.0.1"


class JvmCluster(LocalCluster):
    """Nodes ``0..count-1``, each one JVM whose pid is ``pids[node]`` (None: not started
    or gone); see the module docstring for the hooks a launcher fills in."""

    version: str
    count: int
    pids: list[int | None]
    ports: list[int]
    #: Each JVM's ``-Xmx`` in MiB.
    heap_mb: int
    #: Seconds the last :meth:`start` took until the cluster served.
    start_seconds: float

    def _setup(
        self,
        nodes: int,
        dir: str | Path | None,
        base_port: int | None,
        detached: bool,
        *,
        heap_mb: int,
        version: str,
        what: str,
        port_lists: int,
    ) -> list[list[int]]:
        """Set what every JVM launcher keeps (the constructor's first step) and return
        ``port_lists`` lists of ``nodes`` ports each, the first being the client ports
        (:attr:`ports`): free ports, or with ``base_port`` list ``k`` of node ``i`` is
        ``base_port + k * nodes + i``. ``what`` names the cluster in the error for
        ``nodes < 1``."""
        if nodes < 1:
            raise ClusterError(f"a {what} needs at least one node")
        self.version = version
        self.count = nodes
        self._take_dir(dir, f"msgsafe-{self.kind}-")
        self.detached = detached
        self.heap_mb = heap_mb
        self.pids = [None] * nodes
        self.start_seconds = 0.0
        total = port_lists * nodes
        picked = free_ports(total) if base_port is None else [base_port + i for i in range(total)]
        lists = [picked[k * nodes : (k + 1) * nodes] for k in range(port_lists)]
        self.ports = lists[0]
        return lists

    # --- hooks ----------------------------------------------------------------------------

    @abstractmethod
    def _node_dir(self, node: int) -> Path:
        """The directory of ``node``'s configuration and data."""

    @abstractmethod
    def _marker(self, node: int) -> Path:
        """A path on ``node``'s command line only: it tells our JVM from a process
        that got a recorded pid after ours exited."""

    @abstractmethod
    def _log(self, node: int) -> Path:
        """The file the node's JVM writes its output to."""

    @abstractmethod
    def _node_ports(self, node: int) -> Sequence[int]:
        """Every port ``node`` binds (all must be free before it starts again)."""

    @abstractmethod
    def _lib(self) -> Path:
        """The jars, checked (:class:`ClusterError` when missing or damaged)."""

    @abstractmethod
    def _spawn(self, node: int, lib: Path) -> None:
        """Start ``node``'s JVM and set ``pids[node]``."""

    @abstractmethod
    def _prepare(self, lib: Path) -> None:
        """Write what the nodes need before their first start (configuration, storage)."""

    @abstractmethod
    def _wait_serving(self, deadline: float) -> None:
        """Wait until the started cluster serves (``deadline`` on the monotonic clock)."""

    @abstractmethod
    def _wait_back(self, node: int, deadline: float) -> None:
        """Wait until a restarted ``node`` serves again (``deadline`` on the monotonic
        clock)."""

    @abstractmethod
    def _roles(self) -> list[str | None]:
        """Every node's role as :meth:`nodes` shows it (None for one that does not run)."""

    def _name(self, node: int) -> str:
        """The node's name in :meth:`nodes`."""
        return f"{self.kind}-{node}"

    def _tails(self, nodes: Sequence[int]) -> str:
        """What to quote from the logs of ``nodes`` when they fail."""
        return "\n".join(tail(self._log(node), 15) for node in nodes)

    # --- processes ------------------------------------------------------------------------

    def _what(self, node: int) -> str:
        return f"{self.kind} node {node}"

    def _check_index(self, node: int) -> None:
        if not 0 <= node < self.count:
            raise ClusterError(f"no {self._what(node)} (nodes are 0..{self.count - 1})")

    def _pid(self, node: int) -> int:
        """``node``'s pid; :class:`ClusterError` when it does not run."""
        self._check_index(node)
        pid = self.pids[node]
        if pid is None or not self._running(node):
            raise ClusterError(f"{self._what(node)} is not running")
        return pid

    def _running(self, node: int) -> bool:
        pid = self.pids[node]
        if not pid_alive(pid):
            return False
        # A pid from cluster.json may have been reused by another process since. An
        # empty cmdline is no answer: it reads empty while a process is in exec, as a
        # JVM launched a moment ago can be.
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            return not cmdline or str(self._marker(node)).encode() in cmdline
        return True

    def _paused(self, node: int) -> bool:
        return pid_paused(self.pids[node])

    def _check_not_running(self) -> None:
        for node in range(self.count):
            if self._running(node):
                raise ClusterError(f"{self._what(node)} already runs (pid {self.pids[node]})")

    def _check_alive(self, nodes: Sequence[int]) -> None:
        """:class:`ClusterError` with its log when one of ``nodes`` has exited."""
        for node in nodes:
            if not self._running(node):
                raise ClusterError(
                    f"{self._what(node)} exited while starting\n{self._tails([node])}"
                )

    @staticmethod
    def _check_ports_free(ports: Sequence[int]) -> None:
        for port in ports:
            if not port_free(port):
                raise ClusterError(f"port {port} on {HOST} is taken: use another base port")

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start every node and wait until the cluster serves (the launcher's docstring
        says what that means); :attr:`start_seconds` says how long it took. On failure
        stop what started, remove a temp dir and raise :class:`ClusterError` quoting the
        failing node's log."""
        timeout = 180.0 if timeout is None else timeout
        started = time.monotonic()
        self._check_not_running()
        try:  # from here on, a failure stops what started and removes a temp dir
            lib = self._lib()
            self._check_ports_free([p for n in range(self.count) for p in self._node_ports(n)])
            self.dir.mkdir(parents=True, exist_ok=True)
            self._prepare(lib)
            self._spawn_all(lib, started + timeout)
            self._save()
            log.info("%s: %d nodes launched, waiting until they serve", self.kind, self.count)
            self._wait_serving(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        log.info(
            "%s: %d nodes serving in %.1f s: %s",
            self.kind,
            self.count,
            self.start_seconds,
            self.url,
        )

    def _spawn_all(self, lib: Path, deadline: float) -> None:
        """Launch every node; a cluster whose nodes must come up in order overrides it."""
        for node in range(self.count):
            self._spawn(node, lib)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every node, SIGKILL what is left after ``grace`` seconds; remove the
        temp dir this cluster made. Idempotent."""
        launched = any(pid is not None for pid in self.pids)
        # Only our own nodes: a pid in cluster.json may belong to another process by now.
        ours = [node for node in range(self.count) if self._running(node)]
        stop_pids([(self._what(node), self.pids[node]) for node in ours], grace)
        self.pids = [None] * self.count
        if launched or (self.dir / STATE_FILE).exists():  # no state for a start that never ran
            self._save()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self, node: int) -> None:
        """SIGKILL ``node``; its data stays, as after a crash."""
        kill_pid(self._pid(node), self._what(node))
        self.pids[node] = None
        self._save()

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Stop ``node`` if it runs, start it on its ports with its data, and wait until
        it serves again (what that means is the launcher's ``_wait_back``)."""
        timeout = 120.0 if timeout is None else timeout
        self._check_index(node)
        if self._running(node):
            stop_pid(self.pids[node], self._what(node), 30.0)
        self.pids[node] = None
        ports = self._node_ports(node)
        wait_for(
            lambda: all(port_free(port) for port in ports),
            30.0,
            f"the ports of {self._what(node)} to be free",
        )
        started = time.monotonic()
        self._spawn(node, self._lib())
        self._save()
        self._wait_back(node, started + timeout)
        log.info("%s back in %.1f s", self._what(node), time.monotonic() - started)

    def pause(self, node: int) -> None:
        """SIGSTOP ``node``: its sockets stay open and it answers nothing."""
        pause_pid(self._pid(node), self._what(node))

    def resume(self, node: int) -> None:
        """SIGCONT ``node``."""
        signal_pid(self._pid(node), signal.SIGCONT)

    # --- what it looks like ---------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every node with its role, ``paused`` while it is SIGSTOPped (by any process)."""
        roles = self._roles()
        result = []
        for node in range(self.count):
            running = self._running(node)
            result.append(
                NodeInfo(
                    name=self._name(node),
                    pid=self.pids[node] if running else None,
                    host=HOST,
                    port=self.ports[node],
                    running=running,
                    role="paused" if running and self._paused(node) else roles[node],
                )
            )
        return result

    # --- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Version, node count, client ports, pids and heap, plus :meth:`_own_state`
        (see :meth:`from_state`)."""
        return {
            "version": self.version,
            "nodes": self.count,
            "ports": self.ports,
            "pids": self.pids,
            "heap_mb": self.heap_mb,
            **self._own_state(),
        }

    @classmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """The cluster in ``dir`` as :meth:`state` described it (driven detached)."""
        try:
            count = int(state["nodes"])
            # Every launcher's constructor takes (nodes, dir, detached=, heap_mb=, ...).
            make: Callable[..., Self] = cls
            cluster = make(
                count, dir, detached=True, heap_mb=int(state["heap_mb"]), **cls._options(state)
            )
            cluster.version = str(state["version"])
            cluster.ports = [int(p) for p in state["ports"]]
            cluster.pids = [int(p) if p is not None else None for p in state["pids"]]
            if len(cluster.ports) != count or len(cluster.pids) != count:
                raise ValueError("port or pid list does not match the node count")
            cluster._restore(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(
                f"{dir}/cluster.json does not describe a {cls.kind} cluster"
            ) from exc
        return cluster

    @abstractmethod
    def _own_state(self) -> dict[str, Any]:
        """What :meth:`state` records beyond the common entries."""

    @classmethod
    @abstractmethod
    def _options(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The constructor's own keyword arguments, from a :meth:`state`."""

    @abstractmethod
    def _restore(self, state: dict[str, Any]) -> None:
        """Take the rest of a :meth:`state` (ports beyond the client ones, ids);
        ``KeyError``, ``TypeError`` or ``ValueError`` when it does not fit."""

    def _save(self) -> None:
        if self.detached:
            self.save_state()
