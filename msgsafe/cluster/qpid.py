"""Apache Qpid Broker-J: a BDB HA group of N nodes (3 by default) on loopback.

The jars (the ``qpid-broker`` 9.2.0 module jars with the AMQP 1.0 plugin, HTTP management
and the BDB HA store, plus Berkeley DB JE 18.3.12) come from Maven Central once, through
``msgsafe/cluster/poms/qpid-<version>.xml``, into the cache of :mod:`msgsafe.cluster.maven`.
Each node is ``java -cp 'lib/*' org.apache.qpid.server.Main`` with its own work dir, an
initial configuration (``--initial-config-path``) and ``-prop``\\ s for its ports and dir.

The group (named ``group``, "msgsafe" by default) behaves as Broker-J's documentation
says: one MASTER serves messaging, the others are REPLICAs; a transaction commits on the
master (synchronous write) once a majority of the group has it (default quorum: 2 of 3);
after the master is lost the remaining majority elects the replica with the most recent
transaction. Node 0 is the helper that creates the group; the others join through its
``helperAddress``; every node's replication address is in ``permittedNodes``. Queues are
durable and created on first use: a virtual host node auto-creation policy (pattern
``.*``, created on publish and on consume) makes the first ``send()`` to a new address
create a durable queue of that name.

What a client sees (measured with python-qpid-proton 0.40 against this group):

- the master opens the connection; its open frame carries no ``failover-server-list``
  (the properties are product, version, ``qpid.build``, ``qpid.instance_name``,
  ``qpid.virtualhost_properties_supported``);
- a replica accepts TCP and SASL, sends ``open`` and at once ``close`` with
  ``amqp:connection:forced`` "Virtual host '<hostname>' is not active" (no info map, no
  redirect): the client must try the next host itself. Broker-J 9.2 cannot be set to do
  otherwise: a BDB HA replica's virtual host answers ``getRedirectHost`` with null, and
  the only redirect it sends (``amqp:connection:redirect`` with ``network-host`` and
  ``port``) comes from a "Redirector" virtual host node, whose target is a fixed address
  per port that no election updates. A URL must therefore name every node;
- a node of a group without quorum (2 of 3 down) sends ``open`` then ``close`` with
  ``amqp:not-found`` "Unknown hostname in connection open";
- a SIGSTOPped node accepts TCP (the kernel does) and never answers.

Auth: SASL PLAIN with ``user``/``password`` (default msgsafe/msgsafe) in a Plain
provider whose ``secureOnlyMechanisms`` is empty, so PLAIN works without TLS on loopback;
the same credentials open the REST API (HTTP Basic, enabled on plain HTTP) that
:meth:`QpidCluster.nodes` reads roles from: the query API,
``GET /api/latest/querybroker/virtualhostnode?select=name,role`` (a plain GET of the node
evaluates derived attributes that halt a replica's JVM, see :meth:`QpidCluster._query`).

Layout of ``dir``: ``qpid-I/initial-config.json``, ``qpid-I/config.json`` (the broker's
own configuration store, made from the initial configuration on the first start),
``qpid-I/ha/`` (the BDB HA environment), ``qpid-I/qpid.log`` (the broker's log: HA-10xx
role changes), ``qpid-I/broker.out`` (the JVM's output), ``cluster.json``. With
``base_port=P``, node ``I`` listens for AMQP on ``P+I``, HTTP on ``P+N+I`` and BDB
replication on ``P+2N+I``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from msgsafe.cluster import maven
from msgsafe.cluster._jvm import HOST, JvmCluster
from msgsafe.cluster._process import spawn, tail, wait_for
from msgsafe.cluster.base import ClusterError

__all__ = ["MASTER", "REPLICA", "VERSION", "QpidCluster"]

log = logging.getLogger(__name__)

#: The Broker-J release this launcher runs (``poms/qpid-<VERSION>.xml`` pins it).
VERSION = "9.2.0"
_MAIN = "org.apache.qpid.server.Main"
_REQUIRED_JARS = (f"qpid-broker-core-{VERSION}.jar", f"qpid-bdbstore-{VERSION}.jar")
#: Roles as :meth:`QpidCluster.nodes` reports them (Broker-J's NodeRole, lower case).
MASTER = "master"
REPLICA = "replica"
_HOST = HOST


class QpidCluster(JvmCluster):
    """A Broker-J BDB HA group of ``nodes`` JVMs on 127.0.0.1; see the module doc.

    ``dir`` None: a temp dir, removed by :meth:`stop`. ``base_port`` None: free ports.
    ``detached``: nodes outlive this process (``msgsafe cluster up``) and ``cluster.json``
    is kept current; otherwise they die with it. ``heap_mb`` is each JVM's ``-Xmx``.
    ``context`` adds entries to every virtual host node's context, e.g. Berkeley DB JE
    replication settings such as ``{"je.rep.replicaAckTimeout": "5 s"}``; the defaults
    are Broker-J's (quorum = majority, master SYNC, replicas NO_SYNC).

    :meth:`start` returns once one node is MASTER with its virtual host active and every
    other one an attached REPLICA; :meth:`restart` once the node is MASTER or REPLICA
    again (with fewer than a quorum of nodes running it stays WAITING and this times out).
    """

    kind: ClassVar[str] = "qpid"

    def __init__(
        self,
        nodes: int = 3,
        dir: str | Path | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        group: str = "msgsafe",
        user: str = "msgsafe",
        password: str = "msgsafe",
        heap_mb: int = 256,
        context: Mapping[str, str] | None = None,
    ) -> None:
        # ports: AMQP; then HTTP (management, roles) and BDB HA replication.
        _, self.http_ports, self.ha_ports = self._setup(
            nodes,
            dir,
            base_port,
            detached,
            heap_mb=heap_mb,
            version=VERSION,
            what="Broker-J HA group",
            port_lists=3,
        )
        self.group = group
        self.user = user
        self.password = password
        self.context = dict(context or {})

    # --- jars -----------------------------------------------------------------------------

    @classmethod
    def fetch(cls) -> None:
        """Resolve the Broker-J and JE jars into the cache (once); a damaged cache is
        fetched again."""
        maven.fetch_lib(
            f"qpid-{VERSION}", _REQUIRED_JARS, what="Broker-J", kind="qpid", m2="org/apache/qpid"
        )

    def _lib(self) -> Path:
        return maven.checked_lib(
            f"qpid-{self.version}", _REQUIRED_JARS, what="Broker-J", kind="qpid"
        )

    # --- configuration --------------------------------------------------------------------

    def name(self, node: int) -> str:
        """The virtual host node's (and the BDB replication node's) name: ``qpid-I``."""
        return f"qpid-{node}"

    def _node_dir(self, node: int) -> Path:
        return self.dir / self.name(node)

    def _log(self, node: int) -> Path:
        return self._node_dir(node) / "broker.out"

    def _ha_address(self, node: int) -> str:
        return f"{_HOST}:{self.ha_ports[node]}"

    def _initial_config(self, node: int) -> dict[str, Any]:
        """The broker's initial configuration; ``${...}`` come from ``-prop``."""
        auto_create = {
            "pattern": ".*",
            "nodeType": "Queue",
            "attributes": {"durable": True},
            "createdOnPublish": True,
            "createdOnConsume": True,
        }
        blueprint = {"type": "BDB_HA", "nodeAutoCreationPolicies": [auto_create]}
        vhn: dict[str, Any] = {
            "name": self.name(node),
            "type": "BDB_HA",
            "groupName": self.group,
            "address": self._ha_address(node),
            "helperAddress": self._ha_address(0),
            "permittedNodes": [self._ha_address(i) for i in range(self.count)],
            "storePath": "${qpid.work_dir}/ha",
            "defaultVirtualHostNode": True,
            # The virtual host each node creates when it becomes master for the first
            # time (replicated to the others from then on).
            "context": {"virtualhostBlueprint": json.dumps(blueprint), **self.context},
        }
        if node > 0:
            vhn["helperNodeName"] = self.name(0)
        level = [
            {"name": name, "type": "NameAndLevel", "level": lvl, "loggerName": logger}
            for name, lvl, logger in (
                ("Root", "WARN", "ROOT"),
                ("Qpid", "INFO", "org.apache.qpid.*"),
                ("Ops", "INFO", "qpid.message.*"),  # HA-10xx role changes live here
            )
        ]
        basic_auth = {"httpBasicAuthenticationEnabled": True}  # on plain HTTP, loopback only
        return {
            "name": self.name(node),
            "modelVersion": "9.0",
            "authenticationproviders": [
                {
                    "name": "plain",
                    "type": "Plain",
                    # Loopback test brokers: PLAIN without TLS (proton offers no SCRAM).
                    "secureOnlyMechanisms": [],
                    "users": [{"name": self.user, "type": "managed", "password": self.password}],
                }
            ],
            "brokerloggers": [
                {
                    "name": "logfile",
                    "type": "File",
                    "fileName": "${qpid.work_dir}/qpid.log",
                    "brokerloginclusionrules": level,
                }
            ],
            "ports": [
                {
                    "name": "AMQP",
                    "port": "${qpid.amqp_port}",
                    "bindingAddress": _HOST,
                    "authenticationProvider": "plain",
                    # Any open hostname (proton sends the host it dialled) means this
                    # node's virtual host.
                    "virtualhostaliases": [
                        {"name": a, "type": a}
                        for a in ("nameAlias", "defaultAlias", "hostnameAlias")
                    ],
                },
                {
                    "name": "HTTP",
                    "port": "${qpid.http_port}",
                    "bindingAddress": _HOST,
                    "authenticationProvider": "plain",
                    "protocols": ["HTTP"],
                },
            ],
            "virtualhostnodes": [vhn],
            "plugins": [{"type": "MANAGEMENT-HTTP", "name": "http", **basic_auth}],
        }

    def _argv(self, node: int, lib: Path) -> list[str]:
        node_dir = self._node_dir(node)
        return [
            maven.java(),
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 64)}m",
            f"-XX:MaxDirectMemorySize={self.heap_mb}m",
            # Three JVMs share two cores: one GC thread each, no concurrent GC work.
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-DQPID_WORK={node_dir}",
            *("-cp", f"{lib}/*", _MAIN),
            *("--initial-config-path", str(node_dir / "initial-config.json")),
            *("--store-path", str(node_dir / "config.json")),
            *("-prop", f"qpid.work_dir={node_dir}"),
            *("-prop", f"qpid.amqp_port={self.ports[node]}"),
            *("-prop", f"qpid.http_port={self.http_ports[node]}"),
        ]

    # --- lifecycle ------------------------------------------------------------------------

    def _prepare(self, lib: Path) -> None:
        for node in range(self.count):
            node_dir = self._node_dir(node)
            node_dir.mkdir(parents=True, exist_ok=True)
            # Read by the broker only while config.json does not exist yet.
            (node_dir / "initial-config.json").write_text(
                json.dumps(self._initial_config(node), indent=2)
            )

    def _wait_serving(self, deadline: float) -> None:
        # Serving: one node is MASTER with its virtual host active, every other one an
        # attached REPLICA.
        self.wait_group(max(0.0, deadline - time.monotonic()))

    def _spawn_all(self, lib: Path, deadline: float) -> None:
        # A new group is made by node 0 alone: it must be MASTER with its virtual host
        # active before anyone joins. Otherwise a node that registers while the helper's
        # first configuration commit runs raises the quorum to 2; that commit fails with
        # InsufficientReplicasException, the helper restarts its environment and the group
        # (two members, one of them not yet replicating) never elects again: every node
        # stays WAITING. A group that exists already restarts all at once.
        if (self._node_dir(0) / "ha").exists():
            super()._spawn_all(lib, deadline)
            return
        self._spawn(0, lib)
        self._wait_roles([0], (MASTER,), deadline)
        wait_for(
            lambda: self._virtualhost_active(0),
            max(0.0, deadline - time.monotonic()),
            "qpid node 0's virtual host to be active",
            interval=0.2,
            on_timeout=lambda: self._tails([0]),
        )
        for node in range(1, self.count):
            self._spawn(node, lib)

    def _spawn(self, node: int, lib: Path) -> None:
        env = {**os.environ, "QPID_WORK": str(self._node_dir(node))}
        self.pids[node] = spawn(
            self._argv(node, lib),
            log=self._log(node),
            cwd=self._node_dir(node),
            env=env,
            detached=self.detached,
        )
        log.info("qpid: node %d started (pid %d)", node, self.pids[node])

    # --- hooks of JvmCluster ----------------------------------------------------------------

    def _name(self, node: int) -> str:
        return self.name(node)

    def _marker(self, node: int) -> Path:
        return self._node_dir(node) / "config.json"

    def _node_ports(self, node: int) -> list[int]:
        return [self.ports[node], self.http_ports[node], self.ha_ports[node]]

    def _wait_back(self, node: int, deadline: float) -> None:
        # MASTER or REPLICA again: it rejoined the group. With fewer than a quorum of
        # nodes running it stays WAITING and this times out.
        self._wait_roles([node], (MASTER, REPLICA), deadline)

    def _roles(self) -> list[str | None]:
        return self.roles()

    def _tails(self, nodes: Sequence[int]) -> str:
        logs = [(self._log(n), 10) for n in nodes] + [
            (self._node_dir(n) / "qpid.log", 15) for n in nodes
        ]
        return "\n".join(text for path, lines in logs if (text := tail(path, lines)))

    # --- the REST API ---------------------------------------------------------------------

    def _query(self, node: int, category: str, name: str, attribute: str) -> str | None:
        """``attribute`` of the ``category`` object called ``name`` on ``node``, through
        the query API (``/api/latest/querybroker``); None when it does not answer.

        Why not ``GET virtualhostnode/<name>``: that evaluates every derived attribute,
        and ``lastKnownReplicationTransactionId`` throws while the node's BDB
        environment restarts (a resumed old master rejoining); the exception escapes a
        Jetty thread and Broker-J's default handler halts the JVM. The query API
        evaluates only the attributes it selects."""
        query = urllib.parse.urlencode({"select": f"name,{attribute}"})
        url = f"http://{_HOST}:{self.http_ports[node]}/api/latest/querybroker/{category}?{query}"
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(request, timeout=1.0) as response:
                found = json.load(response)
        except (OSError, ValueError, urllib.error.URLError):
            return None
        rows = found.get("results") if isinstance(found, dict) else None
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, list) and len(row) == 2 and row[0] == name:
                return row[1] if isinstance(row[1], str) else None
        return None

    def role(self, node: int) -> str | None:
        """``node``'s own view of its role, lower case: master, replica, waiting,
        detached, unreachable...; None when it does not run, is paused or does not
        answer. A master that was paused and resumed says ``master`` for some seconds
        after the others elected a new one; it commits nothing then (no quorum)."""
        self._check_index(node)
        if not self._running(node) or self._paused(node):
            return None
        role = self._query(node, "virtualhostnode", self.name(node), "role")
        return None if role is None else role.lower()

    def roles(self) -> list[str | None]:
        """:meth:`role` of every node."""
        return [self.role(node) for node in range(self.count)]

    def _virtualhost_active(self, node: int) -> bool:
        return self._query(node, "virtualhost", self.group, "state") == "ACTIVE"

    def master(self) -> int | None:
        """The one running node that is master with an active virtual host; None while
        there is none (an election) or more than one claims it."""
        masters = [n for n, role in enumerate(self.roles()) if role == MASTER]
        if len(masters) != 1 or not self._virtualhost_active(masters[0]):
            return None
        return masters[0]

    def wait_master(self, timeout: float = 60.0, *, exclude: Sequence[int] = ()) -> int:
        """Wait until a node not in ``exclude`` is :meth:`master`; return it."""
        found: list[int] = []

        def elected() -> bool:
            node = self.master()
            if node is None or node in exclude:
                return False
            found.append(node)
            return True

        wait_for(
            elected,
            timeout,
            "a qpid master" + (f" other than {list(exclude)}" if exclude else ""),
            interval=0.1,
            on_timeout=lambda: f"roles: {self.roles()}",
        )
        return found[-1]

    def transfer_master(self, node: int, timeout: float = 60.0) -> None:
        """Make ``node`` the group's master on purpose, as an operator does (Broker-J's
        BDB HA "transfer mastership"): its virtual host node's ``role`` set to MASTER
        through the REST API, then wait until it is :meth:`master`. Nothing when it is
        already. :class:`ClusterError` when the node refuses or does not become master
        within ``timeout``."""
        if self.master() == node:
            return
        url = f"http://{_HOST}:{self.http_ports[node]}/api/latest/virtualhostnode/{self.name(node)}"
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            url,
            data=json.dumps({"role": MASTER.upper()}).encode(),
            method="POST",
            headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10.0):
                pass
        except (OSError, urllib.error.URLError) as exc:
            raise ClusterError(f"qpid node {node} refused mastership: {exc}") from exc
        self.wait_master(timeout, exclude=[n for n in range(self.count) if n != node])

    def wait_group(self, timeout: float = 120.0) -> int:
        """Wait until every running node is attached: one master with an active virtual
        host, every other running node a replica. Returns the master."""
        deadline = time.monotonic() + timeout
        running = [n for n in range(self.count) if self._running(n)]
        self._wait_roles(running, (MASTER, REPLICA), deadline)
        return self.wait_master(max(0.0, deadline - time.monotonic()))

    def _wait_roles(self, nodes: Sequence[int], roles: Sequence[str], deadline: float) -> None:
        def attached() -> bool:
            self._check_alive(nodes)
            return all(self.role(n) in roles for n in nodes)

        wait_for(
            attached,
            max(0.0, deadline - time.monotonic()),
            f"qpid nodes {list(nodes)} to be {' or '.join(roles)}",
            interval=0.2,
            on_timeout=lambda: f"roles: {self.roles()}\n{self._tails(nodes)}",
        )

    # --- what it looks like ---------------------------------------------------------------

    def _credentials(self) -> str:
        return f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@"

    @property
    def url(self) -> str:
        """``amqp10://user:pass@127.0.0.1:P0,127.0.0.1:P1,...`` (every node)."""
        hosts = ",".join(f"{_HOST}:{port}" for port in self.ports)
        return f"amqp10://{self._credentials()}{hosts}"

    def node_url(self, node: int) -> str:
        """``amqp10://user:pass@127.0.0.1:P`` of ``node`` only."""
        self._check_index(node)
        return f"amqp10://{self._credentials()}{_HOST}:{self.ports[node]}"

    # --- state ----------------------------------------------------------------------------

    def _own_state(self) -> dict[str, Any]:
        return {
            "http_ports": self.http_ports,
            "ha_ports": self.ha_ports,
            "group": self.group,
            "user": self.user,
            "password": self.password,
            "context": self.context,
        }

    @classmethod
    def _options(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "group": str(state["group"]),
            "user": str(state["user"]),
            "password": str(state["password"]),
            "context": state.get("context") or {},
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.http_ports = [int(p) for p in state["http_ports"]]
        self.ha_ports = [int(p) for p in state["ha_ports"]]
        if len(self.http_ports) != self.count or len(self.ha_ports) != self.count:
            raise ValueError("port lists do not match the node count")
