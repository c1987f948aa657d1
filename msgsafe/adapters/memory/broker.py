"""An in-process broker with fault injection: the test double of msgsafe, public API.

Destinations are logs; each consumer group reads a log from the start with its own
cursor, so one group behaves as a queue (competing consumers) and several groups as a
topic. Unsettled deliveries return to their group when a receiver closes, when the
broker goes :meth:`~MemoryBroker.down`, or on ``nack(requeue=True)``; they come back
with ``redelivered=True``.

Faults a test can drive (all thread-safe, all take effect on the next publish):

- :meth:`~MemoryBroker.refuse_writes` — publishes fail with ``Refused`` (transient);
- :meth:`~MemoryBroker.reject_next` — the next *n* fail with ``Rejected`` (permanent);
- :meth:`~MemoryBroker.drop_before_confirm` — the connection drops before the broker
  stored the message (``ConnectionLost``; nothing stored);
- :meth:`~MemoryBroker.drop_after_confirm` — the broker stored it but the confirm is
  lost (``ConnectionLost``; a retry duplicates it);
- :meth:`~MemoryBroker.delay_confirms` — confirms arrive late (a publisher whose
  ``confirm_timeout`` is shorter sees ``ConfirmTimeout``, and the message is stored);
- :meth:`~MemoryBroker.down` / :meth:`~MemoryBroker.up` — unreachable (``ConnectError``).
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from msgsafe.errors import (
    ConnectError,
    ConnectionLost,
    MessageTooLarge,
    Refused,
    Rejected,
)
from msgsafe.message import Envelope, Guarantee

__all__ = ["MemoryBroker"]

DEFAULT_GROUP = "__queue__"


@dataclass(slots=True)
class _Group:
    cursor: int = 0
    requeued: collections.deque[int] = field(default_factory=collections.deque)
    #: offset -> (connection epoch of the receiver that holds it, receiver id)
    unsettled: dict[int, tuple[int, int]] = field(default_factory=dict)
    delivered_once: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Log:
    messages: list[Envelope] = field(default_factory=list)
    count: int = 0
    groups: dict[str, _Group] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Leased:
    """One message handed to a receiver; settle it with :meth:`MemoryBroker.settle`."""

    envelope: Envelope
    destination: str
    group: str
    offset: int
    epoch: int
    redelivered: bool


class MemoryBroker:
    """A named, thread-safe in-process broker. ``MemoryBroker.named("x")`` is what
    ``memory://x`` connects to; create brokers directly for isolated tests.

    With ``retain=False`` messages are only counted, never kept (nothing can be
    consumed), so benchmarks can push millions through with flat memory.
    """

    _registry: ClassVar[dict[str, MemoryBroker]] = {}
    _registry_lock = threading.Lock()

    def __init__(self, name: str = "", *, retain: bool = True, max_message_size: int | None = None):
        self.name = name
        self.retain = retain
        self.max_message_size = max_message_size
        self._lock = threading.Condition()
        self._logs: dict[str, _Log] = {}
        self._epoch = 0
        self._receiver_ids = itertools.count(1)
        self._down = False
        self._refuse: str | None = None
        self._reject: list[str] = []
        self._drop_before = 0
        self._drop_after = 0
        self._delay = 0.0
        self.publish_attempts = 0
        self._guarantees: dict[str, Guarantee] = {}

    # --- registry ---------------------------------------------------------------------

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        """The broker ``memory://name`` connects to, created on first use."""
        with cls._registry_lock:
            broker = cls._registry.get(name)
            if broker is None:
                broker = cls._registry[name] = cls(name)
            return broker

    @classmethod
    def install(cls, broker: MemoryBroker) -> MemoryBroker:
        """Make ``memory://<broker.name>`` connect to ``broker`` (replacing any other)."""
        with cls._registry_lock:
            cls._registry[broker.name] = broker
        return broker

    @classmethod
    def forget(cls, name: str) -> None:
        """Drop the named broker and everything it holds."""
        with cls._registry_lock:
            cls._registry.pop(name, None)

    # --- fault injection -------------------------------------------------------------

    def set_guarantee(self, destination: str, guarantee: Guarantee) -> None:
        """What the producer's destination check reports for ``destination`` (default
        :attr:`Guarantee.REPLICATED`): lets a test see its code refuse, or warn about, a
        destination that would lose confirmed messages."""
        with self._lock:
            self._guarantees[destination] = guarantee

    def guarantee(self, destination: str) -> Guarantee:
        """The guarantee set for ``destination`` (REPLICATED unless set)."""
        with self._lock:
            return self._guarantees.get(destination, Guarantee.REPLICATED)

    def refuse_writes(self, reason: str = "broker refuses writes") -> None:
        """Every publish fails with ``Refused`` until :meth:`accept_writes`."""
        with self._lock:
            self._refuse = reason

    def accept_writes(self) -> None:
        """Undo :meth:`refuse_writes`."""
        with self._lock:
            self._refuse = None

    def reject_next(self, n: int = 1, condition: str = "amqp:precondition-failed") -> None:
        """The next ``n`` publishes fail with ``Rejected(condition)``."""
        with self._lock:
            self._reject.extend([condition] * n)

    def drop_before_confirm(self, n: int = 1) -> None:
        """The next ``n`` publishes lose the connection before the broker stores them."""
        with self._lock:
            self._drop_before += n

    def drop_after_confirm(self, n: int = 1) -> None:
        """The next ``n`` publishes are stored, then the connection drops before the confirm."""
        with self._lock:
            self._drop_after += n

    def delay_confirms(self, seconds: float) -> None:
        """Confirms arrive ``seconds`` late (0 to stop)."""
        with self._lock:
            self._delay = max(0.0, seconds)

    @property
    def confirm_delay(self) -> float:
        """The current confirm delay in seconds."""
        return self._delay

    def down(self) -> None:
        """Become unreachable: publishes fail with ``ConnectError``; every unsettled
        delivery returns to its group (the connections dropped)."""
        with self._lock:
            self._down = True
            self._epoch += 1
            for log in self._logs.values():
                for group in log.groups.values():
                    self._requeue_all(group, lambda _holder: True)
            self._lock.notify_all()

    def up(self) -> None:
        """Become reachable again."""
        with self._lock:
            self._down = False
            self._lock.notify_all()

    @property
    def is_down(self) -> bool:
        """True while the broker is down."""
        return self._down

    # --- publishing ---------------------------------------------------------------------

    def accept(self, envelope: Envelope) -> None:
        """Apply the faults and store ``envelope``; raises the msgsafe error a real broker
        would cause. Called by the memory transport."""
        with self._lock:
            self.publish_attempts += 1
            down, refuse = self._down, self._refuse
            if not down and refuse is None:
                self._store(envelope)
                return
        # NOTE: the errors are built outside the lock: while the broker refuses, every
        # publish ends here, and concurrent publishers would queue on the lock.
        if down:
            raise ConnectError(f"memory broker {self.name!r} is down")
        raise Refused(refuse or "", message_id=envelope.message_id)

    def _store(self, envelope: Envelope) -> None:
        # The rest of accept(), under the lock, for a broker that is up and takes writes.
        if self._reject:
            raise Rejected(
                "broker rejected the message",
                condition=self._reject.pop(0),
                message_id=envelope.message_id,
            )
        if self.max_message_size is not None and envelope.size > self.max_message_size:
            raise MessageTooLarge(
                f"{envelope.size} bytes exceeds the broker's {self.max_message_size}",
                message_id=envelope.message_id,
            )
        if self._drop_before:
            self._drop_before -= 1
            raise ConnectionLost(
                "connection dropped before the broker stored it", message_id=envelope.message_id
            )
        log = self._logs.setdefault(envelope.destination, _Log())
        if self.retain:
            log.messages.append(envelope)
        log.count += 1
        self._lock.notify_all()
        if self._drop_after:
            self._drop_after -= 1
            raise ConnectionLost(
                "connection dropped after the broker stored it", message_id=envelope.message_id
            )

    # --- consuming ------------------------------------------------------------------------

    def new_receiver_id(self) -> int:
        """An id for a receiver, used to give back its unsettled deliveries on close."""
        return next(self._receiver_ids)

    def lease(
        self,
        destinations: Sequence[str],
        group: str | None,
        receiver: int,
        max_messages: int,
        timeout: float | None,
        is_closed: Callable[[], bool] = lambda: False,
    ) -> list[Leased]:
        """Hand up to ``max_messages`` from ``destinations`` to ``receiver``, waiting up
        to ``timeout`` for the first one; redeliveries first, then new messages."""
        name = group or DEFAULT_GROUP
        out: list[Leased] = []

        def has_work(destination: str) -> bool:
            log = self._logs.get(destination)
            if log is None:
                return False
            g = log.groups.setdefault(name, _Group())
            return bool(g.requeued) or g.cursor < len(log.messages)

        with self._lock:
            self._lock.wait_for(
                lambda: is_closed() or (not self._down and any(has_work(d) for d in destinations)),
                timeout,
            )
            if self._down or is_closed():
                return out
            for destination in destinations:
                log = self._logs.get(destination)
                if log is None:
                    continue
                g = log.groups.setdefault(name, _Group())
                while len(out) < max_messages:
                    if g.requeued:
                        offset = g.requeued.popleft()
                    elif g.cursor < len(log.messages):
                        offset = g.cursor
                        g.cursor += 1
                    else:
                        break
                    redelivered = offset in g.delivered_once
                    g.delivered_once.add(offset)
                    g.unsettled[offset] = (self._epoch, receiver)
                    out.append(
                        Leased(
                            log.messages[offset],
                            destination,
                            name,
                            offset,
                            self._epoch,
                            redelivered,
                        )
                    )
        return out

    def settle(self, leased: Leased, requeue: bool) -> None:
        """Ack (``requeue=False`` also rejects: the message is dropped) or requeue one
        delivery. A delivery from before a connection drop is stale: the broker already
        took it back, so settling it is a no-op, as on a real broker."""
        with self._lock:
            log = self._logs.get(leased.destination)
            if log is None:
                return
            g = log.groups.get(leased.group)
            if g is None or g.unsettled.get(leased.offset, (None,))[0] != leased.epoch:
                return
            del g.unsettled[leased.offset]
            if requeue:
                g.requeued.append(leased.offset)
                self._lock.notify_all()
            else:
                g.delivered_once.discard(leased.offset)

    def release_receiver(self, receiver: int) -> None:
        """Give back everything ``receiver`` holds unsettled (it closed or crashed)."""
        with self._lock:
            for log in self._logs.values():
                for g in log.groups.values():
                    self._requeue_all(g, lambda holder: holder == receiver)
            self._lock.notify_all()

    def wake(self) -> None:
        """Wake blocked receivers (one of them closed)."""
        with self._lock:
            self._lock.notify_all()

    def _requeue_all(self, g: _Group, match: Callable[[int], bool]) -> None:
        back = sorted(off for off, (_, holder) in g.unsettled.items() if match(holder))
        for off in back:
            del g.unsettled[off]
        g.requeued.extendleft(reversed(back))

    # --- inspection -------------------------------------------------------------------------

    def messages(self, destination: str) -> list[Envelope]:
        """Every message stored at ``destination`` in arrival order (duplicates included)."""
        with self._lock:
            log = self._logs.get(destination)
            return list(log.messages) if log else []

    def ids(self, destination: str) -> list[str]:
        """The message ids stored at ``destination`` in arrival order."""
        return [m.message_id for m in self.messages(destination)]

    def count(self, destination: str) -> int:
        """How many messages ``destination`` received (also with ``retain=False``)."""
        with self._lock:
            log = self._logs.get(destination)
            return log.count if log else 0

    def destinations(self) -> list[str]:
        """Every destination that received a message."""
        with self._lock:
            return sorted(self._logs)

    def __repr__(self) -> str:
        return f"MemoryBroker(name={self.name!r}, down={self._down})"
