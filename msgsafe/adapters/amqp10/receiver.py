"""The AMQP 1.0 consuming receiver (python-qpid-proton).

:class:`Amqp10Receiver` is what callers see; :class:`Subscriptions` is what its
:class:`~msgsafe.adapters.amqp10._connection.Engine` keeps across connections: every
subscription (address and credit window), attached again after each fail-over, and the
inbox of deliveries not yet handed out.

Deliveries received on a connection that has since died cannot be settled on the new
one (AMQP delivery state belongs to the link): settling them is a no-op, logged at
debug level, and the broker redelivers them because they were never settled. A
delivery is therefore never acknowledged twice; it may be *received* twice.

Proton's objects belong to the container thread: its C reference counts are not
thread-safe, so a proton object released on another thread while the container runs can
corrupt them (the process aborts). A :class:`~msgsafe.message.Delivery` handed out
therefore holds only a number; the proton delivery it stands for stays in
:class:`Subscriptions` and is released on the container thread, when it is settled or
its connection ends.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proton import Delivery as ProtonDelivery
from proton import Message

from msgsafe.adapters.amqp10._connection import Engine, EngineClient, log
from msgsafe.adapters.amqp10._wire import read_message
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ClosedError, ConfigurationError, MsgsafeError
from msgsafe.message import Delivery, Outcome

__all__ = ["Amqp10Receiver", "Subscriptions"]

_SETTLE = {
    Outcome.ACCEPT: ProtonDelivery.ACCEPTED,
    Outcome.REQUEUE: ProtonDelivery.RELEASED,
    Outcome.REJECT: ProtonDelivery.REJECTED,
    Outcome.RELEASE: ProtonDelivery.RELEASED,
}


class Amqp10Receiver(EngineClient):
    """Consumes from AMQP 1.0 addresses with a bounded credit window.

    Implements :class:`msgsafe.ports.Receiver`. Each subscription is a receiver link
    (at-least-once, settled by the application) with ``credit`` outstanding at most:
    credit is only topped up as deliveries are settled (for one given back, with
    ``nack()`` or ``release()``, at the application's next receive, so that a consumer
    stopping does not get it straight back), so the window bounds memory whatever the
    application's pace. ``ack`` -> ``accepted``,
    ``nack()`` -> ``modified`` with delivery-failed (redelivered, its delivery-count
    raised; ``released`` on RabbitMQ, which marks redeliveries by first-acquirer),
    ``nack(requeue=False)`` -> ``rejected``, ``release()`` -> ``released`` (redelivered
    with its delivery-count as it was: the message was not tried). Deliveries received
    and not handed out when the receiver closes are released too, so prefetching counts
    no attempt.

    After a fail-over every subscription is attached again on the new connection.
    Deliveries received on the lost connection are not settled there any more; their
    ``ack`` is a no-op and the broker redelivers them (same ``message_id``, so a
    consumer using ``dedup`` drops the repeat). A delivery is never acknowledged twice.
    """

    def __init__(self, url: BrokerUrl, options: Amqp10Options, *, group: str | None) -> None:
        self._group = group
        self._closed = False
        self._subs = Subscriptions()
        self._engine = Engine(url, options, self._subs, role="receiver")

    def subscribe(self, destination: str) -> None:
        """Start consuming from the AMQP address ``destination``."""
        if self._closed:
            raise ClosedError("the receiver is closed", endpoint=self.target)
        if not isinstance(destination, str) or not destination:
            raise ConfigurationError("destination must be a non-empty address")
        self._subs.subscribe(destination)

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds."""
        if self._closed:
            raise ClosedError("the receiver is closed", endpoint=self.target)
        if max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        return self._subs.take(max_messages, timeout)

    @property
    def waiting(self) -> int:
        """Deliveries received (within the credit window) and not handed out yet: what
        :meth:`close` would release."""
        return self._subs.waiting()

    def close(self, timeout: float | None = None) -> None:
        """Stop consuming; deliveries not yet handed out are released to the broker."""
        if self._closed:
            return
        self._closed = True
        self._engine.shutdown(timeout)

    def __enter__(self) -> Amqp10Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Amqp10Receiver({self.target!r})"


@dataclass(eq=False, slots=True)
class _Subscription:
    address: str
    link: Any = None


