"""The producer's memory of recent message ids: an id reused for another message is refused.

A caller resends with the same ``message_id`` to keep a retry deduplicable (the outbox
stores it once, ``Consumer(dedup=True)`` drops the copy). The same id on a *different*
message would be dropped by those very checks as a duplicate — lost — so the producer
remembers, for each recent id, a digest of what it named (destination, key, body) and
refuses a send whose id names something else (:class:`~msgsafe.errors.MessageIdReused`).

The memory is two generations of at most :data:`WINDOW` ids each: the horizon is at
least the last :data:`WINDOW` single sends of the producer (at most twice that), about
150 bytes an id. An id older than that is checked by the outbox's put alone (while its
row still waits there). Batches are not remembered.
"""

from __future__ import annotations

from msgsafe.errors import MessageIdReused

__all__ = ["WINDOW", "RecentIds"]

#: Ids per generation (the horizon: see the module docstring).
WINDOW = 10_000


class RecentIds:
    """Id -> digest for the recent sends (see the module docstring). Safe to call from
    any thread: each step is one dict operation under the GIL; two threads swapping the
    generations at once at worst forget one id early."""

    __slots__ = ("_new", "_old", "_size")

    def __init__(self, size: int = WINDOW) -> None:
        self._size = size
        self._new: dict[str, int] = {}
        self._old: dict[str, int] = {}

    def remember(
        self, message_id: str, destination: str, key: bytes | None, body: bytes | None
    ) -> None:
        """Remember what ``message_id`` names; :class:`MessageIdReused` (nothing
        remembered) when it named another message within the horizon."""
        # Python's hash: a bytes body caches its own, and the memory is this process's.
        named = hash((destination, key, body))
        new = self._new
        seen = new.get(message_id)
        if seen is None:
            seen = self._old.get(message_id)
        if seen is not None and seen != named:
            raise MessageIdReused(
                f"message id {message_id} was sent within the producer's last {self._size}"
                " sends or more with another destination, key or body: an id may be reused"
                " only to send the same message again",
                message_id=message_id,
            )
        new[message_id] = named
        if len(new) >= self._size:
            self._old, self._new = new, {}
