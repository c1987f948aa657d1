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

A fast path that holds messages of its own when it fails (librdkafka's queue) does
not rest at once: it **switches** (:meth:`FastPath.switch`; sends are parked meanwhile,
never sent either way), empties what it holds, hands what was not delivered to the
outbox here, in send order, in one put (:func:`store_refused` is the one place where a
message the fast path could not deliver is written to the outbox), sends the parked
ones the safe path, and only then rests (:meth:`FastPath.switched`). Such a path reopens
with :meth:`FastPath.reopen`, once its owner has seen nothing of its own unreported and
nothing stored; :meth:`FastPath.hold` keeps it resting a while (the brokers reported
down) or for good (its client is broken, or closed).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from msgsafe.errors import OutboxError
from msgsafe.message import Envelope
from msgsafe.ports import OutboxStore, SafePath

__all__ = ["FastPath", "store_refused"]


class FastPath:
    """One fast path's state (see the module docstring): resting or not, switching or
    not, the safe path's destination check asked once per destination, and the count of
    fast confirms."""

    __slots__ = (
        "_count_lock",
        "_guarantees",
        "_not_before",
        "_safe",
        "accepted",
        "holds",
        "resting",
        "switching",
    )

    def __init__(self, safe: SafePath | None, *, resting: bool = False) -> None:
        #: None: the owner reopens the path itself (:meth:`reopen`) and asks its checks
        #: elsewhere (the producer's own fast path).
        self._safe = safe
        self._guarantees: dict[str, Any] = {}
        self._count_lock = threading.Lock()
        #: True while sends take the safe path (after a failure, or until a first confirm).
        self.resting = resting
        #: True while a fast path that holds messages empties them (sends are parked).
        self.switching = False
        #: True from an opening until a switch emptied the path: it may hold messages.
        self.holds = not resting
        #: ``time.monotonic()`` before which the path does not reopen (inf: never).
        self._not_before = 0.0
        #: Messages the broker confirmed on the fast path so far.
        self.accepted = 0

    def guarantee(self, destination: str) -> Any:
        """The safe path's check of ``destination``, asked once; raises what it raises
        (a refusal: the message takes the safe path, which raises it to the caller)."""
        found = self._guarantees.get(destination)
        if found is None:
            if self._safe is None:
                raise TypeError("this fast path has no safe path to ask")
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
        self.holds = False

    def confirmed_safe(self) -> None:
        """The safe path confirmed a message: when nothing waits in its outbox either,
        the broker answers and nothing is stored that a fast send could overtake; the
        fast path opens again."""
        if (
            self.resting
            and not self.switching
            and self._not_before <= time.monotonic()
            and self._safe is not None
            and self._safe.pending() == 0
        ):
            self.resting = False
            self.holds = True

    # --- a fast path that holds messages of its own (librdkafka's queue) ----------------

    def switch(self) -> bool:
        """Leave the fast path: rest, and be switching until :meth:`switched`. True when
        this call left it (the caller then settles what the path holds, stores what was
        not delivered with :func:`store_refused`, sends the parked messages the safe
        path, and calls :meth:`switched`); False when it was resting already. Call under
        the lock the sends read :attr:`resting` under: no send enters the path after.
        A path shut while it held messages can still switch, to empty them."""
        if self.switching or not self.holds:
            return False
        self.resting = True
        self.switching = True
        return True

    def switched(self) -> None:
        """The switch is over: nothing is held or parked any more; sends take the safe
        path until the path reopens."""
        self.switching = False
        self.holds = False

    def hold(self, seconds: float | None) -> None:
        """Do not reopen within ``seconds`` from now (None: never again, the path's
        client is broken or closed). A longer hold already set is kept."""
        until = math.inf if seconds is None else time.monotonic() + seconds
        with self._count_lock:
            if until > self._not_before:
                self._not_before = until

    def may_reopen(self, now: float) -> bool:
        """Whether :meth:`reopen` could open the path at ``now`` (``time.monotonic()``):
        resting, not switching, no hold."""
        return self.resting and not self.switching and now >= self._not_before

    def reopen(self) -> bool:
        """Open again (True), unless switching or held: the caller has seen the safe path
        with nothing stored and nothing of its own unreported (the form of
        :meth:`confirmed_safe` for a path whose owner counts what it holds). Call under
        the lock the sends read :attr:`resting` under."""
        if not self.may_reopen(time.monotonic()):
            return False
        self.resting = False
        self.holds = True
        return True

    def shut(self) -> None:
        """Rest for good (the owner is closed): every send takes the safe path, which
        refuses it. What the path still holds is the owner's to empty (:meth:`switch`)."""
        self.hold(None)
        self.resting = True


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
