"""A real RabbitMQ cluster on loopback, for integration and chaos tests.

::

    from msgsafe.testing.rabbitmq import RabbitCluster

    with RabbitCluster(size=3) as cluster:
        url = cluster.cluster_url()          # amqp://guest:guest@127.0.0.1:P1,...:P2,...:P3
        cluster.kill(0)                      # SIGKILL node 0's Erlang VM
        cluster.restart(0)                   # start it again; it rejoins the cluster

Each node is Debian's ``rabbitmq-server`` started from ``/usr/lib/rabbitmq/bin`` with its
own name (random suffix, so runs never clash with each other or with the system node
``rabbit@<host>``), its own data, log and pid files under a temporary directory, and
dynamically chosen AMQP and distribution ports. The cluster runs with
``cluster_partition_handling = pause_minority`` and the AMQP 1.0 plugin (which in 3.10
listens on the AMQP 0-9-1 port). Every node started here is killed on :meth:`stop`, on
context exit and, as a last resort, at interpreter exit.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

_R = TypeVar("_R")

__all__ = ["INSTALL_HINT", "RabbitCluster", "RabbitNode", "free_port"]

_SBIN = Path("/usr/lib/rabbitmq/bin")
_SERVER = _SBIN / "rabbitmq-server"
_CTL = _SBIN / "rabbitmqctl"

#: What to run when the broker is missing (the test command does it on fresh machines).
INSTALL_HINT = "apt-get install -y rabbitmq-server"

_LIVE: set[RabbitCluster] = set()
_LIVE_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind port 0 and read it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _whole(status: dict[str, Any] | None, names: set[str]) -> bool:
    """True when a node's ``cluster_status`` shows every node running and no partition."""
    return (
        status is not None
        and set(status.get("running_nodes", [])) == names
        and not status.get("partitions")
    )


def _port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class RabbitNode:
    """One node's identity and files."""

    index: int
    name: str  #: Erlang node name, e.g. ``msgsafe3fa2c1n0@localhost``
    port: int  #: AMQP 0-9-1 and AMQP 1.0 listener on 127.0.0.1
    dist_port: int  #: Erlang distribution port
    base: Path  #: this node's directory (data, logs, config)

    @property
    def pid_file(self) -> Path:
        return self.base / "rabbit.pid"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"


