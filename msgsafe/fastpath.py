"""The fast path: a send that goes around msgsafe's producer while that is safe.

To match the speed of the clients they replace, the drop-in wrappers (and the producer's
Kafka transport) send a message straight on a client connection of their own and take
the broker's confirm as the promise kept. That is safe only while no message of the
same destination waits in the outbox, which a fast send could overtake, and while the
broker answers. This module is the one definition of when that holds:

- **fast** (``resting`` False): sends take the fast path while its last answer was good;
- a **failure** of the fast path (the connection or channel lost, a nack, no answer in
  time, the brokers down: :meth:`FastPath.failed`) and it **rests**: every send takes
  the safe path, msgsafe's :class:`~msgsafe.Producer` with its outbox and per-key order;
- a **refusal** of one message (a return, a release: :meth:`FastPath.refused`) sends
  that message the safe path, which decides what the caller sees; the broker answered,
  so the fast path stays open;
- back to **fast** only when the safe path confirmed a message and the backlog is empty
  (:meth:`FastPath.confirmed_safe`: nothing waits in the outbox that a fast send could
  overtake, for the key or any other).

The state is read without a lock on the hot path (one attribute): a send that raced a
change of it goes one way or the other, each of which keeps the promise; what matters
for order is that the backlog is empty before the path reopens, and that the message
that failed fast is handed to the safe path before the next send of its caller.

A fast path that holds messages of its own when it fails (librdkafka's queue) hands
them to the outbox here, in send order, in one put: :func:`store_refused` is the one
place where a message the fast path could not deliver is written to the outbox.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from msgsafe.errors import OutboxError
from msgsafe.message import Envelope
from msgsafe.ports import OutboxStore, SafePath

__all__ = ["FastPath", "store_refused"]


class FastPath:
    """One fast path's state (see the module docstring): resting or not, the safe path's
    destination check asked once per destination, and the count of fast confirms."""

    __slots__ = ("_count_lock", "_guarantees", "_safe", "accepted", "resting")

    def __init__(self, safe: SafePath, *, resting: bool = False) -> None:
        self._safe = safe
        self._guarantees: dict[str, Any] = {}
        self._count_lock = threading.Lock()
        #: True while sends take the safe path (after a failure, or until a first confirm).
        self.resting = resting
        #: Messages the broker confirmed on the fast path so far.
        self.accepted = 0

    def guarantee(self, destination: str) -> Any:
        """The safe path's check of ``destination``, asked once; raises what it raises
        (a refusal: the message takes the safe path, which raises it to the caller)."""
        found = self._guarantees.get(destination)
        if found is None:
            found = self._guarantees[destination] = self._safe.guarantee(destination)
        return found

    def confirmed(self) -> None:
        """The broker confirmed a message sent the fast way."""
        with self._count_lock:
            self.accepted += 1

    def refused(self) -> None:
        """The broker refused one message sent the fast way (a return, a release): that
        message takes the safe path; the broker answered, the fast path stays open."""

    def failed(self) -> None:
        """The fast path failed (connection lost, nack, no answer, brokers down): rest
        until :meth:`confirmed_safe` finds the safe path answering with nothing stored."""
        self.resting = True

    def confirmed_safe(self) -> None:
        """The safe path confirmed a message: when nothing waits in its outbox either,
        the broker answers and nothing is stored that a fast send could overtake; the
        fast path opens again."""
        if self.resting and self._safe.pending() == 0:
            self.resting = False


def store_refused(store: OutboxStore | None, envelopes: Sequence[Envelope]) -> OutboxError | None:
    """Write messages the fast path could not deliver to the outbox, in one put, in the
    order given (their send order: per key, the order they were sent); None when they
    are stored, otherwise the error each of them fails with (no outbox, or what the
    store raised, as an :class:`~msgsafe.errors.OutboxError`)."""
    if store is None:
        return OutboxError("no outbox")
    try:
        store.put(list(envelopes))
    except Exception as exc:  # a store's own error too: the messages fail with it
        return OutboxError.of(exc)
    return None
