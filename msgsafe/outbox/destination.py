"""What identifies the broker an outbox's messages are for, whatever the URL's spelling.

The default outbox file is named after a :class:`Destination`, not after the URL
string, so that editing the URL during an outage (an option added, ``localhost``
written for ``127.0.0.1``, the hosts listed in another order, the same option moved
from the query string to a keyword argument, a new password) keeps the stored messages
with the producer that forwards them.

A destination is:

- the **scheme** (``amqp``, ``amqps``, ``kafka``, ``kafka+ssl``, ``amqp10``, ``amqp10s``,
  ``memory``): another protocol or TLS is another listener, and another message format;
- the **set of hosts** (``host:port``, order ignored), each host lower-cased without a
  trailing dot, IP addresses in their canonical form, and the loopback aliases
  ``localhost``, ``localhost.localdomain``, ``ip6-localhost``, ``ip6-loopback``,
  ``127.0.0.1`` and ``::1`` all written ``localhost``. No name is looked up in DNS:
  opening a producer never waits for a resolver, and a broker whose address changes
  keeps its outbox;
- the **virtual host**: for ``amqp(s)://`` the URL's path (empty means ``/``, as for
  the broker); for ``amqp10(s)://`` the ``virtual_host`` option (URL or keyword); Kafka
  has none; for ``memory://`` the broker's name.

Never part of it: credentials, and every other client option (timeouts, ``declare``,
heartbeats...): they change how the client talks, not where the messages go.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from msgsafe.endpoints import SCHEMES, BrokerUrl, parse_url, traits
from msgsafe.errors import ConfigurationError

__all__ = ["Destination", "destination_of", "destination_of_target"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_LOOPBACK_ADDRESSES = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


@dataclass(frozen=True, slots=True)
class Destination:
    """A broker destination as the outbox keys it (see the module docstring)."""

    scheme: str
    hosts: frozenset[tuple[str, int]]  #: canonical (host, port) pairs
    vhost: str = ""  #: the virtual host, or the memory broker's name

    @property
    def networked(self) -> bool:
        """False for a broker in this process (``memory://``): no hosts, the virtual
        host names the broker."""
        return traits(SCHEMES[self.scheme].protocol).networked

    @property
    def key(self) -> str:
        """The canonical text: hosts sorted, no credentials, no options. Two URLs
        reach the same destination exactly when their keys are equal."""
        if not self.networked:
            return f"memory://{self.vhost}"
        hosts = ",".join(_hostport(host, port) for host, port in sorted(self.hosts))
        vhost = "/" + quote(self.vhost, safe="") if self.vhost else ""
        return f"{self.scheme}://{hosts}{vhost}"

    def overlaps(self, other: Destination) -> bool:
        """Another destination with the same scheme and virtual host that shares a host:
        most likely the same cluster listed differently (a node added or removed)."""
        return (
            self != other
            and self.scheme == other.scheme
            and self.vhost == other.vhost
            and bool(self.hosts & other.hosts)
        )

    def __str__(self) -> str:
        return self.key


def destination_of(url: BrokerUrl, options: Mapping[str, object] | None = None) -> Destination:
    """The destination ``url`` (and the keyword ``options`` given with it) reaches."""
    known = traits(url.protocol)
    if not known.networked:
        return Destination(url.scheme, frozenset(), url.path)
    hosts = frozenset((canonical_host(e.host), e.port) for e in url.endpoints)
    vhost = ""
    if known.vhost == "path":
        vhost = url.path or "/"
    elif known.vhost == "option":
        given = (options or {}).get("virtual_host", url.options.get("virtual_host"))
        vhost = "" if given is None else str(given)
    return Destination(url.scheme, hosts, vhost)


def destination_of_target(target: str) -> Destination | None:
    """The destination of a target as outbox rows store it (a URL without credentials),
    or None when it does not parse."""
    try:
        return destination_of(parse_url(target))
    except ConfigurationError:
        return None


def canonical_host(host: str) -> str:
    """``host`` as a destination names it: lower case, no trailing dot, canonical IP
    text, every loopback alias ``localhost``."""
    name = host.lower().rstrip(".")
    if name in _LOOPBACK_NAMES:
        return "localhost"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in _LOOPBACK_ADDRESSES:
        return "localhost"
    return address.compressed


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
