"""A Spark standalone cluster on loopback, from the installed PySpark, for users and tests.

::

    from msgsafe.cluster.spark import SparkCluster

    with SparkCluster(nodes=2) as cluster:      # a master and two workers
        spark = SparkSession.builder.master(cluster.url).getOrCreate()   # spark://...
        cluster.kill_executor(cluster.executors()[0].pid)   # an executor dies mid-job
        cluster.kill(0)                         # worker 0 (and its executors) die
        cluster.restart(0)                      # worker 0 registers with the master again

``SPARK_HOME`` is the ``pyspark`` package itself (its ``bin/spark-class`` and ``jars/``);
the JVMs are Spark's own ``deploy.master.Master`` and ``deploy.worker.Worker`` with
``SPARK_LOCAL_IP=127.0.0.1``, each worker with ``cores`` cores and ``memory`` of executor
memory; executors run this interpreter as their Python (``PYSPARK_PYTHON``).

Nodes, as :meth:`SparkCluster.nodes` lists them: ``worker-0`` .. ``worker-N-1`` (index
``i`` is worker ``i``), then ``master``, then every executor the workers run right now
(``executor-W`` for worker W's executor, ``executor-W.K`` when it runs several). Every
one can be killed (SIGKILL), paused and resumed; workers and the master can be restarted
on their ports (a worker registers again; the master waits for it); a killed executor
is replaced by its worker by itself (Spark's standalone scheduling), so it has no
restart.

Layout of ``dir``: ``master.log``, ``worker-<I>.log``, ``worker-<I>/`` (the worker's
``work`` dir with each executor's stdout/stderr, and ``local`` scratch space), ``conf/``
(an empty ``SPARK_CONF_DIR``), ``cluster.json`` when detached.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from msgsafe.cluster import maven
from msgsafe.cluster._process import (
    free_ports,
    kill_pid,
    pause_pid,
    pid_alive,
    pid_paused,
    port_free,
    signal_pid,
    spawn,
    stop_pids,
    tail,
    wait_for,
)
from msgsafe.cluster.base import ClusterError, LocalCluster, NodeInfo

__all__ = ["INSTALL_HINT", "Executor", "SparkCluster", "spark_home"]

#: What to install when PySpark or Java is missing.
INSTALL_HINT = "pip install 'pyspark>=4.0' and apt-get install -y openjdk-17-jre-headless"

HOST = "127.0.0.1"

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = b"CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The installed ``pyspark`` package, which is a whole ``SPARK_HOME``."""
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterError(f"PySpark is missing: {INSTALL_HINT}") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file() or not (home / "jars").is_dir():
        raise ClusterError(f"{home} holds no Spark distribution (bin/spark-class, jars/)")
    return home


@dataclass(frozen=True, slots=True)
class Executor:
    """One executor JVM (``CoarseGrainedExecutorBackend``) a worker runs for an application."""

    worker: int
    pid: int
    app_id: str | None


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            # The command in parentheses may hold spaces: the parent follows its last ")".
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> list[bytes]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return []


