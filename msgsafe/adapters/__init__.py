"""Adapters: one package per protocol, each the same shape.

Every adapter package (``rabbitmq``, ``kafka``, ``amqp10``, ``memory``) exports::

    open_transport(url: BrokerUrl, options: Mapping[str, object]) -> Transport
    open_receiver(url: BrokerUrl, options: Mapping[str, object], *, group: str | None) -> Receiver
    check_destination(destination: str) -> None

(the last, in its ``config.py``, raises :class:`~msgsafe.errors.InvalidDestination` for a
name its protocol's rules refuse, whatever the broker: :func:`destination_check` serves
it); the package of a protocol whose destinations are logs
(:attr:`msgsafe.endpoints.ProtocolTraits.log`: Kafka) also exports::

    start_group_at_beginning(url: BrokerUrl, destination: str, group: str) -> None

(a new consumer group reads the destination from its first record). When its client
library is missing, an adapter package raises :class:`~msgsafe.errors.MissingExtra` on
import, naming the extra to install. Which adapter serves a URL is decided once, by
:data:`msgsafe.endpoints.SCHEMES` (scheme -> protocol, and the protocol is the package
name); this module imports that package lazily, so a user of one broker never needs the
others' libraries.

Every adapter package has the same files:

- ``__init__.py``: the two entry points and the missing-extra guard (plus the names of
  its classes, for import);
- ``config.py``: its options, a :class:`~msgsafe.adapters._config.TransportOptions`;
- ``transport.py`` / ``receiver.py``: the publishing and the consuming half;
- ``_connection.py``: what owns the connection (its I/O thread) and fails over;
- ``_wire.py``: bytes on the wire and header names;
- ``_errors.py``: the client library's errors translated into :mod:`msgsafe.errors`;
- ``check.py``: the destination check, what the broker does with a confirmed message
  there (``inspector`` for the producer, ``doctor_findings`` for ``msgsafe doctor``,
  found by :mod:`msgsafe.checks`);
- at most one module of its own, named for what it is: ``rabbitmq/_confirms.py`` (the
  publisher-confirm ledger and the sender that puts messages in flight on it),
  ``kafka/positions.py`` (where a checking group starts),
  ``amqp10/_failover.py`` (the advertised fail-over list), ``memory/broker.py`` (the
  in-process broker); Kafka also has ``kafka/client.py`` (the librdkafka producer the
  transport, the drop-in and the Spark sink share) and ``kafka/fast.py`` (the
  producer's single sends straight into it: :class:`msgsafe.ports.FastSender`).

Shared by all of them: :mod:`~msgsafe.adapters._config` (options from URL and keywords,
numbers, the one size check) and :mod:`~msgsafe.adapters._reports` (calling back into
the layer above from an I/O thread, logging what the callback raises).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from types import ModuleType

from msgsafe.endpoints import PROTOCOLS, BrokerUrl
from msgsafe.errors import ConfigurationError, InvalidDestination
from msgsafe.ports import Receiver, Transport

__all__ = [
    "DestinationCheck",
    "adapter_module",
    "destination_check",
    "open_receiver",
    "open_transport",
]


def adapter_module(protocol: str) -> ModuleType:
    """Import the adapter package for ``protocol`` (MissingExtra if its library is absent)."""
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"no adapter for protocol {protocol!r}")
    return importlib.import_module(f"{__name__}.{protocol}")


def open_transport(url: BrokerUrl, options: Mapping[str, object]) -> Transport:
    """A publishing transport for ``url``; options are validated by the adapter."""
    transport: Transport = adapter_module(url.protocol).open_transport(url, options)
    return transport


def open_receiver(
    url: BrokerUrl, options: Mapping[str, object], *, group: str | None = None
) -> Receiver:
    """A consuming receiver for ``url``; ``group`` is the consumer group / shared queue."""
    receiver: Receiver = adapter_module(url.protocol).open_receiver(url, options, group=group)
    return receiver


#: A destination check: returns when the protocol can carry the name, else raises
#: :class:`~msgsafe.errors.InvalidDestination`.
DestinationCheck = Callable[[str], None]


def destination_check(protocol: str) -> DestinationCheck:
    """``protocol``'s name check (the adapter's ``check_destination``), remembering its
    answers: each name is checked once, however many messages go there. The producer
    runs it before a message is sent or stored, the forwarder before a stored one is
    forwarded; a refusal raises a fresh copy of the same error each time."""
    return _RememberedCheck(adapter_module(protocol).check_destination)


class _RememberedCheck:
    """A :data:`DestinationCheck` that asks ``check`` once per name (at most ``_KEPT``
    names of each answer are kept: a stream of distinct names costs a check each, not
    memory)."""

    _KEPT = 10_000

    def __init__(self, check: DestinationCheck) -> None:
        self._check = check
        self._good: set[str] = set()
        self._refused: dict[str, InvalidDestination] = {}
        self._lock = threading.Lock()

    def __call__(self, destination: str) -> None:
        if destination in self._good:
            return
        refused = self._refused.get(destination)
        if refused is None:
            try:
                self._check(destination)
            except InvalidDestination as exc:
                refused = exc.with_id(None)  # kept without the caller's traceback
                with self._lock:
                    if len(self._refused) < self._KEPT:
                        self._refused[destination] = refused
            else:
                with self._lock:
                    if len(self._good) < self._KEPT:
                        self._good.add(destination)
                return
        raise refused.with_id(None)
