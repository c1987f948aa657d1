"""A Qpid Broker-J BDB HA group with one node per network namespace, so that a real
partition (:meth:`tests.support.netns.NetLab.cut`) separates a node from the others.

Nodes replicate to each other on their lab addresses. Clients and the REST API reach node
``i`` only through two fault proxies on ``127.0.0.1`` here (``ports[i]`` for AMQP,
``http_ports[i]`` for HTTP), whose upstream connections are opened in the lab's client
namespace: a client keeps reaching a node that is cut off from its group, as clients of a
partitioned broker do, and :meth:`~msgsafe.cluster.qpid.QpidCluster.role` keeps reading
every node's own view of its role.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from msgsafe.cluster._process import spawn
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.qpid import QpidCluster
from msgsafe.testing.faultproxy import FaultProxy
from tests.support.netns import socket_in_netns

__all__ = ["NetQpid"]


class NetQpid(QpidCluster):
    """A Broker-J group of ``lab.n`` nodes, node ``i`` inside host ``i``'s namespace of
    ``lab`` (:class:`tests.support.netns.NetLab`); see the module doc. ``context`` is the
    virtual host nodes' context (e.g. shorter Berkeley DB JE replication timeouts).
    Nodes are not restarted: heal the lab's links instead."""

    #: Ports every node uses on its own lab address (one namespace each, so no clash).
    AMQP_PORT, HTTP_PORT, HA_PORT = 5672, 8080, 5000

    def __init__(self, lab: Any, dir: Path, *, context: dict[str, str] | None = None) -> None:
        super().__init__(lab.n, dir, context=context)
        self.lab = lab
        self.lab_proxies: dict[int, list[FaultProxy]] = {}

    def _ha_address(self, node: int) -> str:
        return f"{self.lab.addr(node)}:{self.HA_PORT}"

    def _initial_config(self, node: int) -> dict[str, Any]:
        config = super()._initial_config(node)
        for port in config["ports"]:
            port["bindingAddress"] = self.lab.addr(node)
            port["port"] = self.AMQP_PORT if port["name"] == "AMQP" else self.HTTP_PORT
            if port["name"] == "AMQP":
                # NOTE: the client opens with the host it dialled (127.0.0.1, its proxy),
                # which is not an address of the node's namespace, so hostnameAlias does
                # not match it: any open hostname means this node's virtual host.
                port["virtualhostaliases"].append(
                    {
                        "name": "any",
                        "type": "patternMatchingAlias",
                        "pattern": ".*",
                        "virtualHostNode": self.name(node),
                    }
                )
        return config

    def _spawn(self, node: int, lib: Path) -> None:
        if node not in self.lab_proxies:
            upstream = functools.partial(socket_in_netns, self.lab.client_netns)
            self.lab_proxies[node] = [
                FaultProxy(
                    self.lab.addr(node),
                    inner,
                    listen_port=outer,
                    upstream_socket=upstream,
                    connect_timeout=2.0,
                )
                for inner, outer in (
                    (self.AMQP_PORT, self.ports[node]),
                    (self.HTTP_PORT, self.http_ports[node]),
                )
            ]
        node_dir = self._node_dir(node)
        argv = ["ip", "netns", "exec", self.lab.netns(node), *self._argv(node, lib)]
        env = {**os.environ, "QPID_WORK": str(node_dir)}
        self.pids[node] = spawn(argv, log=self._log(node), cwd=node_dir, env=env)

    def restart(self, node: int, timeout: float | None = None) -> None:
        raise ClusterError("NetQpid nodes are not restarted: heal the lab's links instead")

    def stop(self, grace: float = 30.0) -> None:
        try:
            super().stop(grace)
        finally:
            for proxies in self.lab_proxies.values():
                for proxy in proxies:
                    proxy.close()
            self.lab_proxies = {}
