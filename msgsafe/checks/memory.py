"""``memory://``: the in-process broker says what a test set with
:meth:`~msgsafe.adapters.memory.broker.MemoryBroker.set_guarantee`; a broker that is
down cannot be asked, as a real one."""

from __future__ import annotations

from msgsafe.adapters.memory._connection import connect
from msgsafe.checks import DestinationReport
from msgsafe.checks.findings import Finding, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConnectError
from msgsafe.message import Guarantee

__all__ = ["inspect_destination"]


def inspect_destination(
    url: BrokerUrl, destination: str, *, declare: str | None = None, timeout: float = 0.0
) -> DestinationReport:
    """The guarantee the memory broker was given for ``destination``."""
    del declare, timeout
    broker = connect(url)
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
