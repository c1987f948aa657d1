"""``pika`` with msgsafe's :class:`BlockingConnection`; every other name is the original.

``from msgsafe.compat import pika`` in place of ``import pika`` is the whole migration:
``pika.ConnectionParameters``, ``pika.BasicProperties``, ``pika.exceptions`` ... are
pika's own, ``pika.BlockingConnection`` publishes through msgsafe.
"""

from __future__ import annotations

# NOTE: absolute imports of the real library: this module shares its last name with it.
from pika import (
    BasicProperties,
    ConnectionParameters,
    DeliveryMode,
    PlainCredentials,
    SSLOptions,
    URLParameters,
    adapters,
    channel,
    connection,
    credentials,
    exceptions,
    spec,
)
from pika.exchange_type import ExchangeType

from msgsafe.sdk.compat.pika import BlockingChannel, BlockingConnection

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
