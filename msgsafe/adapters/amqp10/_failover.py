"""Read the backup candidates an AMQP 1.0 peer advertises in its open frame.

Qpid brokers (and ActiveMQ Artemis) put a ``failover-server-list`` in the open frame's
properties: a list of maps, each with ``network-host`` (where to connect), ``hostname``
(the name for the open frame / TLS), ``port`` and an optional ``scheme``. Qpid JMS reads
``network-host`` first; some peers send only ``hostname``, so both are accepted here.
A candidate without a scheme inherits the current connection's (as Qpid JMS does).

A peer may also close a connection (or detach a link) with ``amqp:connection:redirect``
(``amqp:link:redirect``): the condition's info map names ``network-host``, ``port`` and
``hostname`` (AMQP 1.0 part 2.8.17). :func:`parse_redirect` reads it; the target keeps
the current connection's TLS, so a redirect never leads from TLS to plain TCP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from msgsafe._observer import current as observer_now
from msgsafe.endpoints import Endpoint

__all__ = [
    "FAILOVER_SERVER_LIST",
    "REDIRECTS",
    "Redirects",
    "parse_failover_list",
    "parse_redirect",
]

FAILOVER_SERVER_LIST = "failover-server-list"
_TLS_SCHEMES = frozenset({"amqps", "amqp+ssl", "amqpwss", "wss", "ssl"})
_PLAIN_SCHEMES = frozenset({"amqp", "amqp+tcp", "tcp", "amqpws", "ws"})
_log = logging.getLogger("msgsafe.adapters.amqp10")
#: Redirects followed in a row (no connection served in between) before the client stops
#: following them: a redirect loop ends there and the node is treated as unreachable.
MAX_REDIRECTS = 5
#: The conditions that send the client elsewhere.
REDIRECTS = frozenset({"amqp:connection:redirect", "amqp:link:redirect"})


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


def parse_redirect(condition: Any, *, current: Endpoint) -> tuple[Endpoint, str | None] | None:
    """Where a redirect ``condition`` sends the client, and the ``hostname`` to open
    with there (None: the default); None when it is not a usable redirect."""
    if condition is None or str(condition.name or "") not in REDIRECTS:
        return None
    info = condition.info if isinstance(condition.info, Mapping) else {}
    host = _get(info, "network-host") or _get(info, "hostname")
    port = _get(info, "port")
    port = current.port if port is None else port
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    hostname = _get(info, "hostname")
    target = Endpoint(host=host.strip("[]"), port=int(port), tls=current.tls)
    return target, str(hostname) if isinstance(hostname, str) and hostname else None


class Redirects:
    """The redirects an engine follows: under the rules of advertised candidates (TLS
    kept, ``allows``, the user's ``failover_allow``) and at most :data:`MAX_REDIRECTS`
    in a row. Used on the engine's thread only."""

    def __init__(self, allows: Callable[[Endpoint], bool]) -> None:
        self._allows = allows
        self._count = 0
        self._next: tuple[Endpoint, str | None] | None = None
        #: Who hears of followed redirects (see msgsafe._observer).
        self._observer = observer_now()

    def follow(self, condition: Any, current: Endpoint | None) -> bool:
        """True when ``condition`` is a redirect from ``current`` to be followed: the
        next dial (:meth:`take`) goes there."""
        target = parse_redirect(condition, current=current) if current is not None else None
        if target is None:
            return False
        endpoint = target[0]
        if not self._allows(endpoint):
            _log.warning(
                "not following the redirect from %s to %s: outside failover_allow",
                current,
                endpoint,
            )
            return False
        if self._count >= MAX_REDIRECTS:
            _log.warning(
                "not following the redirect from %s to %s: %d redirects in a row "
                "(a redirect loop?)",
                current,
                endpoint,
                self._count,
            )
            return False
        self._count += 1
        self._next = target
        _log.warning(
            "%s redirected the client to %s (%s: %s); following (%d of at most %d in a row)",
            current,
            endpoint,
            condition.name,
            condition.description or "no description",
            self._count,
            MAX_REDIRECTS,
        )
        if self._observer is not None:
            self._observer.redirect(str(current), str(endpoint), str(condition.name))
        return True

    @property
    def pending(self) -> bool:
        """True while a followed redirect waits for its dial."""
        return self._next is not None

    def take(self) -> tuple[Endpoint, str | None] | None:
        """Where to dial now (and the open hostname there), once per followed redirect."""
        target, self._next = self._next, None
        return target

    def served(self) -> None:
        """A connection served (the broker attached a link): the count of redirects in a
        row starts again. An open alone is not enough: a peer may open, then redirect."""
        self._count = 0
