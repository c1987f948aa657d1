"""One proxied connection and what shapes its bytes: the mode, a token bucket per
direction, an RST on demand.

Split from :mod:`msgsafe.testing.faultproxy` so that file reads as the proxy's contract
and its event loop; these are the parts the loop handles, touched only on its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import time
from typing import Literal

__all__ = ["DOWN", "UP", "Conn", "Direction", "Mode", "TokenBucket", "directions", "rst"]

Direction = Literal["upstream", "downstream", "both"]
"""``upstream``: client to server; ``downstream``: server to client."""

#: Index of a direction in the per-direction lists.
UP, DOWN = 0, 1


class Mode(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    STALL = "stall"
    RESET = "reset"


class TokenBucket:
    """A token bucket for one direction; tokens may go negative, callers then wait."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._tokens = 0.0
        self._last = time.monotonic()

    def delay_for(self, size: int) -> float:
        now = time.monotonic()
        # A small burst allowance keeps the measured rate close to the configured one.
        self._tokens = min(self.rate * 0.05, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= size
        return -self._tokens / self.rate if self._tokens < 0 else 0.0

    @property
    def chunk(self) -> int:
        return max(256, int(self.rate * 0.05))


class Conn:
    """One client connection and its upstream twin. Touched only on the loop thread."""

    def __init__(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.client_r = client_r
        self.client_w = client_w
        self.up_r: asyncio.StreamReader | None = None
        self.up_w: asyncio.StreamWriter | None = None
        self.gapped = False  # some bytes were dropped: the stream can never be whole again
        self.cut_budget: int | None = None
        self.closed = False
        self.eof = [False, False]
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_w, self.up_w) if w is not None]


def rst(writer: asyncio.StreamWriter) -> None:
    """Abort ``writer``'s transport so that the kernel sends RST, not FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def directions(direction: Direction) -> tuple[int, ...]:
    if direction == "both":
        return (UP, DOWN)
    if direction == "upstream":
        return (UP,)
    if direction == "downstream":
        return (DOWN,)
    raise ValueError(f"direction must be 'upstream', 'downstream' or 'both', not {direction!r}")
