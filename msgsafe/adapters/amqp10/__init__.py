"""AMQP 1.0 adapter (python-qpid-proton): ``amqp10://`` and ``amqp10s://`` URLs.

Durable messages, unsettled sends with outcomes mapped to msgsafe errors, credit-based
flow, SASL PLAIN / ANONYMOUS, TLS verifying the peer name by default, and fail-over
across the URL's hosts plus the broker-advertised ``failover-server-list`` with
session resume (consumers re-attached, unsettled sends resent with their ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgsafe.errors import MissingExtra

try:
    import proton  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("amqp10", "python-qpid-proton") from exc

from proton.reactor import AtLeastOnce

from msgsafe.adapters.amqp10._connection import LOGIN_GRACE_S, ssl_domain
from msgsafe.adapters.amqp10._errors import connection_error, unfixable
from msgsafe.adapters.amqp10._wire import Capability, encode_envelope
from msgsafe.adapters.amqp10.config import Amqp10Options, check_destination, load_options
from msgsafe.adapters.amqp10.receiver import Amqp10Receiver
from msgsafe.adapters.amqp10.transport import Amqp10Transport
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError
from msgsafe.message import Envelope

__all__ = [
    "LOGIN_GRACE_S",
    "Amqp10Options",
    "Amqp10Receiver",
    "Amqp10Transport",
    "check_destination",
    "connection_error",
    "link_options",
    "open_receiver",
    "open_transport",
    "ssl_domain",
    "unfixable",
    "wire_message",
]


def _check(url: BrokerUrl) -> None:
    if url.protocol != "amqp10":
        raise ConfigurationError(f"the amqp10 adapter cannot open {url.scheme}:// URLs")


def open_transport(url: BrokerUrl, options: Mapping[str, object]) -> Amqp10Transport:
    """A publishing transport for an ``amqp10://`` / ``amqp10s://`` URL."""
    _check(url)
    return Amqp10Transport(url, load_options(url, options))


def open_receiver(
    url: BrokerUrl, options: Mapping[str, object], *, group: str | None = None
) -> Amqp10Receiver:
    """A receiver for an ``amqp10://`` URL; ``group`` is unused (queues are addresses)."""
    _check(url)
    return Amqp10Receiver(url, load_options(url, options), group=group)


def link_options(capability: str | None = Amqp10Options().address_capability) -> list[Any]:
    """The options of the adapter's sender links, for a proton sender that must deliver
    where msgsafe's own does: at-least-once (unsettled sends) and ``capability`` on the
    target (``address_capability``: "queue" by default; None or empty: none)."""
    options: list[Any] = [AtLeastOnce()]
    if capability:
        options.append(Capability(capability))
    return options


def wire_message(envelope: Envelope) -> bytes:
    """``envelope`` encoded as the adapter sends it (durable, id, properties, one data
    section): the bytes of one transfer."""
    return encode_envelope(envelope)
