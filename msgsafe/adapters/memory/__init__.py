"""``memory://NAME``: an in-process broker with fault injection, for unit tests and for
users' own tests (public as :mod:`msgsafe.testing`). Never a stand-in for a real broker
in an integration test."""

from __future__ import annotations

from collections.abc import Mapping

from msgsafe.adapters._config import build_config
from msgsafe.adapters.memory._connection import connect
from msgsafe.adapters.memory.broker import MemoryBroker
from msgsafe.adapters.memory.config import MemoryOptions, check_destination
from msgsafe.adapters.memory.receiver import MemoryReceiver
from msgsafe.adapters.memory.transport import MemoryTransport
from msgsafe.endpoints import BrokerUrl

__all__ = [
    "MemoryBroker",
    "MemoryOptions",
    "MemoryReceiver",
    "MemoryTransport",
    "check_destination",
    "open_receiver",
    "open_transport",
]


def open_transport(url: BrokerUrl, options: Mapping[str, object]) -> MemoryTransport:
    """A transport into the broker named by ``url`` (created on first use)."""
    config = build_config(MemoryOptions, url, options)
    return MemoryTransport(connect(url), config, url.redacted())


def open_receiver(
    url: BrokerUrl, options: Mapping[str, object], *, group: str | None = None
) -> MemoryReceiver:
    """A receiver on the broker named by ``url``; ``group`` shares the work."""
    build_config(MemoryOptions, url, options)
    return MemoryReceiver(connect(url), group)
