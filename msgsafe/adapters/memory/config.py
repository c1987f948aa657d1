"""Options of the memory adapter: the common ones only."""

from __future__ import annotations

from dataclasses import dataclass

from msgsafe.adapters._config import TransportOptions

__all__ = ["MemoryOptions", "check_destination"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions(TransportOptions):
    """``memory://NAME`` takes the common transport options."""


def check_destination(destination: str) -> None:
    """The adapter's name check (see :mod:`msgsafe.adapters`): the memory broker takes
    every name a message can carry (:meth:`~msgsafe.message.Envelope.build` refuses an
    empty one)."""
