"""``URLParameters`` that also reads msgsafe's multi-host URL (see :mod:`msgsafe.compat.pika`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from msgsafe.errors import ConfigurationError, MissingExtra

try:
    import pika
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

__all__ = ["URLParameters", "expand", "split_hosts"]


def split_hosts(url: str) -> list[str]:
    """``amqp://u:p@h1:5672,h2:5673/%2F?x=1`` as one URL per host, in order
    (``amqp://u:p@h1:5672/%2F?x=1``, ...); a URL with one host as itself. An empty
    host in the list is a :class:`~msgsafe.errors.ConfigurationError` (the URL is not
    repeated: it may hold a password)."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    hosts = hostlist.split(",")
    if len(hosts) == 1:
        return [url]
    if not all(h.strip() for h in hosts):
        raise ConfigurationError("the URL's host list has an empty entry")
    rest = url[len(f"{parts.scheme}://{parts.netloc}") :]
    return [f"{parts.scheme}://{userinfo}{at}{host.strip()}{rest}" for host in hosts]


class URLParameters(pika.URLParameters):  # type: ignore[misc]  # pika has no types
    """pika's ``URLParameters``, which also takes the URL ``msgsafe cluster up rabbitmq``
    prints, with several hosts: ``amqp://u:p@h1:5672,h2:5673/%2F``. The object is the
    first host's parameters (pika's own URL parser, every query option as pika reads
    it); :attr:`fail_over` holds the other hosts' parameters, which
    :class:`~msgsafe.compat.pika.BlockingConnection` tries next, as for a list."""

    def __init__(self, url: str) -> None:
        first, *others = split_hosts(url)
        super().__init__(first)
        #: The parameters of the URL's other hosts, in order (empty for one host).
        self.fail_over: list[pika.URLParameters] = [pika.URLParameters(u) for u in others]


def expand(parameters: list[pika.connection.Parameters]) -> list[pika.connection.Parameters]:
    """``parameters`` with each multi-host :class:`URLParameters` followed by its other
    hosts' parameters."""
    expanded: list[pika.connection.Parameters] = []
    for entry in parameters:
        expanded.append(entry)
        if isinstance(entry, URLParameters):
            expanded.extend(entry.fail_over)
    return expanded
