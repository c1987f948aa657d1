"""A bounded memory of message ids, for dropping redeliveries and retried duplicates."""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["DedupWindow"]


class DedupWindow:
    """The last ``capacity`` message ids seen, oldest forgotten first. Thread-safe.

    Bounded on purpose: memory stays flat however long a consumer runs. A duplicate
    older than the window passes through — size the window to cover the redelivery
    horizon (in-flight window + outbox backlog) of the producers you read from.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        """True if ``message_id`` was recorded and is still in the window."""
        with self._lock:
            if message_id in self._ids:
                self._ids.move_to_end(message_id)
                return True
            return False

    def record(self, message_id: str) -> None:
        """Remember ``message_id``; forget the oldest beyond the capacity."""
        with self._lock:
            self._ids[message_id] = None
            self._ids.move_to_end(message_id)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)

    def __len__(self) -> int:
        return len(self._ids)
