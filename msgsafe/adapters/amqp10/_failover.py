"""Read the backup candidates an AMQP 1.0 peer advertises in its open frame.

Qpid brokers (and ActiveMQ Artemis) put a ``failover-server-list`` in the open frame's
properties: a list of maps, each with ``network-host`` (where to connect), ``hostname``
(the name for the open frame / TLS), ``port`` and an optional ``scheme``. Qpid JMS reads
``network-host`` first; some peers send only ``hostname``, so both are accepted here.
A candidate without a scheme inherits the current connection's (as Qpid JMS does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from msgsafe.endpoints import Endpoint

__all__ = ["FAILOVER_SERVER_LIST", "parse_failover_list"]

FAILOVER_SERVER_LIST = "failover-server-list"
_TLS_SCHEMES = frozenset({"amqps", "amqp+ssl", "amqpwss", "wss", "ssl"})
_PLAIN_SCHEMES = frozenset({"amqp", "amqp+tcp", "tcp", "amqpws", "ws"})
_log = logging.getLogger("msgsafe.adapters.amqp10")


def _get(entry: Mapping[Any, Any], key: str) -> Any:
    # Keys are AMQP symbols (a str subclass) from Qpid, plain strings from other peers.
    for k, value in entry.items():
        if str(k) == key:
            return value
    return None


def parse_failover_list(
    properties: Mapping[Any, Any] | None, *, current: Endpoint
) -> list[Endpoint]:
    """The endpoints in ``properties['failover-server-list']``, in the peer's order.

    Malformed entries are skipped (and logged) rather than failing the connection:
    the list is a hint, the connection the peer opened is what matters.
    """
    if not properties:
        return []
    raw = _get(properties, FAILOVER_SERVER_LIST)
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        _log.warning("ignoring malformed %s: not a list", FAILOVER_SERVER_LIST)
        return []
    found: list[Endpoint] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            _log.warning("ignoring a %s entry that is not a map", FAILOVER_SERVER_LIST)
            continue
        host = _get(entry, "network-host") or _get(entry, "hostname")
        port = _get(entry, "port")
        scheme = _get(entry, "scheme")
        if not isinstance(host, str) or not host or any(c.isspace() for c in host):
            _log.warning("ignoring a %s entry without a usable host", FAILOVER_SERVER_LIST)
            continue
        if port is None:
            port = current.port
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            _log.warning("ignoring %s entry for %s: bad port", FAILOVER_SERVER_LIST, host)
            continue
        if scheme is None:
            tls = current.tls
        elif str(scheme).lower() in _TLS_SCHEMES:
            tls = True
        elif str(scheme).lower() in _PLAIN_SCHEMES:
            tls = False
        else:
            _log.warning("ignoring %s entry for %s: unknown scheme", FAILOVER_SERVER_LIST, host)
            continue
        endpoint = Endpoint(host=host.strip("[]"), port=int(port), tls=tls)
        if endpoint not in found:
            found.append(endpoint)
    return found
