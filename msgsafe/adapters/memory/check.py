"""``memory://``: the in-process broker says what a test set with
:meth:`~msgsafe.adapters.memory.broker.MemoryBroker.set_guarantee`; a broker that is
down cannot be asked, as a real one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgsafe.adapters.memory import MemoryBroker
from msgsafe.checks.findings import DestinationReport, Finding, Inspector, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConnectError
from msgsafe.message import Guarantee

__all__ = ["doctor_findings", "inspect_destination", "inspector"]


def doctor_findings(
    url: BrokerUrl, destinations: Sequence[str], management: str | None
) -> list[Finding]:
    """``msgsafe doctor``'s one finding: the memory broker keeps messages only here."""
    del url, destinations, management
    return [
        Finding(
            Severity.INFO,
            "broker",
            "kind",
            "memory",
            "the in-process memory broker keeps messages only in this process",
        )
    ]


def inspector(url: BrokerUrl, options: Mapping[str, object]) -> Inspector:
    """The producer's check of the memory broker ``url`` names."""
    del options  # the memory broker has no connection settings
    return lambda destination: inspect_destination(url, destination)


def inspect_destination(url: BrokerUrl, destination: str) -> DestinationReport:
    """The guarantee the memory broker was given for ``destination``."""
    broker = MemoryBroker.named(url.path)
    if broker.is_down:
        raise ConnectError("the memory broker is down", endpoint=url.redacted())
    guarantee = broker.guarantee(destination)
    if guarantee is Guarantee.REPLICATED:
        return DestinationReport(destination, guarantee)
    finding = Finding(
        Severity.CRITICAL if guarantee is Guarantee.NONE else Severity.WARNING,
        f"destination {destination}",
        "guarantee",
        guarantee.value,
        "set by the test (MemoryBroker.set_guarantee)",
        "MemoryBroker.set_guarantee(destination, Guarantee.REPLICATED)",
    )
    return DestinationReport(destination, guarantee, (finding,))
