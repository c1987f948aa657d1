"""Errors of ``memory://``: already msgsafe errors, given the context of the boundary.

The in-process broker raises :mod:`msgsafe.errors` itself (its faults are written in
them, see :mod:`~msgsafe.adapters.memory.broker`), so nothing needs translating. What
is left of a network adapter's boundary is the context it adds: the endpoint.
"""

from __future__ import annotations

from msgsafe.errors import MsgsafeError

__all__ = ["at_endpoint"]


def at_endpoint(error: MsgsafeError, target: str) -> MsgsafeError:
    """``error`` naming ``target`` as its endpoint when it names none."""
    error.endpoint = error.endpoint or target
    return error
