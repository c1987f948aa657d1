"""Transport and receiver of ``memory://NAME``: the same contract as the network
adapters, with the broker's faults (see :mod:`msgsafe.adapters.memory.broker`)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from msgsafe.adapters._reports import call_logged
from msgsafe.adapters.memory.broker import Leased, MemoryBroker
from msgsafe.adapters.memory.config import MemoryOptions
from msgsafe.errors import ClosedError, ConfirmTimeout, MsgsafeError
from msgsafe.message import MESSAGE_ID_HEADER, Delivery, Envelope, Outcome
from msgsafe.ports import PublishCallback, PublishFuture

__all__ = ["MemoryReceiver", "MemoryTransport"]


class MemoryTransport:
    """Publishes into a :class:`MemoryBroker`. Thread-safe."""

    def __init__(self, broker: MemoryBroker, options: MemoryOptions, target: str) -> None:
        self._broker = broker
        self._options = options
        self._target = target
        self._closed = False
        self._lock = threading.Lock()
        self._timers: set[threading.Timer] = set()

    @property
    def target(self) -> str:
        return self._target

    def publish(self, envelope: Envelope) -> Future[None]:
        future = PublishFuture()
        self.publish_callback(envelope, future)
        return future

    def publish_callback(self, envelope: Envelope, callback: PublishCallback) -> None:
        if self._closed:
            call_logged(
                callback, ClosedError("transport is closed", message_id=envelope.message_id)
            )
            return
        too_large = self._options.size_error(envelope, endpoint=self._target)
        if too_large is not None:
            call_logged(callback, too_large)
            return
        try:
            self._broker.accept(envelope)
        except MsgsafeError as exc:
            exc.endpoint = exc.endpoint or self._target
            call_logged(callback, exc)
            return
        delay = self._broker.confirm_delay
        if delay <= 0:
            call_logged(callback, None)
        elif delay >= self._options.confirm_timeout:
            # The broker holds it but the confirm will come too late: a possible duplicate.
            self._later(
                self._options.confirm_timeout,
                callback,
                ConfirmTimeout(
                    f"no confirm within {self._options.confirm_timeout}s",
                    endpoint=self._target,
                    message_id=envelope.message_id,
                ),
            )
        else:
            self._later(delay, callback, None)

    def _later(self, delay: float, callback: PublishCallback, error: MsgsafeError | None) -> None:
        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
            call_logged(callback, error)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            self._closed = True
            timers = list(self._timers)
        for timer in timers:
            timer.join(timeout)

    def __repr__(self) -> str:
        return f"MemoryTransport(target={self._target!r})"


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
        env = item.envelope

        def settle(outcome: Outcome) -> None:
            self._broker.settle(item, requeue=outcome is Outcome.REQUEUE)

        headers = dict(env.headers)
        headers[MESSAGE_ID_HEADER] = env.message_id
        return Delivery(
            body=env.body,
            destination=item.destination,
            message_id=env.message_id,
            key=env.key,
            headers=headers,
            redelivered=item.redelivered,
            settle=settle,
        )

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._broker.release_receiver(self._id)
        self._broker.wake()
