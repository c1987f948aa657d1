"""A schema registry that speaks Confluent's REST API: Apicurio Registry on loopback.

What clients such as ``confluent_kafka.schema_registry.SchemaRegistryClient`` use is
:attr:`RegistryCluster.url`, Apicurio's Confluent-compatible API
(``http://127.0.0.1:P/apis/ccompat/v6``): subjects, versions, schema ids,
per-subject and global compatibility, the compatibility check itself.

The application is ``io.apicurio:apicurio-registry-app`` from Maven Central. Central
serves it only as a plain library jar (a Quarkus application before its build step), so
``poms/registry-<VERSION>.xml`` depends on it and runs the Quarkus build once into the
cache of :mod:`msgsafe.cluster.maven`; the result is a runner jar with its classpath
beside it (``target/apicurio-registry-runner-<VERSION>-runner.jar``, ``target/lib``).
The node is ``java -jar`` that jar with ``-Dquarkus.http.host=127.0.0.1
-Dquarkus.http.port=P``. Measured here (2 cores, OpenJDK 17): about 15 s from launch to
a served API, about 220 MB resident with ``-Xmx384m``; the first fetch builds in about
a minute once Maven's repository holds the jars.

Why 2.0.2.Final, an old release: it is the newest whose modules Maven Central serves
(the pom says what the later ones lack). Its Confluent API is ``/apis/ccompat/v6``.

Storage is H2 in memory (Apicurio's default, ``jdbc:h2:mem``): every schema and id is
lost when the JVM stops or is killed, and a restarted node starts empty (ids count from 1
again). That is what tests
and demos need; it also means there is one node only (in-memory registries share
nothing). Authentication is off.

Layout of ``dir``: ``registry-0/registry.out`` (the JVM's output), ``cluster.json``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from msgsafe.cluster import maven
from msgsafe.cluster._jvm import HOST, JvmCluster
from msgsafe.cluster._process import spawn, wait_for
from msgsafe.cluster.base import ClusterError

__all__ = ["API_PATH", "VERSION", "RegistryCluster", "registry_argv"]

log = logging.getLogger(__name__)

#: The Apicurio Registry release this launcher runs (``poms/registry-<VERSION>.xml``).
VERSION = "2.0.2.Final"
#: Where Apicurio serves the Confluent Schema Registry API (v6 of its compatibility layer).
API_PATH = "/apis/ccompat/v6"
#: The runnable jar of the Quarkus build (its classpath is ``target/lib``).
_RUN_JAR = Path("target") / f"apicurio-registry-runner-{VERSION}-runner.jar"
#: The Maven goals that fetch the application and run the Quarkus build.
_BUILD = ["package"]
#: The first build resolves several hundred artifacts: longer than a broker's jars.
_BUILD_TIMEOUT = 1800.0


def registry_argv(java: str, run_jar: Path, *, port: int, heap_mb: int, marker: Path) -> list[str]:
    """The command line of one registry JVM: loopback only on ``port``, a ``heap_mb``
    heap, Apicurio's in-memory storage, no authentication. ``marker`` (the node's dir)
    is named on it so that a recorded pid can be told from a reused one."""
    return [
        java,
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 64)}m",
        # Two cores shared with the brokers: one GC thread, no concurrent GC work.
        "-XX:+UseSerialGC",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dmsgsafe.node.dir={marker}",
        f"-Dquarkus.http.host={HOST}",
        f"-Dquarkus.http.port={port}",
        "-Dregistry.auth.enabled=false",
        "-jar",
        str(run_jar),
    ]


class RegistryCluster(JvmCluster):
    """One Apicurio Registry JVM on 127.0.0.1 serving Confluent's REST API; see the
    module doc.

    ``nodes`` must be 1 (in-memory storage shares nothing between nodes). ``dir`` None:
    a temp dir, removed by :meth:`stop`. ``base_port`` None: a free port. ``detached``:
    the JVM outlives this process (``msgsafe cluster up``) and ``cluster.json`` is kept
    current. ``heap_mb`` is its ``-Xmx``.

    :meth:`start` and :meth:`restart` return once ``GET {url}/subjects`` answers 200.
    """

    kind: ClassVar[str] = "registry"

    def __init__(
        self,
        nodes: int = 1,
        dir: str | Path | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        heap_mb: int = 384,
    ) -> None:
        if nodes != 1:
            raise ClusterError(
                "a schema registry with in-memory storage runs one node (nodes share nothing)"
            )
        self._setup(
            nodes,
            dir,
            base_port,
            detached,
            heap_mb=heap_mb,
            version=VERSION,
            what="schema registry",
            port_lists=1,
        )

    # --- the application ------------------------------------------------------------------

    @classmethod
    def fetch(cls) -> None:
        """Fetch Apicurio Registry and build its runnable jar into the cache (once: a few
        minutes and about 80 MB of jars the first time); a damaged build is made again."""
        for _ in range(2):
            home = maven.resolve(f"registry-{VERSION}", _BUILD, timeout=_BUILD_TIMEOUT)
            if _damaged(home) is None:
                return
            log.warning("damaged registry build in %s: building again", home)
            (home / ".complete").unlink()
        raise ClusterError(
            f"the registry build in {home} is damaged again ({_damaged(home)}): delete "
            "~/.m2/repository/io/apicurio and run `msgsafe cluster fetch registry`"
        )

    def _lib(self) -> Path:
        home = maven.resolve(f"registry-{self.version}", _BUILD, timeout=_BUILD_TIMEOUT)
        damaged = _damaged(home)
        if damaged is not None:
            raise ClusterError(
                f"the registry build in {home} is damaged ({damaged}): "
                "run `msgsafe cluster fetch registry` to build it again"
            )
        return home / _RUN_JAR

    # --- hooks of JvmCluster ----------------------------------------------------------------

    def _node_dir(self, node: int) -> Path:
        return self.dir / self._name(node)

    def _marker(self, node: int) -> Path:
        return self._node_dir(node)

    def _log(self, node: int) -> Path:
        return self._node_dir(node) / "registry.out"

    def _node_ports(self, node: int) -> list[int]:
        return [self.ports[node]]

    def _prepare(self, lib: Path) -> None:
        self._node_dir(0).mkdir(parents=True, exist_ok=True)

    def _spawn(self, node: int, lib: Path) -> None:
        argv = registry_argv(
            maven.java(),
            lib,
            port=self.ports[node],
            heap_mb=self.heap_mb,
            marker=self._marker(node),
        )
        self.pids[node] = spawn(
            argv, log=self._log(node), cwd=self._node_dir(node), detached=self.detached
        )
        log.info("registry: started (pid %d), waiting for its API", self.pids[node])

    def _wait_serving(self, deadline: float) -> None:
        self._wait_back(0, deadline)

    def _wait_back(self, node: int, deadline: float) -> None:
        def serving() -> bool:
            self._check_alive([node])
            return self.serving()

        wait_for(
            serving,
            max(0.0, deadline - time.monotonic()),
            f"the schema registry to answer on {self.url}",
            interval=0.2,
            on_timeout=lambda: self._tails([node]),
        )

    def _roles(self) -> list[str | None]:
        return [None]

    # --- what it looks like ---------------------------------------------------------------

    def serving(self) -> bool:
        """True when ``GET {url}/subjects`` answers 200 with a JSON list now."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2.0) as response:
                return response.status == 200 and isinstance(json.load(response), list)
        except (OSError, ValueError, urllib.error.URLError):
            return False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:P/apis/ccompat/v6``: the ``url`` of a Confluent schema
        registry client."""
        return f"http://{HOST}:{self.ports[0]}{API_PATH}"

    def node_url(self, node: int) -> str:
        """The same as :attr:`url` (there is one node)."""
        self._check_index(node)
        return self.url

    def describe(self) -> dict[str, Any]:
        """:meth:`LocalCluster.describe` plus ``storage`` (``memory``: lost on restart)."""
        return {**super().describe(), "storage": "memory"}

    # --- state ----------------------------------------------------------------------------

    def _own_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def _options(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _restore(self, state: dict[str, Any]) -> None:
        return None


def _damaged(home: Path) -> str | None:
    """What is missing or unreadable in the Quarkus build in ``home``, or None."""
    run_jar = home / _RUN_JAR
    if not run_jar.is_file():
        return str(_RUN_JAR)
    return maven.damaged_jar(run_jar.parent, [run_jar.name]) or maven.damaged_jar(
        run_jar.parent / "lib"
    )
