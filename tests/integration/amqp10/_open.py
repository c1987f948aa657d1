"""The AMQP 1.0 adapter's transport and receiver opened from a URL, typed for the tests."""

from __future__ import annotations

from msgsafe.adapters import open_receiver, open_transport
from msgsafe.adapters.amqp10 import Amqp10Receiver, Amqp10Transport
from msgsafe.endpoints import parse_url


def transport_for(url: str, **options: object) -> Amqp10Transport:
    """An AMQP 1.0 transport to ``url`` with adapter ``options``."""
    transport = open_transport(parse_url(url), options)
    assert isinstance(transport, Amqp10Transport)
    return transport


def receiver_for(url: str, **options: object) -> Amqp10Receiver:
    """An AMQP 1.0 receiver of ``url`` with adapter ``options``."""
    receiver = open_receiver(parse_url(url), options)
    assert isinstance(receiver, Amqp10Receiver)
    return receiver
