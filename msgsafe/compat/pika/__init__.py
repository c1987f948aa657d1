"""``pika`` with msgsafe's ``BlockingConnection``; every other name is pika's own.

``from msgsafe.compat import pika`` (or ``import msgsafe.compat.pika as pika``) in place
of ``import pika`` is the whole migration: ``pika.ConnectionParameters``,
``pika.BasicProperties``, ``pika.exceptions`` ... are pika's, ``pika.BlockingConnection``
publishes through msgsafe. ``msgsafe.compat.pika.exceptions`` re-exports pika's exception
classes, so ``from msgsafe.compat.pika import exceptions`` works as well.

``BlockingConnection(parameters)`` takes the same ``ConnectionParameters`` /
``URLParameters`` (or a list of them: the hosts to fail over across). ``URLParameters``
here is pika's, which also reads msgsafe's multi-host URL (``amqp://u:p@h1:5672,h2:5673/
%2F``, what ``msgsafe cluster up rabbitmq`` prints; pika's own says "Port could not be
cast to integer"): it is the first host's parameters, the others its ``fail_over``,
tried in order as a list's;
``channel()`` returns a ``BlockingChannel`` (a subclass of pika's) whose
``basic_publish`` goes through msgsafe: persistent, ``mandatory``, publisher confirms,
fail-over to the next host, and the durable outbox when no broker can take the message.
Every ``BasicProperties`` field and header value is carried as pika would send it.
Declares, binds, QoS and consuming run unchanged on a real pika connection to the same
hosts.

What changes for the caller (``docs/migration.md`` has the full list):

- ``basic_publish`` returns once the message is confirmed *or stored in the outbox*: a
  message no broker can take now is stored and forwarded later, with no exception;
- ``UnroutableError`` / ``NackError`` are raised for that message, as pika does in
  confirm mode; ``BlockingConnection(..., pipelined=True)`` opts into returning at once
  and raising failures from a later call;
- ``delivery_mode`` is always persistent and ``mandatory`` always on.

NOTE: the modules of this package are named like pika's; ``import pika`` inside them is
an absolute import and finds the real pika.
"""

from __future__ import annotations

from msgsafe.errors import MissingExtra

try:
    from pika import (
        BasicProperties,
        ConnectionParameters,
        DeliveryMode,
        PlainCredentials,
        SSLOptions,
        adapters,
        channel,
        connection,
        credentials,
        spec,
    )
    from pika.exchange_type import ExchangeType
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.compat.pika import exceptions
from msgsafe.compat.pika._channel import BlockingChannel
from msgsafe.compat.pika._connection import BlockingConnection
from msgsafe.compat.pika._url import URLParameters

__all__ = [
    "BasicProperties",
    "BlockingChannel",
    "BlockingConnection",
    "ConnectionParameters",
    "DeliveryMode",
    "ExchangeType",
    "PlainCredentials",
    "SSLOptions",
    "URLParameters",
    "adapters",
    "channel",
    "connection",
    "credentials",
    "exceptions",
    "spec",
]

# The public home of the two classes (reprs, docs, pickling by name).
BlockingConnection.__module__ = __name__
BlockingChannel.__module__ = __name__
URLParameters.__module__ = __name__
