"""The blocking publish on the caller's thread: pika's own confirm round trip (the pika
drop-in's fast path, :mod:`msgsafe.fastpath`).

pika in confirm mode publishes on the calling thread and waits there for the broker's
confirm. The wrapper does the same while it can: on the thread that owns its real pika
connection, a blocking ``basic_publish`` goes to a dedicated real channel in confirm mode,
``mandatory``, with the properties msgsafe's RabbitMQ adapter would publish (persistent,
msgsafe's id in ``message_id``, the send time as ``timestamp`` where none was set). A
confirm means the broker has the message: the promise holds and nothing else is done.

Anything else (the connection or channel lost, a nack, a return, a channel error) and the
message goes to msgsafe's producer instead, which decides what the caller sees (fail-over
to the next host, the outbox, pika's exception): the same outcome as without this path,
one round trip later. A message whose confirm was lost with the connection may then reach
the broker twice, with the same ``message_id``. After a failure other than a return, the
fast path rests until msgsafe confirms a message again with nothing left in its outbox
(:class:`~msgsafe.fastpath.FastPath`), so a broker outage costs no reconnect attempt per
publish and no publish overtakes one the outbox still holds.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from pika import exceptions as pe
from pika.spec import BasicProperties

from msgsafe.fastpath import FastPath

if TYPE_CHECKING:
    from msgsafe.compat.pika._connection import BlockingConnection

__all__ = ["FastPublisher", "fast_properties"]

log = logging.getLogger("msgsafe.compat.pika")


def fast_properties(props: BasicProperties, message_id: str, sent_at: float) -> BasicProperties:
    """``props`` as msgsafe's RabbitMQ adapter publishes a pika publisher's properties
    (``carried_properties`` there): persistent, ``message_id`` set, ``timestamp`` the send
    time where ``props`` has none; the headers as given."""
    out = BasicProperties.__new__(BasicProperties)
    out.__dict__.update(props.__dict__)  # a shallow copy, cheaper than copy.copy
    out.delivery_mode = 2
    out.message_id = message_id
    if out.timestamp is None:
        out.timestamp = int(sent_at)
    return out


class FastPublisher:
    """One wrapper channel's fast path (see the module docstring)."""

    def __init__(self, connection: BlockingConnection, *, resting: bool = False) -> None:
        self._conn = connection
        self._channel: Any = None  # a real pika channel in confirm mode
        #: The fast path's state.
        self.path = FastPath(connection.producer, resting=resting)

    def publish(self, exchange: str, routing_key: str, body: bytes, props: BasicProperties) -> bool:
        """Publish ``body`` and wait for the broker's confirm; True when confirmed. False
        when it was not sent this way or not confirmed: msgsafe's producer takes over."""
        owner = self._conn._real_thread
        path = self.path
        if path.resting or (owner is not None and owner != threading.get_ident()):
            return False
        try:
            channel = self._channel
            if channel is None or not channel.is_open:
                channel = self._conn._real_connection().channel()
                channel.confirm_delivery()
                self._channel = channel
            channel.basic_publish(exchange, routing_key, body, props, mandatory=True)
        except pe.UnroutableError:
            path.refused()
            return False  # this message only: msgsafe's path reports the return
        except (pe.AMQPError, OSError) as exc:
            log.debug("fast publish failed (%r); msgsafe's producer takes over", exc)
            self._channel = None
            path.failed()
            return False
        path.confirmed()
        return True

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:
            try:
                channel.close()
            except (pe.AMQPError, OSError) as exc:  # closing anyway: nothing is in flight
                log.debug("closing the fast path's channel: %r", exc)
