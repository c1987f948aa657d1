"""A Kafka cluster whose clients can be put behind a fault proxy per node.

A Kafka client learns every node's address from metadata after bootstrapping, so a
proxy in front of the bootstrap address alone is bypassed. :class:`ProxiedKafka` is a
:class:`~msgsafe.cluster.kafka.KafkaCluster` whose nodes also have a ``PROXIED``
listener: it binds ``proxied_ports[i]`` and advertises ``proxy_ports[i]``, where the
nemesis puts a :class:`~msgsafe.testing.faultproxy.FaultProxy`. A client that
bootstraps through the proxies learns only proxy addresses (a node answers metadata
with the addresses of the listener the request came in on), so every byte between it
and any node passes a proxy; replication between the nodes uses ``PLAINTEXT`` and does
not: a proxy fault is a client-side network fault, not a partition of the cluster.
The test suite's Kafka (``tests/support/kafka_lab.py``) is one too.
"""

from __future__ import annotations

from pathlib import Path

from msgsafe.cluster._process import free_ports
from msgsafe.cluster.kafka import KafkaCluster

__all__ = ["ProxiedKafka"]


class ProxiedKafka(KafkaCluster):
    """A :class:`KafkaCluster` with a proxied client listener per node (module doc)."""

    def __init__(
        self, nodes: int = 3, dir: str | Path | None = None, *, heap_mb: int = 384
    ) -> None:
        super().__init__(nodes, dir, heap_mb=heap_mb)
        picked = free_ports(2 * nodes)
        #: What each node's PROXIED listener binds (the proxies' upstream).
        self.proxied_ports = picked[:nodes]
        #: What each node advertises on it (where the proxies listen).
        self.proxy_ports = picked[nodes:]

    def _properties(self, node: int) -> dict[str, str]:
        props = super()._properties(node)
        props["listeners"] += f",PROXIED://127.0.0.1:{self.proxied_ports[node]}"
        props["advertised.listeners"] += f",PROXIED://127.0.0.1:{self.proxy_ports[node]}"
        props["listener.security.protocol.map"] += ",PROXIED:PLAINTEXT"
        return props
