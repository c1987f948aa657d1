"""The shape every launcher of a real local broker has.

A :class:`LocalCluster` starts ``nodes`` broker processes on loopback, in ``dir``, and
can break them one at a time the way the chaos tests and users need: ``kill`` (SIGKILL),
``pause`` (SIGSTOP), ``resume`` (SIGCONT), ``restart`` (on the same ports, with the same
data). ``stop`` leaves no process behind. The same object serves the test suite, the
benchmarks, the demo and the ``msgsafe cluster`` command; for the command, a cluster
started ``detached`` writes ``cluster.json`` into its dir and :func:`msgsafe.cluster.load`
finds it again from another process.

Not thread-safe: drive a cluster from one thread. Nodes are addressed by index.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Self

__all__ = ["STATE_FILE", "ClusterError", "LocalCluster", "NodeInfo", "TlsFiles"]

#: The file in a cluster's dir that lets another process find and drive it.
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """A broker could not be installed, started, found or driven; the text says what to do."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as ``msgsafe cluster status --json`` shows it."""

    name: str
    pid: int | None
    host: str
    port: int
    running: bool
    role: str | None = None  #: master/replica, live/backup: where the broker tells it


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a TLS listener: the CA clients trust, the server's certificate and
    its private key. ``require_client_cert``: the listener accepts only clients that
    present a certificate signed by ``ca`` (mutual TLS)."""

    ca: Path
    cert: Path
    key: Path
    require_client_cert: bool = False


class LocalCluster(ABC):
    """A cluster of one broker kind on 127.0.0.1 (see the module docstring)."""

    #: ``msgsafe cluster up KIND``: rabbitmq, kafka, qpid, artemis, tansu, registry...
    kind: ClassVar[str]
    #: Whether the constructor takes ``tls=True`` (``msgsafe cluster up KIND --tls``):
    #: certificates made in ``dir/tls`` (:mod:`msgsafe.cluster.tls`), TLS listeners that
    #: require a client certificate, and a ``tls`` object in :meth:`describe`.
    supports_tls: ClassVar[bool] = False
    #: Whether the constructor takes ``pooler=True`` (``msgsafe cluster up KIND
    #: --pooler``): a connection pooler in front of the cluster, a ``pooler`` object
    #: (its ``url``, ``mode``) in :meth:`describe`, stopped with the nodes.
    supports_pooler: ClassVar[bool] = False
    #: What ``msgsafe cluster up KIND`` gives the constructor besides the command's own
    #: options (RabbitMQ: the management API, which ``msgsafe doctor`` reads).
    up_options: ClassVar[Mapping[str, object]] = MappingProxyType({})

    dir: Path
    detached: bool
    #: True when :attr:`dir` is a temp dir this object made (``stop`` removes it).
    _own_dir: bool

    @classmethod
    def fetch(cls) -> None:
        """Install what this kind needs once (jars from Maven Central into the cache);
        :class:`ClusterError` with the command to run when it cannot. Kinds that come
        from system packages only check that they are installed."""
        return None

    def _take_dir(self, dir: str | os.PathLike[str] | None, prefix: str) -> None:
        """Set :attr:`dir` to ``dir``, or to a new temp dir named ``prefix...`` that this
        cluster owns."""
        self._own_dir = dir is None
        made = dir if dir is not None else tempfile.mkdtemp(prefix=prefix)
        # Absolute and canonical: the nodes run in it, and their command lines name it.
        self.dir = Path(made).resolve()

    # --- lifecycle ------------------------------------------------------------------------

    @abstractmethod
    def start(self, timeout: float | None = None) -> None:
        """Start every node and wait until the cluster serves; on failure stop what started
        and raise :class:`ClusterError` quoting the failing node's log."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after a grace period); idempotent."""

    def delete_data(self) -> None:
        """Remove the cluster's dir with its data and logs (``msgsafe cluster down
        --delete``); the cluster must be stopped. A cluster that keeps data elsewhere
        removes that too."""
        shutil.rmtree(self.dir, ignore_errors=True)

    @abstractmethod
    def kill(self, node: int) -> None:
        """SIGKILL one node (its data stays, as after a crash)."""

    @abstractmethod
    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start a killed or stopped node again on its ports and wait until it serves."""

    @abstractmethod
    def pause(self, node: int) -> None:
        """SIGSTOP one node: it holds its sockets open and answers nothing."""

    @abstractmethod
    def resume(self, node: int) -> None:
        """SIGCONT a paused node."""

    # --- what it looks like ---------------------------------------------------------------

    @property
    @abstractmethod
    def url(self) -> str:
        """A msgsafe URL listing every node (what a user passes to ``Producer``)."""

    @abstractmethod
    def node_url(self, node: int) -> str:
        """A msgsafe URL naming only ``node``."""

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node with its pid, port, whether it runs and (where known) its role."""

    def describe(self) -> dict[str, Any]:
        """The object ``msgsafe cluster up|status --json`` prints."""
        return {
            "kind": self.kind,
            "url": self.url,
            "dir": str(self.dir),
            "nodes": [asdict(node) for node in self.nodes()],
        }

    # --- found again from another process (``msgsafe cluster status|down|kill``) ----------

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """What :meth:`from_state` needs to drive this cluster from another process."""

    @classmethod
    @abstractmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """Re-attach to a cluster that :meth:`save_state` described."""

    def save_state(self) -> None:
        """Write ``cluster.json`` (kind + :meth:`state`, and the start time of each pid in
        it, so that a later command never signals a process that inherited the pid) into
        the cluster's dir."""
        # Imported here: the process helpers import this module's ClusterError.
        from msgsafe.cluster._process import births

        state = self.state()
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"kind": self.kind, **state, "births": births(_pids_in(state))}, indent=2)
        )
        tmp.replace(path)

    # --- context manager ------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _pids_in(state: Any) -> list[int]:
    """Every pid a cluster's state names (under a key that ends in ``pid`` or ``pids``)."""
    found: list[int] = []
    if isinstance(state, dict):
        for key, value in state.items():
            if str(key).endswith("pid") and isinstance(value, int):
                found.append(value)
            elif str(key).endswith("pids") and isinstance(value, list):
                found.extend(v for v in value if isinstance(v, int))
            else:
                found.extend(_pids_in(value))
    elif isinstance(state, list):
        for value in state:
            found.extend(_pids_in(value))
    return found