class Subscriptions:
    """The subscriptions of one receiver and their inbox: the :class:`~msgsafe.adapters.
    amqp10._connection.Side` of a receiving engine.

    ``subscribe`` and ``take`` are called from any thread; the rest runs on the engine's
    container thread.
    """

    #: The engine whose connection the links are attached on (set by :meth:`bind`).
    engine: Engine

    def __init__(self) -> None:
        #: Deliveries received and not yet handed out, with their connection generation.
        self._inbox: collections.deque[tuple[int, Delivery]] = collections.deque()
        self._inbox_lock = threading.Condition()
        # container thread only
        self._subs: dict[str, _Subscription] = {}
        #: Proton deliveries handed out and not settled yet, by the number their
        #: Delivery holds (see the module docstring: released on this thread only).
        self._unsettled: dict[int, Any] = {}
        self._numbers = itertools.count(1)
        #: Links owed a credit for each delivery given back (released or requeued),
        #: repaid when the application next takes (see :meth:`_settle`).
        self._owed: list[Any] = []
        #: Whether _owed has any: read on the application's thread (a stale answer only
        #: delays the repayment to the next take).
        self._owing = False

    # --- any thread ----------------------------------------------------------------------

    def subscribe(self, address: str) -> None:
        """Consume from ``address`` now and after every fail-over."""

        def add() -> None:
            if address in self._subs:
                return
            sub = _Subscription(address)
            self._subs[address] = sub
            if self.engine.opened:
                self._attach(sub)

        if not self.engine.call(add):
            raise ClosedError("the receiver is closed", endpoint=self.engine.target)

    def waiting(self) -> int:
        """How many received deliveries wait to be handed out."""
        with self._inbox_lock:
            return len(self._inbox)

    def take(self, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` received deliveries, waiting at most ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._owing:
            self._owing = False
            self.engine.call(self._repay)
        with self._inbox_lock:
            while not self._inbox:
                if self.engine.stopped:
                    raise ClosedError("the receiver is closed", endpoint=self.engine.target)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._inbox_lock.wait(remaining if remaining is not None else 0.5)
            batch: list[Delivery] = []
            while self._inbox and len(batch) < max_messages:
                batch.append(self._inbox.popleft()[1])
            return batch

    # --- the Side protocol (container thread) -------------------------------------------

    def bind(self, engine: Engine) -> None:
        self.engine = engine

    def opened(self) -> None:
        for sub in self._subs.values():
            self._attach(sub)

    def lost(self) -> int:
        for sub in self._subs.values():
            sub.link = None
        self._owed.clear()  # the next links get their whole credit
        # Their link is gone: settling them is a no-op from now on.
        self._unsettled.clear()
        # Not yet handed out and unsettleable now: the broker redelivers them anyway.
        generation = self.engine.generation
        with self._inbox_lock:
            kept = [(g, d) for g, d in self._inbox if g > generation]
            self._inbox = collections.deque(kept)
        return 0

    def woken(self) -> None:
        pass  # subscriptions and settlements arrive as commands

    def delivery(self, dlv: Any) -> None:
        if dlv.aborted:
            dlv.settle()
        elif dlv.readable and not dlv.partial:
            self._received(dlv)

    def flow(self, link: Any) -> None:
        pass  # a receiver gives credit; it does not get any

    def detached(self, link: Any, condition: Any) -> None:
        for sub in self._subs.values():
            if sub.link == link:
                sub.link = None
                # NOTE: RabbitMQ detaches consumers of a deleted queue; re-attach after a
                # pause rather than spin.
                self.engine.schedule(
                    self.engine.options.reconnect_maximum, self._reattach_later(sub)
                )

    def tick(self, now: float) -> None:
        pass  # deliveries have no deadline here: the application settles them

    def fail_all(self, error: MsgsafeError) -> None:
        pass  # nothing waits on the broker; receive() keeps returning what arrived

    def closing(self) -> None:
        """Release the deliveries not handed out yet (their settlement commands run next):
        ``released``, not ``modified``, as they were never tried (a broker that counts
        deliveries would count each one as a failure)."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
        generation = self.engine.generation
        for item_generation, delivery in items:
            if item_generation == generation and delivery.settled is None:
                delivery.release()

    def stopped(self) -> None:
        self._unsettled.clear()
        with self._inbox_lock:
            self._inbox_lock.notify_all()

    # --- links and deliveries ------------------------------------------------------------

    def _attach(self, sub: _Subscription) -> None:
        engine = self.engine
        link = engine.open_receiver(sub.address)
        link.flow(engine.options.credit)
        sub.link = link

    def _reattach_later(self, sub: _Subscription) -> Callable[[], None]:
        engine = self.engine
        generation = engine.generation

        def reattach() -> None:
            if generation == engine.generation and engine.opened and sub.link is None:
                self._attach(sub)

        return reattach

    def _received(self, dlv: Any) -> None:
        link = dlv.link
        message = Message()
        message.decode(link.recv(dlv.pending))
        link.advance()
        if not link.state & link.LOCAL_ACTIVE:
            # Arrived while we close the link: give it back at once.
            dlv.update(ProtonDelivery.RELEASED)
            dlv.settle()
            return
        engine = self.engine
        generation = engine.generation
        message_id, key, headers, body = read_message(message)
        number = next(self._numbers)
        self._unsettled[number] = dlv

        def settle(outcome: Outcome) -> None:
            # Holds the number, not ``dlv``: the application drops this Delivery on its
            # own thread, where releasing a proton object would race the container.
            engine.call(lambda: self._settle(generation, number, outcome))

        delivery = Delivery(
            body=body,
            destination=link.source.address or "",
            message_id=message_id,
            settle=settle,
            key=key,
            headers=headers,
            # NOTE: RabbitMQ's AMQP 1.0 plugin marks a redelivery by clearing
            # first-acquirer and leaves delivery-count at 0; Artemis and Broker-J count
            # and never set first-acquirer (its default is false, on every delivery).
            redelivered=bool(message.delivery_count)
            or (engine.first_acquirer_marks and not message.first_acquirer),
            # NOTE: where the broker marks redeliveries by first-acquirer instead of
            # counting (RabbitMQ's plugin), a count of 0 says nothing: the consumer counts.
            attempt=message.delivery_count + 1
            if message.delivery_count or not engine.first_acquirer_marks
            else None,
        )
        with self._inbox_lock:
            self._inbox.append((generation, delivery))
            self._inbox_lock.notify()

    def _settle(self, generation: int, number: int, outcome: Outcome) -> None:
        engine = self.engine
        dlv = self._unsettled.pop(number, None)
        if dlv is None or generation != engine.generation or not engine.opened:
            # NOTE: the link this came on is gone; the broker redelivers what was never
            # settled, so the ack becomes a no-op instead of a second acknowledgement.
            log.debug("settle after fail-over ignored; the broker redelivers it")
            return
        if outcome is Outcome.REQUEUE and not engine.first_acquirer_marks:
            # NOTE: "released" leaves delivery-count as it was, so Artemis and Broker-J
            # (which mark a redelivery only by counting) would hand the message out again
            # as a first delivery; "modified" with delivery-failed counts it. RabbitMQ's
            # plugin marks redeliveries by first-acquirer and keeps "released".
            dlv.local.failed = True
            dlv.update(ProtonDelivery.MODIFIED)
        else:
            dlv.update(_SETTLE[outcome])
        dlv.settle()
        link = dlv.link
        if outcome is Outcome.RELEASE or outcome is Outcome.REQUEUE:
            # NOTE: a delivery given back is the broker's to hand out again, to this
            # link first: credit now would bring it straight back, and while run() stops
            # (it gives back what never started, then closes) it would arrive during the
            # close, unsettled when the connection ends, and Broker-J would count an
            # attempt for it. The credit is repaid when the application takes again.
            self._owed.append(link)
            self._owing = True
        elif link.state & link.LOCAL_ACTIVE and not engine.closing:
            # NOTE: no credit once the receiver closes: what it would bring in arrives
            # after the give-backs, unsettled when the connection ends.
            link.flow(1)

    def _repay(self) -> None:
        """Give back the credit of the deliveries given back, on links still attached."""
        engine = self.engine
        owed, self._owed = self._owed, []
        if engine.closing:
            return
        for link in owed:  # a lost connection's links were dropped from _owed (lost())
            if link.state & link.LOCAL_ACTIVE:
                link.flow(1)
