"""The publishing half of ``memory://NAME``: the same contract as the network transports,
with the broker's faults (see :mod:`msgsafe.adapters.memory.broker`)."""

from __future__ import annotations

from concurrent.futures import Future

from msgsafe.adapters._config import size_error
from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged
from msgsafe.adapters.memory._connection import LateConfirms, log
from msgsafe.adapters.memory._errors import at_endpoint
from msgsafe.adapters.memory.broker import MemoryBroker
from msgsafe.adapters.memory.config import MemoryOptions
from msgsafe.errors import ClosedError, ConfirmTimeout, MsgsafeError
from msgsafe.message import Envelope
from msgsafe.ports import PublishCallback, PublishFuture, TransportCapabilities

__all__ = ["MemoryTransport"]


class MemoryTransport:
    """Publishes into a :class:`MemoryBroker`. Thread-safe."""

    #: publish_callback (a CallbackTransport); no batch seam, no linger, and no null
    #: body: a message in the memory broker has bytes, as on RabbitMQ (msgsafe.ports).
    capabilities = TransportCapabilities(callback=True)

    def __init__(self, broker: MemoryBroker, options: MemoryOptions, target: str) -> None:
        self._broker = broker
        self._options = options
        self._target = target
        self._size_limit = options.size_limit
        self._closed = False
        self._late = LateConfirms()

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
                log,
                PUBLISH_CALLBACK,
                callback,
                ClosedError("transport is closed", message_id=envelope.message_id),
            )
            return
        too_large = size_error(envelope, self._size_limit, self._target)
        if too_large is not None:
            call_logged(log, PUBLISH_CALLBACK, callback, too_large)
            return
        try:
            self._broker.accept(envelope)
        except MsgsafeError as exc:
            call_logged(log, PUBLISH_CALLBACK, callback, at_endpoint(exc, self._target))
            return
        delay = self._broker.confirm_delay
        if delay <= 0:
            call_logged(log, PUBLISH_CALLBACK, callback, None)
        elif delay >= self._options.confirm_timeout:
            # The broker holds it but the confirm will come too late: a possible duplicate.
            self._late.later(
                self._options.confirm_timeout,
                callback,
                ConfirmTimeout(
                    f"no confirm within {self._options.confirm_timeout}s",
                    endpoint=self._target,
                    message_id=envelope.message_id,
                ),
            )
        else:
            self._late.later(delay, callback, None)

    def close(self, timeout: float | None = None) -> None:
        self._closed = True
        self._late.join(timeout)

    def __repr__(self) -> str:
        return f"MemoryTransport(target={self._target!r})"
