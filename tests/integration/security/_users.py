"""The SCRAM user of the secure Kafka this package's tests share."""

from __future__ import annotations

import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class ScramUser:
    name: str
    password: str


#: Its password is new every run (the canary sweep searches for it).
SCRAM_USER = ScramUser("msgsafe-app", f"scram-{secrets.token_urlsafe(12)}")
