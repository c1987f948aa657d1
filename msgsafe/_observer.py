"""Connection events (fail-over, redirect, a broker reachable again) from an adapter's
I/O thread to its owner.

An adapter's connection code does not know which producer or consumer it serves, and
the seams carry no telemetry argument. Instead the owner opens its transport inside
:func:`observing`; the objects that follow connections (``EndpointList``, AMQP 1.0's
``Redirects``) take :func:`current` when they are built — in the caller's thread, during
``open_transport`` — and report to it later from any thread. Outside :func:`observing`
they get ``None`` and report nothing: no cost.

It sits below every layer, beside ``endpoints.py``: the connection code (``endpoints``,
the adapters) takes the observer from here, and what hears it (telemetry, the
destination checks, the outbox's forwarder) only implements the Protocol, so nothing
low imports telemetry.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol

__all__ = ["ConnectionObserver", "Observers", "current", "observing"]


class ConnectionObserver(Protocol):
    """What an owner of connections hears. Called on I/O threads: must not block or raise."""

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        """A new connection to ``endpoint`` serves after the one to ``previous`` ended."""
        ...

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        """The broker at ``previous`` sent the client to ``endpoint`` (``reason``: why)."""
        ...

    def reachable(self, endpoint: str) -> None:
        """A broker of ``endpoint`` answers again after every one had been unreachable:
        what waits out the outage (a destination check, the outbox's next probe) may
        go now rather than at its next period."""
        ...


class Observers:
    """Several observers heard as one, in order (telemetry, then the destination checks,
    then what joins later: the outbox's forwarder)."""

    def __init__(self, *observers: ConnectionObserver) -> None:
        self._observers = list(observers)

    def add(self, observer: ConnectionObserver) -> None:
        """Hear ``observer`` too, from the next event on (an owner whose parts are made
        after its connection: the producer's forwarder)."""
        self._observers.append(observer)

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        for observer in self._observers:
            observer.failover(previous, endpoint, reason)

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        for observer in self._observers:
            observer.redirect(previous, endpoint, reason)

    def reachable(self, endpoint: str) -> None:
        for observer in self._observers:
            observer.reachable(endpoint)


_CURRENT: contextvars.ContextVar[ConnectionObserver | None] = contextvars.ContextVar(
    "msgsafe_connection_observer", default=None
)


def current() -> ConnectionObserver | None:
    """The observer of the connections being built now, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def observing(observer: ConnectionObserver | None) -> Iterator[None]:
    """Connections built inside this block report to ``observer``."""
    token = _CURRENT.set(observer)
    try:
        yield
    finally:
        _CURRENT.reset(token)