class SparkCluster(LocalCluster):
    """A standalone master and ``nodes`` workers on 127.0.0.1; see the module docstring.

    ``dir`` None: a temp dir, removed by :meth:`stop`. ``base_port`` None: free ports;
    else the master listens on ``base_port``, its web UI on ``base_port + 1``, worker
    ``i`` on ``base_port + 2 + 2i`` and its web UI on the port after. ``detached``: the
    JVMs outlive this process (``msgsafe cluster up spark``).
    """

    kind: ClassVar[str] = "spark"

    def __init__(
        self,
        nodes: int = 2,
        dir: str | os.PathLike[str] | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        cores: int = 1,
        memory: str = "1g",
        heap_mb: int = 256,
    ) -> None:
        if nodes < 1:
            raise ClusterError("a Spark cluster needs at least one worker")
        if cores < 1:
            raise ClusterError("each worker needs at least one core")
        self.count = nodes
        self._take_dir(dir, "msgsafe-spark-")
        self.detached = detached
        self.cores = cores
        self.memory = memory
        self.heap_mb = heap_mb
        total = 2 + 2 * nodes
        ports = free_ports(total) if base_port is None else [base_port + i for i in range(total)]
        self.master_port, self.master_ui_port = ports[0], ports[1]
        self.worker_ports = ports[2::2]
        self.worker_ui_ports = ports[3::2]
        self.master_pid: int | None = None
        self.worker_pids: list[int | None] = [None] * nodes
        #: Seconds the last :meth:`start` took until every worker was registered.
        self.start_seconds = 0.0

    @classmethod
    def fetch(cls) -> None:
        """Check that PySpark (a whole Spark) and Java are installed."""
        spark_home()
        maven.java()

    # --- processes ------------------------------------------------------------------------

    def _ours(self, pid: int | None) -> bool:
        """True while ``pid`` runs and is a daemon of this cluster: a pid from cluster.json
        may belong to another process by now. (Every daemon's command line names its
        properties file in ``dir``; an empty one is a process in exec.)"""
        if not pid_alive(pid):
            return False
        argv = _cmdline(pid or 0)
        return not any(argv) or any(str(self.dir).encode() in part for part in argv)

    def _env(self) -> dict[str, str]:
        home = spark_home()
        java = Path(os.path.realpath(maven.java()))
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(home),
                "JAVA_HOME": str(java.parent.parent),
                "SPARK_LOCAL_IP": HOST,
                "SPARK_CONF_DIR": str(self.dir / "conf"),
                "SPARK_DAEMON_MEMORY": f"{self.heap_mb}m",
                "PYSPARK_PYTHON": sys.executable,
            }
        )
        return env

    def _spark_class(self, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), *args]

    def _properties(self) -> Path:
        """The daemons' properties file; on every command line, so it also marks ours."""
        path = self.dir / "conf" / "spark-defaults.conf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # A worker that died is dropped by the master after 10 s, not 60; no REST
            # submission server (it takes the fixed port 6066 or the next free one).
            path.write_text("spark.worker.timeout 10\nspark.master.rest.enabled false\n")
        return path

    def _spawn_master(self) -> None:
        argv = self._spark_class(
            _MASTER_CLASS,
            "--host",
            HOST,
            "--port",
            str(self.master_port),
            "--webui-port",
            str(self.master_ui_port),
            "--properties-file",
            str(self._properties()),
        )
        self.master_pid = spawn(
            argv, log=self.dir / "master.log", env=self._env(), detached=self.detached
        )

    def _spawn_worker(self, index: int) -> None:
        home = self.dir / f"worker-{index}"
        (home / "local").mkdir(parents=True, exist_ok=True)
        env = self._env()
        env["SPARK_WORKER_DIR"] = str(home / "work")
        env["SPARK_LOCAL_DIRS"] = str(home / "local")
        argv = self._spark_class(
            _WORKER_CLASS,
            "--host",
            HOST,
            "--port",
            str(self.worker_ports[index]),
            "--webui-port",
            str(self.worker_ui_ports[index]),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(home / "work"),
            "--properties-file",
            str(self._properties()),
            self.url,
        )
        self.worker_pids[index] = spawn(
            argv, log=self.dir / f"worker-{index}.log", env=env, detached=self.detached
        )

    def _master_state(self) -> dict[str, Any] | None:
        """The master's JSON status page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://{HOST}:{self.master_ui_port}/json/", timeout=2.0
            ) as answer:
                state: dict[str, Any] = json.loads(answer.read())
                return state
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _alive_worker_ports(self) -> set[int]:
        state = self._master_state() or {}
        return {
            int(w.get("port", 0)) for w in state.get("workers", []) if w.get("state") == "ALIVE"
        }

    def _check_alive(self) -> None:
        if not self._ours(self.master_pid):
            raise ClusterError(f"the Spark master exited\n{tail(self.dir / 'master.log', 20)}")
        for index, pid in enumerate(self.worker_pids):
            if pid is not None and not self._ours(pid):
                raise ClusterError(
                    f"Spark worker {index} exited\n{tail(self.dir / f'worker-{index}.log', 20)}"
                )

    def _wait_registered(self, workers: Sequence[int], timeout: float) -> None:
        ports = {self.worker_ports[i] for i in workers}

        def registered() -> bool:
            self._check_alive()
            return ports <= self._alive_worker_ports()

        wait_for(
            registered,
            timeout,
            f"Spark workers {sorted(workers)} to register with the master",
            interval=0.2,
            on_timeout=lambda: tail(self.dir / "master.log", 20),
        )

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the master and every worker; return when every worker is registered
        (the cluster takes applications). On failure stop what started."""
        limit = 120.0 if timeout is None else timeout
        started = time.monotonic()
        self.fetch()
        if self._ours(self.master_pid) or any(self._ours(p) for p in self.worker_pids):
            raise ClusterError(f"a Spark cluster already runs in {self.dir}")
        try:
            for port in (self.master_port, self.master_ui_port, *self.worker_ports):
                if not port_free(port):
                    raise ClusterError(f"port {port} on {HOST} is taken: use another base port")
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "conf").mkdir(exist_ok=True)
            self._spawn_master()
            for index in range(self.count):
                self._spawn_worker(index)
            self._save()
            self._wait_registered(range(self.count), limit)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stop the executors, workers and master (SIGTERM, SIGKILL after 15 s); remove
        the temp dir this cluster made. Idempotent."""
        executors = [(f"Spark executor {e.pid}", e.pid) for e in self.executors()]
        workers = [
            (f"Spark worker {i}", pid) for i, pid in enumerate(self.worker_pids) if self._ours(pid)
        ]
        master = [("the Spark master", self.master_pid)] if self._ours(self.master_pid) else []
        stop_pids([*executors, *workers, *master], 15.0)
        launched = self.master_pid is not None
        self.master_pid = None
        self.worker_pids = [None] * self.count
        if launched:
            self._save()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _node(self, node: int) -> tuple[str, int | None]:
        """(what, pid) of node ``node`` as :meth:`nodes` numbers them."""
        if 0 <= node < self.count:
            return f"Spark worker {node}", self.worker_pids[node]
        if node == self.count:
            return "the Spark master", self.master_pid
        executors = self.executors()
        if self.count < node <= self.count + len(executors):
            executor = executors[node - self.count - 1]
            return f"Spark executor {executor.pid} of worker {executor.worker}", executor.pid
        raise ClusterError(f"no Spark node {node} (nodes: msgsafe cluster status)")

    def kill(self, node: int) -> None:
        """SIGKILL a worker (its executors exit with it), the master, or an executor (its
        worker starts a new one while the application runs)."""
        what, pid = self._node(node)
        if not (self._ours(pid) if node <= self.count else pid_alive(pid)):
            raise ClusterError(f"{what} is not running")
        kill_pid(pid, what)
        self._save()

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start a worker or the master again on its ports and wait until every running
        worker is registered. Executors have no restart: their worker replaces them."""
        limit = 60.0 if timeout is None else timeout
        what, pid = self._node(node)
        if node > self.count:
            raise ClusterError(
                f"{what} cannot be restarted: its worker starts a new executor by itself"
            )
        if self._ours(pid):
            stop_pids([(what, pid)], 15.0)
        if node == self.count:
            wait_for(lambda: port_free(self.master_port), 30.0, "the master's port to be free")
            self._spawn_master()
        else:
            port = self.worker_ports[node]
            wait_for(lambda: port_free(port), 30.0, f"the port of Spark worker {node}")
            self._spawn_worker(node)
        self._save()
        running = [i for i, p in enumerate(self.worker_pids) if self._ours(p)]
        self._wait_registered(running, limit)

    def pause(self, node: int) -> None:
        """SIGSTOP a worker, the master or an executor."""
        what, pid = self._node(node)
        if pid is None:
            raise ClusterError(f"{what} is not running")
        pause_pid(pid, what)

    def resume(self, node: int) -> None:
        """SIGCONT a paused node."""
        signal_pid(self._node(node)[1], signal.SIGCONT)

    # --- executors ------------------------------------------------------------------------

    def executors(self, worker: int | None = None) -> list[Executor]:
        """The executors the workers (or ``worker``) run now, by worker and pid."""
        found: list[Executor] = []
        for index, pid in enumerate(self.worker_pids):
            if (worker is not None and index != worker) or not self._ours(pid):
                continue
            for child in sorted(_children(pid or 0)):
                argv = _cmdline(child)
                if not any(_EXECUTOR_CLASS in part for part in argv) or not pid_alive(child):
                    continue
                app = None
                if b"--app-id" in argv and argv.index(b"--app-id") + 1 < len(argv):
                    app = argv[argv.index(b"--app-id") + 1].decode(errors="replace")
                found.append(Executor(index, child, app))
        return found

    def executor_of(self, pid: int) -> Executor | None:
        """The executor that ``pid`` (e.g. a Python worker of a task) runs under, or None."""
        by_pid = {e.pid: e for e in self.executors()}
        current: int | None = pid
        for _ in range(16):  # executor JVM -> pyspark daemon -> forked worker: 3 levels
            if current is None or current <= 1:
                return None
            if current in by_pid:
                return by_pid[current]
            try:
                stat = Path(f"/proc/{current}/stat").read_text()
                current = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                return None
        return None

    def kill_executor(self, pid: int) -> Executor:
        """SIGKILL the executor ``pid`` (or the one that process ``pid`` runs under)."""
        executor = self.executor_of(pid)
        if executor is None:
            raise ClusterError(f"process {pid} is no executor of this Spark cluster")
        kill_pid(executor.pid, f"Spark executor {executor.pid}")
        return executor

    # --- what it looks like ---------------------------------------------------------------

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:PORT``: the master URL for ``SparkSession.builder.master``."""
        return f"spark://{HOST}:{self.master_port}"

    def node_url(self, node: int) -> str:
        """The master URL (applications reach every worker through the master)."""
        return self.url

    @property
    def ui_url(self) -> str:
        """The master's web UI (``/json/`` there is the cluster's state)."""
        return f"http://{HOST}:{self.master_ui_port}"

    def nodes(self) -> list[NodeInfo]:
        """Workers (role ``worker``), the master (role ``master``) and the executors
        running now (role ``executor``); ``paused`` while SIGSTOPped."""

        def info(name: str, pid: int | None, port: int, role: str) -> NodeInfo:
            running = self._ours(pid) if role != "executor" else pid_alive(pid)
            return NodeInfo(
                name=name,
                pid=pid if running else None,
                host=HOST,
                port=port,
                running=running,
                role="paused" if running and pid_paused(pid) else role,
            )

        result = [
            info(f"worker-{i}", pid, self.worker_ports[i], "worker")
            for i, pid in enumerate(self.worker_pids)
        ]
        result.append(info("master", self.master_pid, self.master_port, "master"))
        executors = self.executors()
        per_worker: dict[int, int] = {}
        for executor in executors:
            per_worker[executor.worker] = per_worker.get(executor.worker, 0) + 1
        seen: dict[int, int] = {}
        for executor in executors:
            rank = seen.get(executor.worker, 0)
            seen[executor.worker] = rank + 1
            name = f"executor-{executor.worker}"
            if per_worker[executor.worker] > 1:
                name += f".{rank}"
            result.append(info(name, executor.pid, 0, "executor"))
        return result

    def describe(self) -> dict[str, Any]:
        """The common description plus the master's web UI address."""
        return {**super().describe(), "ui": self.ui_url}

    # --- found again from another process ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Ports, pids and sizes (see :meth:`from_state`)."""
        return {
            "nodes": self.count,
            "cores": self.cores,
            "memory": self.memory,
            "heap_mb": self.heap_mb,
            "master_port": self.master_port,
            "master_ui_port": self.master_ui_port,
            "worker_ports": self.worker_ports,
            "worker_ui_ports": self.worker_ui_ports,
            "master_pid": self.master_pid,
            "worker_pids": self.worker_pids,
        }

    @classmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """The cluster in ``dir`` as :meth:`state` described it (driven detached)."""
        try:
            cluster = cls(
                int(state["nodes"]),
                dir,
                detached=True,
                cores=int(state["cores"]),
                memory=str(state["memory"]),
                heap_mb=int(state["heap_mb"]),
            )
            cluster.master_port = int(state["master_port"])
            cluster.master_ui_port = int(state["master_ui_port"])
            cluster.worker_ports = [int(p) for p in state["worker_ports"]]
            cluster.worker_ui_ports = [int(p) for p in state["worker_ui_ports"]]
            pid = state["master_pid"]
            cluster.master_pid = None if pid is None else int(pid)
            cluster.worker_pids = [None if p is None else int(p) for p in state["worker_pids"]]
            if len(cluster.worker_ports) != cluster.count:
                raise ValueError("worker ports do not match the node count")
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"{dir}/cluster.json does not describe a spark cluster") from exc
        return cluster

    def _save(self) -> None:
        if self.detached and self.dir.is_dir():
            self.save_state()
