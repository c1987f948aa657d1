"""The blocking send on the caller's thread: proton's own round trip to ``accepted``
(the proton drop-in's fast path, :mod:`msgsafe.fastpath`).

``proton.utils.BlockingSender.send`` writes the message and waits on the calling thread
until the broker settles it. The wrapper does the same while it can: on the thread that
made the wrapper connection, a message goes out over a real proton connection of the
fast path's own (opened on the first send), on a sender link to the same address,
shaped as msgsafe's AMQP 1.0 adapter sends it (durable, msgsafe's id as ``message-id``
and ``msgsafe-id``, the application properties as text, one data section), with the
adapter's link options (at-least-once, the ``queue`` capability). An ``accepted``
outcome means the broker has the message: the promise holds and nothing else is done.

Only an address msgsafe's destination check admitted goes this way (the producer checks
it once, as it would before its own first send there). Anything else (no answer within
half the send's time, the link or connection lost, an outcome other than ``accepted``)
and the message goes to msgsafe's producer instead, which decides what the caller sees
(fail-over, the outbox, proton's exception): the same outcome as without this path, one
round trip later. A message whose outcome was lost with the connection may then reach
the broker twice, with the same id. After a failure the fast path rests until msgsafe
confirms a message again with nothing left in its outbox
(:class:`~msgsafe.fastpath.FastPath`), so a broker outage costs no reconnect attempt per
send and no message overtakes one the outbox still holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Delivery, ProtonException

from msgsafe.adapters.amqp10 import link_options, wire_message
from msgsafe.errors import MsgsafeError
from msgsafe.fastpath import FastPath
from msgsafe.message import Envelope, Receipt, Status, new_receipt

if TYPE_CHECKING:
    from msgsafe.producer import Producer

__all__ = ["FastSender"]

log = logging.getLogger("msgsafe.compat.proton")

#: Share of a send's time the fast path may wait for the outcome: the rest is
#: msgsafe's, to fail over or store the message.
_FAST_SHARE = 0.5


class FastSender:
    """A wrapper connection's fast path (see the module docstring): its own real
    proton connection, opened on first use by the thread that made the wrapper, with one
    link per address."""

    def __init__(self, open_connection: Callable[[], Any], producer: Producer) -> None:
        #: The fast path's state.
        self.path = FastPath(producer)
        self._open = open_connection
        self._owner = threading.get_ident()
        self._conn: Any = None  # a real proton.utils.BlockingConnection
        self._links: dict[str, Any] = {}  # address -> real proton BlockingSender
        self._tags = 0

    def send(self, envelope: Envelope, timeout: float | None) -> Receipt | None:
        """Send ``envelope`` and wait for its outcome; a CONFIRMED receipt when the broker
        accepted it. None when it was not sent this way or not accepted: msgsafe's
        producer takes over."""
        path = self.path
        if path.resting or self._owner != threading.get_ident():
            return None
        destination = envelope.destination
        try:
            guarantee = path.guarantee(destination)
            conn = self._conn
            if conn is None:
                conn = self._conn = self._open()
            link = self._links.get(destination)
            if link is None:
                link = conn.create_sender(destination, options=link_options())
                self._links[destination] = link
            self._tags += 1
            proton_link = link.link
            delivery = proton_link.delivery(str(self._tags))
            proton_link.stream(wire_message(envelope))
            proton_link.advance()
            limit = None if timeout is None else max(0.001, timeout * _FAST_SHARE)
            conn.wait(lambda: delivery.settled, timeout=limit)
        except MsgsafeError:
            path.refused()
            return None  # the check refused or could not run: msgsafe's path says so
        except ProtonException as exc:
            log.debug("fast send failed (%r); msgsafe's producer takes over", exc)
            path.failed()
            self.close()
            return None
        state = delivery.remote_state
        delivery.settle()
        if state != Delivery.ACCEPTED:
            path.refused()
            return None  # released, modified or rejected: msgsafe's path decides
        path.confirmed()
        return new_receipt(envelope.message_id, Status.CONFIRMED, destination, guarantee)

    def close(self) -> None:
        """Close the fast path's connection (nothing is in flight: a send waits for its outcome)."""
        conn, self._conn, self._links = self._conn, None, {}
        if conn is not None:
            try:
                conn.close()
            except ProtonException as exc:  # the peer may be gone: closing anyway
                log.debug("closing the fast path's connection: %r", exc)
