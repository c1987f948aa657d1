"""The AMQP 1.0 consuming receiver (python-qpid-proton)."""

from __future__ import annotations

from msgsafe.adapters.amqp10._engine import Engine
from msgsafe.adapters.amqp10.config import Amqp10Options
from msgsafe.endpoints import BrokerUrl, Endpoint
from msgsafe.errors import ClosedError, ConfigurationError
from msgsafe.message import Delivery

__all__ = ["Amqp10Receiver"]


class Amqp10Receiver:
    """Consumes from AMQP 1.0 addresses with a bounded credit window.

    Implements :class:`msgsafe.ports.Receiver`. Each subscription is a receiver link
    (at-least-once, settled by the application) with ``credit`` outstanding at most:
    credit is only topped up as deliveries are settled, so the window bounds
    memory whatever the application's pace. ``ack`` -> ``accepted``,
    ``nack()`` -> ``released`` (redelivered), ``nack(requeue=False)`` -> ``rejected``.

    After a fail-over every subscription is attached again on the new connection.
    Deliveries received on the lost connection are not settled there any more; their
    ``ack`` is a no-op and the broker redelivers them (same ``message_id``, so a
    consumer using ``dedup`` drops the repeat). A delivery is never acknowledged twice.
    """

    def __init__(self, url: BrokerUrl, options: Amqp10Options, *, group: str | None) -> None:
        self._group = group
        self._closed = False
        self._engine = Engine(url, options, role="receiver")

    @property
    def target(self) -> str:
        """The redacted URL this receiver consumes from (no credentials)."""
        return self._engine.target

    @property
    def history(self) -> tuple[Endpoint, ...]:
        """The endpoints this receiver connected to, in order (newest last)."""
        return tuple(self._engine.history)

    def wait_connected(self, timeout: float) -> bool:
        """True once a connection is open."""
        return self._engine.connected.wait(timeout)

    def subscribe(self, destination: str) -> None:
        """Start consuming from the AMQP address ``destination``."""
        if self._closed:
            raise ClosedError("the receiver is closed", endpoint=self.target)
        if not isinstance(destination, str) or not destination:
            raise ConfigurationError("destination must be a non-empty address")
        self._engine.subscribe(destination)

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` deliveries, waiting at most ``timeout`` seconds."""
        if self._closed:
            raise ClosedError("the receiver is closed", endpoint=self.target)
        if max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        return self._engine.take(max_messages, timeout)

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
