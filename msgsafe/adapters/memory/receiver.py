"""The consuming half of ``memory://NAME``: one member of a group on the in-process
broker, with the network receivers' contract (at-least-once, ``redelivered`` set on a
second delivery)."""

from __future__ import annotations

from msgsafe.adapters.memory._wire import delivery_of
from msgsafe.adapters.memory.broker import Leased, MemoryBroker
from msgsafe.errors import ClosedError
from msgsafe.message import Delivery, Outcome

__all__ = ["MemoryReceiver"]

#: The memory broker counts no deliveries: a release is a requeue.
_GIVE_BACK = (Outcome.REQUEUE, Outcome.RELEASE)


class MemoryReceiver:
    """Consumes from a :class:`MemoryBroker` as one member of a group. Thread-safe."""

    def __init__(self, broker: MemoryBroker, group: str | None) -> None:
        self._broker = broker
        self._group = group
        self._id = broker.new_receiver_id()
        self._sources: list[str] = []
        self._next = 0
        self._closed = False

    def subscribe(self, destination: str) -> None:
        if self._closed:
            raise ClosedError("receiver is closed")
        if destination not in self._sources:
            self._sources.append(destination)

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        if self._closed:
            raise ClosedError("receiver is closed")
        if not self._sources:
            raise ClosedError("subscribe to a destination before receiving")
        # Rotate the order so one busy destination cannot starve another.
        k = self._next % len(self._sources)
        self._next += 1
        order = self._sources[k:] + self._sources[:k]
        leased = self._broker.lease(
            order, self._group, self._id, max_messages, timeout, lambda: self._closed
        )
        return [self._delivery(item) for item in leased]

    def _delivery(self, item: Leased) -> Delivery:
        def settle(outcome: Outcome) -> None:
            self._broker.settle(item, requeue=outcome in _GIVE_BACK)

        return delivery_of(
            item.envelope, item.destination, redelivered=item.redelivered, settle=settle
        )

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._broker.release_receiver(self._id)
        self._broker.wake()
