"""What a check of a broker reports: findings with a severity, the setting, why it
matters (the failure story that shows it) and the fix. ``msgsafe doctor`` prints them;
the producer turns a destination's findings into a :class:`~msgsafe.message.Guarantee`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["STORIES", "Finding", "Severity"]


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
