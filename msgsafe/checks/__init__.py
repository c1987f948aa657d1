"""What the broker will do with a confirmed message: one set of checks for
``msgsafe doctor`` and for the producer.

Each protocol's check lives beside the rest of its adapter,
``msgsafe/adapters/NAME/check.py``, and reads the broker's own settings (RabbitMQ: the
queue's durability, exclusivity, auto-delete and type over AMQP 0-9-1, the cluster
through the management API; Kafka: replication factor, ``min.insync.replicas``, unclean
leader election and the broker defaults an auto-created topic gets; AMQP 1.0: what the
open frame says, and on RabbitMQ the queue behind the address) and reports
:class:`~msgsafe.checks.findings.Finding`\\ s. Each has the same two entry points:
``inspector(url, options)``, the producer's check of one destination, and
``doctor_findings(url, destinations, management)``, what ``msgsafe doctor`` prints.
:func:`inspector_for` and :func:`doctor_findings` find the module by the URL's protocol:
nothing above names a protocol to choose its check. The producer asks
:func:`inspector_for` for one destination's :class:`DestinationReport` before its first
send there (see :class:`msgsafe.checks.gate.DestinationGate`).

A check that could not reach the broker raises a
:class:`~msgsafe.errors.TransientError`; one the broker answered without telling says
:attr:`~msgsafe.message.Guarantee.UNKNOWN`, never "safe".
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType

from msgsafe.checks.findings import DestinationReport, Finding, Inspector
from msgsafe.endpoints import PROTOCOLS, BrokerUrl
from msgsafe.errors import ConfigurationError

__all__ = ["DestinationReport", "Inspector", "doctor_findings", "inspector_for"]


def _module(protocol: str) -> ModuleType:
    """The check module of ``protocol`` (``msgsafe.adapters.PROTOCOL.check``)."""
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"no destination check for protocol {protocol!r}")
    return importlib.import_module(f"msgsafe.adapters.{protocol}.check")


def inspector_for(url: BrokerUrl, options: Mapping[str, object]) -> Inspector:
    """The check of ``url``'s protocol, connecting with the client options the
    transport gets (credentials, TLS, ``connect_timeout``, ``declare=``), so that a
    check reaches the broker exactly when the transport does."""
    inspector: Inspector = _module(url.protocol).inspector(url, options)
    return inspector


def doctor_findings(
    url: BrokerUrl, destinations: Sequence[str], management: str | None
) -> list[Finding]:
    """What ``msgsafe doctor`` reports of the broker at ``url`` and ``destinations``
    (every one the broker lists when empty, where it can list them): the check of
    ``url``'s protocol. ``management``: RabbitMQ's management API, when given."""
    findings: list[Finding] = _module(url.protocol).doctor_findings(url, destinations, management)
    return findings
