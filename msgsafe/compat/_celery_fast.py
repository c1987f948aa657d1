"""The task publish on the caller's thread: a confirmed pika publish while the broker takes it
(the celery drop-in's fast path, :mod:`msgsafe.fastpath`).

Celery with ``confirm_publish`` publishes on the calling thread and waits there for the
broker's confirm. The wrapper does the same while it can: each thread that publishes
tasks has a real pika connection of its own (opened on its first task, with the
transport's parameters) and a channel in confirm mode, and the task message goes out
``mandatory``, with the properties msgsafe's RabbitMQ adapter would publish (persistent,
the task id as ``message_id``, the send time as ``timestamp`` where none was set;
:func:`msgsafe.compat.pika._fast.fast_properties`). A confirm means the broker has
the message: the promise holds and nothing else is done.

Only a destination msgsafe's check admitted goes this way (checked once, as the producer
checks before its first send there). Anything else (a return, a nack, the connection
lost or blocked past ``confirm_timeout``) and the task goes through msgsafe's producer
instead, which decides what the caller sees (fail-over, the outbox): the same outcome
as without this path, one round trip later. A message whose confirm was lost with the
connection may then reach the broker twice, with the same ``message_id`` (the task id).
After a failure other than a return, the fast path rests until msgsafe confirms a task
again with nothing left in its outbox (:class:`~msgsafe.fastpath.FastPath`), so an
outage costs no reconnect attempt per task and no task overtakes one the outbox still
holds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from pika import exceptions as pe

from msgsafe.adapters.rabbitmq import open_blocking_connection
from msgsafe.compat._celery_message import TaskMessage
from msgsafe.compat.pika._fast import fast_properties
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError, TransientError
from msgsafe.fastpath import FastPath
from msgsafe.message import Envelope, Receipt, Status, new_receipt
from msgsafe.producer import Producer

__all__ = ["FastTaskPublisher"]

log = logging.getLogger("msgsafe.compat.celery")


class FastTaskPublisher:
    """One process's fast path for an app's tasks (see the module docstring)."""

    def __init__(self, url: str, producer: Producer, *, blocked_timeout: float) -> None:
        # NOTE: the first task goes through msgsafe's producer: a broker that does not
        # answer then costs one connect timeout, not two; its confirm starts this path.
        #: The fast path's state (resting until a first confirm of msgsafe's producer).
        self.path = FastPath(producer, resting=True)
        self._url = parse_url(url)
        # NOTE: a memory alarm blocks a connection without closing it, and a publish that
        # raced the connection.blocked frame waits for its confirm until pika drops the
        # connection: blocked_timeout, well within msgsafe's own confirm wait.
        self._options = {"blocked_timeout": blocked_timeout}
        self._local = threading.local()
        self._opened: list[Any] = []  # every thread's connection, closed by close()
        self._lock = threading.Lock()

    def publish(self, message: TaskMessage, envelope: Envelope) -> Receipt | None:
        """Publish and wait for the broker's confirm; a CONFIRMED receipt when it came.
        None when the task was not sent this way or not confirmed: msgsafe's producer
        takes over."""
        path = self.path
        if path.resting:
            return None
        destination = envelope.destination
        try:
            guarantee = path.guarantee(destination)
        except TransientError:
            path.failed()
            return None
        except MsgsafeError:
            path.refused()
            return None  # refused: msgsafe's path raises it
        props = fast_properties(message.properties, envelope.message_id, time.time())
        local = self._local
        try:
            channel = self._channel()
            # A connection.blocked (a memory or disk alarm) pika read during an earlier
            # publish. One that came while the connection was idle is read during this
            # publish's wait, which then ends after blocked_timeout at most.
            if local.blocked:
                path.failed()
                return None
            channel.basic_publish(
                message.exchange, message.routing_key, message.body, props, mandatory=True
            )
        except pe.UnroutableError:
            path.refused()
            return None  # this task only: msgsafe's path keeps it in the outbox
        except (pe.AMQPError, OSError, MsgsafeError) as exc:
            log.debug("fast publish failed (%r); msgsafe's producer takes over", exc)
            path.failed()
            self._drop()
            return None
        path.confirmed()
        return new_receipt(envelope.message_id, Status.CONFIRMED, destination, guarantee)

    def _channel(self) -> Any:
        local = self._local
        channel = getattr(local, "channel", None)
        if channel is not None and channel.is_open:
            return channel
        connection = getattr(local, "connection", None)
        if connection is None or not connection.is_open:
            connection = open_blocking_connection(self._url, self._options)
            local.connection = connection
            local.blocked = False
            connection.add_on_connection_blocked_callback(
                lambda *_: setattr(local, "blocked", True)
            )
            connection.add_on_connection_unblocked_callback(
                lambda *_: setattr(local, "blocked", False)
            )
            with self._lock:
                self._opened.append(connection)
        channel = connection.channel()
        channel.confirm_delivery()
        local.channel = channel
        return channel

    def _drop(self) -> None:
        """Forget this thread's connection (closed if it still is open)."""
        local = self._local
        connection = getattr(local, "connection", None)
        local.connection = local.channel = None
        if connection is not None:
            with self._lock:
                if connection in self._opened:
                    self._opened.remove(connection)
            _close_quietly(connection)

    def close(self) -> None:
        """Close every thread's connection (nothing is in flight: a publish waits for its
        confirm). A connection belongs to its thread; closing it from here is safe once
        no task is being published."""
        with self._lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            _close_quietly(connection)


def _close_quietly(connection: Any) -> None:
    if connection.is_open:
        with contextlib.suppress(pe.AMQPError, OSError):
            connection.close()
