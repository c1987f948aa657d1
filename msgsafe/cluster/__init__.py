"""Real brokers on loopback, for users and for this project's own tests: RabbitMQ,
Apache Kafka (KRaft), Qpid Broker-J (BDB HA group), ActiveMQ Artemis (live/backup),
tansu (a zero-Java Kafka-protocol broker for the demo), PostgreSQL (a primary with
synchronous standbys, for the shared outbox, optionally behind PgBouncer), a Spark
standalone cluster (master and workers from the installed PySpark, for the Spark sink's
executor-loss tests), and a schema registry speaking Confluent's REST API (Apicurio
Registry, in-memory storage).

One table maps a kind to its launcher; each launcher is a :class:`LocalCluster`
(``msgsafe/cluster/base.py`` states the shape). The ``msgsafe cluster`` command is a thin
front over :func:`create` and :func:`load`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from msgsafe.cluster._process import adopt_births
from msgsafe.cluster.base import STATE_FILE, ClusterError, LocalCluster, NodeInfo

__all__ = ["KINDS", "ClusterError", "LocalCluster", "NodeInfo", "create", "launcher", "load"]

#: kind -> "module:Class" of its launcher, imported on first use.
KINDS: dict[str, str] = {
    "artemis": "msgsafe.cluster.artemis:ArtemisCluster",
    "kafka": "msgsafe.cluster.kafka:KafkaCluster",
    "postgres": "msgsafe.cluster.postgres:PostgresCluster",
    "qpid": "msgsafe.cluster.qpid:QpidCluster",
    "rabbitmq": "msgsafe.cluster.rabbitmq:RabbitCluster",
    "registry": "msgsafe.cluster.registry:RegistryCluster",
    "spark": "msgsafe.cluster.spark:SparkCluster",
    "tansu": "msgsafe.cluster.tansu:TansuCluster",
}


def _launcher(kind: str) -> type[LocalCluster]:
    try:
        target = KINDS[kind]
    except KeyError:
        known = ", ".join(sorted(KINDS)) or "none"
        raise ClusterError(f"unknown cluster kind {kind!r} (known: {known})") from None
    module, _, name = target.partition(":")
    cls: type[LocalCluster] = getattr(importlib.import_module(module), name)
    return cls


def launcher(kind: str) -> type[LocalCluster]:
    """The launcher class of ``kind`` (:class:`ClusterError` for an unknown kind)."""
    return _launcher(kind)


def create(kind: str, **options: Any) -> LocalCluster:
    """A new, not yet started cluster of ``kind`` (options go to its launcher)."""
    return _launcher(kind)(**options)


def load(dir: str | Path) -> LocalCluster:
    """The cluster that ``msgsafe cluster up`` started in ``dir``."""
    path = Path(dir) / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {dir} ({STATE_FILE} is missing)") from None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from exc
    kind = state.pop("kind", None)
    if not isinstance(kind, str):
        raise ClusterError(f"{path} names no cluster kind")
    saved = state.pop("births", None)
    if isinstance(saved, dict):
        adopt_births(saved)
    return _launcher(kind).from_state(Path(dir), state)
