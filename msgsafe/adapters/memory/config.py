"""Options of the memory adapter: the common ones only."""

from __future__ import annotations

from dataclasses import dataclass

from msgsafe.adapters._config import TransportOptions

__all__ = ["MemoryOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions(TransportOptions):
    """``memory://NAME`` takes the common transport options."""
