"""What a check of a broker reports: findings with a severity, the setting, why it
matters (the failure story that shows it) and the fix. ``msgsafe doctor`` prints them;
the producer turns a destination's findings into a :class:`~msgsafe.message.Guarantee`
(a :class:`DestinationReport`).

Plain values, below the adapters: each protocol's check lives in its adapter package
(``msgsafe/adapters/NAME/check.py``) and reports in these terms."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from msgsafe.message import Guarantee

__all__ = ["STORIES", "DestinationReport", "Finding", "Inspector", "Severity"]


class Severity(enum.IntEnum):
    """Ordered: the worst finding decides the exit code."""

    OK = 0
    INFO = 1
    UNKNOWN = 2  #: the broker could not tell; we do not guess
    WARNING = 3  #: weakens a guarantee or availability; no loss by itself
    CRITICAL = 4  #: the failure stories show acknowledged messages lost with this


#: The failure stories (../shared/reference/ in the project) each finding cites.
STORIES = {
    "kafka": "Kafka fault tolerance and HA (ISR, acks, unclean leader election)",
    "rabbit-partitions": "RabbitMQ network partitions (ignore, pause_minority, autoheal)",
    "rabbit-ha": "RabbitMQ fail-over and HA (mirrored queues, promotion, quorum queues)",
    "amqp-failover": "AMQP cluster session fail-over requirements (failover-server-list)",
    "qpid-ha": "Qpid Broker-J HA group behaviour (quorum, sync policies)",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One checked setting."""

    severity: Severity
    subject: str  #: what was checked, e.g. "topic orders" or "cluster"
    setting: str  #: e.g. "replication factor"
    value: str  #: what the broker said, or "unknown"
    why: str = ""  #: the failure this exposes, citing a story
    fix: str = ""
    story: str | None = None  #: key of STORIES

    def as_dict(self) -> dict[str, str | None]:
        return {
            "severity": self.severity.name.lower(),
            "subject": self.subject,
            "setting": self.setting,
            "value": self.value,
            "why": self.why,
            "fix": self.fix,
            "story": STORIES.get(self.story or ""),
        }


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
