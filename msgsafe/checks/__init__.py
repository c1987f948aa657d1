"""What the broker will do with a confirmed message: one set of checks for
``msgsafe doctor`` and for the producer.

Each protocol's module reads the broker's own settings (RabbitMQ: the queue's
durability, exclusivity, auto-delete and type over AMQP 0-9-1, the cluster through the
management API; Kafka: replication factor, ``min.insync.replicas``, unclean leader
election and the broker defaults an auto-created topic gets; AMQP 1.0: what the open
frame says, and on RabbitMQ the queue behind the address) and reports
:class:`~msgsafe.checks.findings.Finding`\\ s. ``doctor`` prints them; the producer
asks :func:`inspector_for` for one destination's :class:`DestinationReport` before its
first send there (see :class:`msgsafe.checks.gate.DestinationGate`).

Every protocol of :data:`msgsafe.endpoints.PROTOCOLS` has its module here, named as the
protocol, with the same two entry points: ``inspector(url, options)`` (the producer's
check of one destination) and ``doctor_findings(url, destinations, management)`` (what
``msgsafe doctor`` prints). :func:`inspector_for` and :func:`doctor_findings` find the
module by the URL's protocol: nothing above names a protocol to choose its check.

A check that could not reach the broker raises a
:class:`~msgsafe.errors.TransientError`; one the broker answered without telling says
:attr:`~msgsafe.message.Guarantee.UNKNOWN`, never "safe".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from msgsafe.checks.findings import Finding, Severity
from msgsafe.endpoints import PROTOCOLS, BrokerUrl
from msgsafe.errors import ConfigurationError
from msgsafe.message import Guarantee

__all__ = ["DestinationReport", "Inspector", "doctor_findings", "inspector_for"]


@dataclass(frozen=True, slots=True)
class DestinationReport:
    """One destination, checked: its guarantee, and the findings that decided it (the
    settings below :attr:`Guarantee.REPLICATED`, each with why and the fix)."""

    destination: str
    guarantee: Guarantee
    findings: tuple[Finding, ...] = ()
    #: Seconds this answer may be kept; shorter for a state that changes on its own
    #: (a queue that does not exist yet).
    keep_s: float | None = None

    @property
    def reasons(self) -> str:
        """The findings below OK, as one line each: setting = value: why."""
        lines = [
            f"{f.setting} = {f.value}: {f.why}" if f.why else f"{f.setting} = {f.value}"
            for f in self.findings
            if f.severity >= Severity.UNKNOWN
        ]
        return "; ".join(lines)

    @property
    def fix(self) -> str:
        """The fixes of the findings below OK, joined."""
        return "; ".join(f.fix for f in self.findings if f.fix and f.severity >= Severity.UNKNOWN)


#: A protocol's check of one destination: raises TransientError when the broker could
#: not be reached, PermanentError for bad credentials.
Inspector = Callable[[str], DestinationReport]


def _module(protocol: str) -> ModuleType:
    """The check module of ``protocol`` (``msgsafe.checks.PROTOCOL``)."""
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"no destination check for protocol {protocol!r}")
    return importlib.import_module(f"{__name__}.{protocol}")


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