class RabbitCluster:
    """Start, break and stop a RabbitMQ cluster of ``size`` nodes on 127.0.0.1.

    Not thread-safe: drive it from one thread (the test). Nodes are addressed by index
    ``0 .. size-1``; node 0 is the one the others join.
    """

    def __init__(
        self,
        size: int = 3,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        net_ticktime: int = 10,
        username: str = "guest",
        password: str = "guest",
        start_timeout: float = 90.0,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        self.username = username
        self.password = password
        self.start_timeout = start_timeout
        #: NOTE: Erlang's default net_ticktime (60 s) means a SIGSTOPped node is noticed
        #: only after 45-75 s; a shorter tick lets pause_minority and quorum leader
        #: election act within the time a test can afford.
        self.net_ticktime = net_ticktime
        self._own_dir = base_dir is None
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._nodes: list[RabbitNode] = []
        self._paused: set[int] = set()
        self._started = False

    # --- addresses ----------------------------------------------------------------------

    @property
    def nodes(self) -> Sequence[RabbitNode]:
        """The nodes, by index (empty before :meth:`start`)."""
        return tuple(self._nodes)

    @property
    def base_dir(self) -> Path:
        """The directory holding every node's files."""
        if self._base_dir is None:
            raise RuntimeError("the cluster is not started")
        return self._base_dir

    @property
    def urls(self) -> list[str]:
        """One AMQP 0-9-1 URL per node."""
        return [self.url(i) for i in range(len(self._nodes))]

    def url(self, i: int) -> str:
        """``amqp://guest:guest@127.0.0.1:P`` of node ``i``."""
        return f"amqp://{self.username}:{self.password}@127.0.0.1:{self._nodes[i].port}"

    def cluster_url(self, order: Sequence[int] | None = None, *, vhost: str = "") -> str:
        """One AMQP 0-9-1 URL listing every node (or ``order``'s nodes, in that order)."""
        idx = list(order) if order is not None else list(range(len(self._nodes)))
        hosts = ",".join(f"127.0.0.1:{self._nodes[i].port}" for i in idx)
        path = f"/{vhost}" if vhost else ""
        return f"amqp://{self.username}:{self.password}@{hosts}{path}"

    def amqp10_url(self, i: int) -> str:
        """``amqp10://guest:guest@127.0.0.1:P`` of node ``i`` (same port as 0-9-1)."""
        return f"amqp10://{self.username}:{self.password}@127.0.0.1:{self._nodes[i].port}"

    def port(self, i: int) -> int:
        """The AMQP port (0-9-1 and 1.0) of node ``i``."""
        return self._nodes[i].port

    def pid(self, i: int) -> int | None:
        """The OS pid of node ``i``'s Erlang VM, or None when it has no pid file."""
        try:
            text = self._nodes[i].pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    # --- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> RabbitCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every node, form the cluster and wait until all are running.

        Raises RuntimeError (naming the package to install when RabbitMQ is missing, or
        quoting the node's log when a node does not come up); on failure every node
        already started is killed.
        """
        if self._started:
            return
        if not _SERVER.exists() or not _CTL.exists():
            raise RuntimeError(f"RabbitMQ is not installed ({_SERVER} is missing): {INSTALL_HINT}")
        if self._base_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="msgsafe-rabbit-"))
        self._base_dir.mkdir(parents=True, exist_ok=True)
        home = self._base_dir / "home"
        home.mkdir(exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(16).upper())
            cookie.chmod(0o400)
        (self._base_dir / "rabbitmq-env.conf").write_text(
            'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"\n'
        )
        suffix = secrets.token_hex(3)
        self._nodes = []
        for i in range(self.size):
            base = self._base_dir / f"n{i}"
            node = RabbitNode(
                index=i,
                name=f"msgsafe{suffix}n{i}@localhost",
                port=free_port(),
                dist_port=free_port(),
                base=base,
            )
            self._write_node_files(node)
            self._nodes.append(node)
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._started = True
        try:
            for i in range(self.size):
                self._launch(i)
            deadline = time.monotonic() + self.start_timeout
            self._each(functools.partial(self._wait_ready_for, self.start_timeout))
            first = self._nodes[0].name
            for i in range(1, self.size):
                self.ctl(i, "stop_app")
                self.ctl(i, "join_cluster", first)
                self.ctl(i, "start_app")
            left = max(1.0, deadline - time.monotonic())
            self._each(functools.partial(self._wait_ready_for, left))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every node and remove the files (when the directory was ours). Idempotent."""
        for i in range(len(self._nodes)):
            with contextlib.suppress(Exception):
                self.kill(i)
        self._paused.clear()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._started and self._own_dir and self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None
        self._started = False

    # --- faults -------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``'s Erlang VM and wait until it is gone."""
        pid = self.pid(i)
        if pid is None:
            return
        if i in self._paused:
            self._paused.discard(i)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            # NOTE: a stopped process still dies on SIGKILL; SIGCONT is not needed.
        _wait_gone(pid, timeout=10.0)
        with contextlib.suppress(OSError):
            self._nodes[i].pid_file.unlink()

    def kill_all(self) -> None:
        """SIGKILL every node (a whole-cluster outage), after each has synced its metadata log.

        NOTE: a run once lost a quorum queue declared seconds before every node was
        killed (afterwards every node answered NOT_FOUND for it, and RabbitMQ 3.10's
        AMQP 1.0 plugin accepted messages sent to the vanished queue); the metadata log
        (Mnesia) may still sit in the VM's buffers that soon after a declaration. The
        outage under test is of the messages, not of the declaration, so the declaration
        is made durable first (``mnesia:sync_log()``).
        """
        self._each(self._sync_metadata_log)
        for i in range(len(self._nodes)):
            self.kill(i)

    def _sync_metadata_log(self, i: int) -> None:
        if self.is_running(i) and i not in self._paused:
            with contextlib.suppress(RuntimeError):  # ctl's failures and timeouts
                self.ctl(i, "eval", "mnesia:sync_log().", timeout=15)

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``: it holds its sockets open but answers nothing."""
        pid = self._require_pid(i)
        os.kill(pid, signal.SIGSTOP)
        self._paused.add(i)

    def resume(self, i: int) -> None:
        """SIGCONT node ``i``."""
        pid = self._require_pid(i)
        os.kill(pid, signal.SIGCONT)
        self._paused.discard(i)

    def restart(self, i: int, *, timeout: float = 60.0) -> None:
        """Start node ``i`` again (after :meth:`kill`) and wait until it runs."""
        self.kill(i)
        self._launch(i)
        self.wait_ready(i, timeout=timeout)

    def status(self, i: int) -> dict[str, Any]:
        """``rabbitmqctl cluster_status`` of node ``i`` as a dict (``running_nodes``,
        ``partitions``, ...)."""
        data = json.loads(self.ctl(i, "cluster_status", "--formatter", "json", timeout=30))
        if not isinstance(data, dict):
            raise RuntimeError("unexpected cluster_status output")
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
        for i in list(self._paused):
            self.resume(i)
        restarted: set[int] = set()
        nodes = range(len(self._nodes))
        names = {n.name for n in self._nodes}
        while True:
            for i in nodes:
                if not self.is_running(i):
                    self._launch(i)
            # NOTE: every rabbitmqctl call boots an Erlang VM (about a second here), so
            # the nodes are asked at the same time, not one after the other.
            left = max(1.0, deadline - time.monotonic())
            self._each(functools.partial(self._wait_ready_for, left))
            statuses = self._each(self._status_or_none)
            if all(_whole(status, names) for status in statuses):
                return
            minority: set[int] = set()
            for status in statuses:
                running = set((status or {}).get("running_nodes", []))
                if running != names and len(running) * 2 > len(names):
                    minority = {j for j, n in enumerate(self._nodes) if n.name not in running}
                    break
            if time.monotonic() >= deadline:
                raise RuntimeError("the cluster did not heal in time")
            todo = minority - restarted
            for j in todo:
                self.kill(j)  # relaunched at the top of the loop
            restarted |= todo
            if not todo:
                time.sleep(0.5)

    def _wait_ready_for(self, timeout: float, i: int) -> None:
        self.wait_ready(i, timeout=timeout)

    def _status_or_none(self, i: int) -> dict[str, Any] | None:
        try:
            return self.status(i)
        except (RuntimeError, ValueError):
            return None

    def _each(self, call: Callable[[int], _R]) -> list[_R]:
        """``call(i)`` for every node at once, results in node order; the first error
        (in node order) is raised after all have finished."""
        with concurrent.futures.ThreadPoolExecutor(len(self._nodes)) as pool:
            futures = [pool.submit(call, i) for i in range(len(self._nodes))]
        return [future.result() for future in futures]

    def is_running(self, i: int) -> bool:
        """True when node ``i``'s VM process exists (paused counts as running)."""
        pid = self.pid(i)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def wait_ready(self, i: int, timeout: float = 60.0) -> None:
        """Wait until node ``i`` runs the rabbit application and accepts AMQP connections."""
        node = self._nodes[i]
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.is_running(i) and node.pid_file.exists():
                break
            if _port_open(node.port):
                left = max(1, int(deadline - time.monotonic()))
                proc = self._run_ctl(i, ["await_startup", "--timeout", str(left)], left + 10)
                if proc.returncode == 0:
                    return
                last = (proc.stderr or proc.stdout).strip()
            time.sleep(0.2)
        raise RuntimeError(
            f"RabbitMQ node {node.name} not ready within {timeout:.0f} s: {last}\n"
            f"{self._log_tail(i)}"
        )

    def ctl(self, i: int, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node i> ARGS``; returns stdout, raises RuntimeError on failure."""
        proc = self._run_ctl(i, list(args), timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {self._nodes[i].name} failed "
                f"({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            )
        return proc.stdout

    # --- internals ----------------------------------------------------------------------

    def _env(self, node: RabbitNode) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.base_dir / "home"),
            RABBITMQ_CONF_ENV_FILE=str(self.base_dir / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(node.port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_MNESIA_BASE=str(node.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.log_dir),
            RABBITMQ_PID_FILE=str(node.pid_file),
            RABBITMQ_CONFIG_FILE=str(node.base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(node.base / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(node.base / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(node.base / "plugins-expand"),
        )
        return env

    def _write_node_files(self, node: RabbitNode) -> None:
        node.base.mkdir(parents=True, exist_ok=True)
        node.log_dir.mkdir(exist_ok=True)
        (node.base / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = 127.0.0.1:{node.port}",
                    "loopback_users = none",
                    "cluster_partition_handling = pause_minority",
                    f"net_ticktime = {self.net_ticktime}",
                    # NOTE: the default disk alarm (50 MB free) would block publishers on
                    # a busy CI disk; tests that want an alarm set it explicitly.
                    "disk_free_limit.absolute = 1MB",
                    "log.file.level = info",
                    "log.console = false",
                    "",
                ]
            )
        )
        (node.base / "advanced.config").write_text("[].\n")
        (node.base / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")

    def _launch(self, i: int) -> None:
        node = self._nodes[i]
        with contextlib.suppress(OSError):
            node.pid_file.unlink()
        proc = subprocess.run(
            [str(_SERVER), "-detached"],
            env=self._env(node),
            cwd=node.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"rabbitmq-server -detached for {node.name} failed ({proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()}"
            )

    def _run_ctl(self, i: int, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        node = self._nodes[i]
        try:
            return subprocess.run(
                [str(_CTL), "-n", node.name, *args],
                env=self._env(node),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, "", f"timed out after {timeout} s")

    def _require_pid(self, i: int) -> int:
        pid = self.pid(i)
        if pid is None:
            raise RuntimeError(f"node {self._nodes[i].name} is not running")
        return pid

    def _log_tail(self, i: int, lines: int = 30) -> str:
        out: list[str] = []
        for path in sorted(self._nodes[i].log_dir.glob("*.log")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(out)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # NOTE: a killed child of ours stays a zombie until reaped; -detached VMs are
        # re-parented to init, which reaps them.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


@atexit.register
def _stop_leftovers() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop()
