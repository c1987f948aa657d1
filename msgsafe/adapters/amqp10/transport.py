"""The AMQP 1.0 publishing transport (python-qpid-proton)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from msgsafe.adapters.amqp10._engine import Engine
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl, Endpoint
from msgsafe.errors import ClosedError, Refused
from msgsafe.message import Envelope

__all__ = ["Amqp10Transport"]


class Amqp10Transport:
    """Publishes durable messages over AMQP 1.0 with unsettled sends (at-least-once).

    Implements :class:`msgsafe.ports.Transport`. Each envelope is sent as a durable
    message with ``message-id`` = ``envelope.message_id`` and the application properties
    ``msgsafe-id`` (the same id) and ``msgsafe-key`` (the key, binary) next to the
    envelope's headers. Outcomes map as:

    - ``accepted`` -> the future resolves (CONFIRMED);
    - ``rejected`` -> :class:`~msgsafe.errors.Rejected` with the broker's condition
      (permanent);
    - ``released`` / ``modified`` -> :class:`~msgsafe.errors.Refused` (transient);
    - link detached after sending -> :class:`~msgsafe.errors.ConnectionLost`;
    - no outcome within ``confirm_timeout`` -> :class:`~msgsafe.errors.ConfirmTimeout`
      (or ``ConnectionLost`` / ``ConnectError`` when no connection held).

    A lost connection is not an error by itself: the transport fails over to the next
    candidate (URL hosts and the broker's ``failover-server-list``) and resends every
    unsettled envelope with its id; only the deadline fails a future.
    ``max_in_flight`` bounds unresolved sends: ``publish`` waits for room up to
    ``confirm_timeout`` and then fails the future with ``Refused``.
    """

    def __init__(self, url: BrokerUrl, options: Amqp10Options) -> None:
        self._url = url
        self._options = options
        self._limit = options.max_in_flight
        # Wake a blocked publish only when a quarter of the window is free again: one
        # wake-up per burst instead of one per confirm.
        self._low_water = max(0, options.max_in_flight - max(1, options.max_in_flight // 4))
        self._in_flight = 0
        self._waiting = 0
        self._room = threading.Condition(threading.Lock())
        self._closed = False
        self._engine = Engine(url, options, role="sender")

    @property
    def target(self) -> str:
        """The redacted URL this transport publishes to (no credentials)."""
        return self._engine.target

    @property
    def history(self) -> tuple[Endpoint, ...]:
        """The endpoints this transport connected to, in order (newest last)."""
        return tuple(self._engine.history)

    def wait_connected(self, timeout: float) -> bool:
        """True once a connection is open (for start-up checks and tests)."""
        return self._engine.connected.wait(timeout)

    def publish(self, envelope: Envelope) -> Future[None]:
        """Send ``envelope``; the future resolves when the broker accepted it."""
        future: Future[None] = Future()
        if self._closed:
            future.set_exception(
                ClosedError(
                    "the transport is closed", endpoint=self.target, message_id=envelope.message_id
                )
            )
            return future
        too_large = self._options.size_error(envelope, endpoint=self.target)
        if too_large is not None:
            future.set_exception(too_large)
            return future
        # One deadline from the call: waiting for room spends the same confirm_timeout.
        deadline = time.monotonic() + self._options.confirm_timeout
        if not self._acquire(deadline):
            future.set_exception(
                Refused(
                    f"{self._options.max_in_flight} messages in flight for "
                    f"{self._options.confirm_timeout}s: the broker is not confirming",
                    endpoint=self.target,
                    message_id=envelope.message_id,
                )
            )
            return future
        future.add_done_callback(self._done)
        self._engine.publish(envelope, future, deadline)
        return future

    def _acquire(self, deadline: float) -> bool:
        with self._room:
            if self._in_flight >= self._limit:
                self._waiting += 1
                try:
                    if not self._room.wait_for(
                        lambda: self._in_flight < self._limit, deadline - time.monotonic()
                    ):
                        return False
                finally:
                    self._waiting -= 1
            self._in_flight += 1
            return True

    def _done(self, future: Future[None]) -> None:
        with self._room:
            self._in_flight -= 1
            if self._waiting and self._in_flight <= self._low_water:
                self._room.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for outstanding outcomes, then fail the rest and disconnect."""
        if self._closed:
            return
        self._closed = True
        self._engine.wait_idle(timeout)
        self._engine.shutdown(timeout)

    def __enter__(self) -> Amqp10Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Amqp10Transport({self.target!r})"
