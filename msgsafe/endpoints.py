"""Broker URLs and host lists.

One URL string selects the protocol, the hosts and the options::

    amqp://user:pass@h1:5672,h2:5672/vhost?heartbeat=10
    kafka://b1:9092,b2:9092
    amqp10s://h1:5671,h2:5671?sasl=PLAIN
    memory://test

:func:`parse_url` raises :class:`~msgsafe.errors.ConfigurationError` for anything
malformed and never any other exception. Credentials live in :class:`Secret` so they
never appear in ``repr``, ``str``, logs or error messages; :meth:`BrokerUrl.redacted`
is the form to log and to store in the outbox.

:class:`EndpointList` owns rotation over the hosts: jittered backoff and a breaker per
endpoint, and merging of broker-advertised candidates (AMQP 1.0
``failover-server-list``, Kafka metadata) with REPLACE / ADD / IGNORE, never
downgrading TLS and honouring an optional allow-list.
"""

from __future__ import annotations

import enum
import ipaddress
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote

from msgsafe._observer import current as observer_now
from msgsafe.errors import ConfigurationError
from msgsafe.retry import Backoff, RetryPolicy

__all__ = [
    "BrokerUrl",
    "Endpoint",
    "EndpointList",
    "MergePolicy",
    "ProtocolTraits",
    "Secret",
    "parse_url",
    "traits",
]


@dataclass(frozen=True, slots=True)
class _Scheme:
    #: The protocol, which is also the name of its adapter package (msgsafe.adapters.NAME).
    protocol: str
    tls: bool
    default_port: int


#: The one registry of what msgsafe connects to: URL scheme -> protocol (= adapter
#: package), TLS, default port. :func:`msgsafe.adapters.adapter_module` imports the
#: adapter a protocol names; adding a scheme here is all it takes to route a URL.
SCHEMES: Mapping[str, _Scheme] = MappingProxyType(
    {
        "amqp": _Scheme("rabbitmq", False, 5672),
        "amqps": _Scheme("rabbitmq", True, 5671),
        "kafka": _Scheme("kafka", False, 9092),
        "kafka+ssl": _Scheme("kafka", True, 9093),
        "amqp10": _Scheme("amqp10", False, 5672),
        "amqp10s": _Scheme("amqp10", True, 5671),
        "memory": _Scheme("memory", False, 0),
    }
)

#: Every protocol a scheme names: the adapter packages under msgsafe.adapters.
PROTOCOLS: frozenset[str] = frozenset(spec.protocol for spec in SCHEMES.values())


@dataclass(frozen=True, slots=True)
class ProtocolTraits:
    """What the code above the adapters needs to know of a protocol, as data: it asks
    :func:`traits` instead of comparing the protocol's name (a test keeps it so). What a
    protocol does is its adapter's (``msgsafe/adapters/NAME/``) and its check's
    (``msgsafe/checks/NAME.py``), both found by the name."""

    #: False for a broker in this process (``memory://NAME``): no hosts, the URL's path
    #: names the broker.
    networked: bool = True
    #: Where a destination's virtual host comes from: the URL's path (``/`` when empty),
    #: the ``virtual_host`` option, or nowhere ("").
    vhost: str = ""
    #: A destination is a log (Kafka): its records stay until retention removes them
    #: (none is deleted one by one) and a new consumer group picks where it starts.
    log: bool = False
    #: The adapter option that lets a receiver hold that many deliveries unsettled at
    #: once, and its largest value (None: no limit); "": the receiver needs none.
    unsettled_option: str = ""
    unsettled_max: int | None = None
    #: The ``declare=`` value that makes a destination keep confirmed messages through a
    #: node's loss ("": the adapter declares nothing, or not by this option).
    safe_declare: str = ""
    #: ``msgsafe doctor`` reads the broker's management API too (``--management``).
    management_api: bool = False
    #: Adapter options a bulk writer (the Spark sink: many rows a task, every receipt
    #: awaited at the task's end) sets unless its caller gave them, measured for it.
    bulk_options: Mapping[str, float | int] = field(default_factory=lambda: MappingProxyType({}))
    #: A bulk writer without an outbox (the Spark sink) may put its rows straight on the
    #: adapter's client and count the confirms instead of receipts per row: its fast
    #: path (:mod:`msgsafe.spark.kafka_fast`, which the adapter's client serves).
    bulk_fast_path: bool = False


_TRAITS: Mapping[str, ProtocolTraits] = MappingProxyType(
    {
        "rabbitmq": ProtocolTraits(
            vhost="path",
            unsettled_option="prefetch",
            unsettled_max=65535,
            safe_declare="quorum",
            management_api=True,
        ),
        # NOTE: the AMQP 1.0 receiver tops its credit up only as deliveries are settled.
        "amqp10": ProtocolTraits(vhost="option", unsettled_option="credit"),
        "kafka": ProtocolTraits(
            log=True,
            bulk_fast_path=True,
            bulk_options=MappingProxyType(
                {
                    # NOTE: with the adapter's 5 ms a partition's rows left in requests
                    # of ~1,600 and the brokers (sharing the machine with Spark in the
                    # benchmark) spent 2-3 µs per row; 50 ms measured 0.8-1.3 µs. A task
                    # waits for its receipts anyway, and its last batch leaves without
                    # the linger (Producer.hurry).
                    "linger_ms": 50.0,
                    # librdkafka's batch.size (1 MB) bounds a request instead, so small
                    # rows fill it (about 15,000 rows of ~6 bytes with their id header
                    # instead of 10,000): fewer requests for the brokers.
                    "batch_num_messages": 100_000,
                }
            ),
        ),
        "memory": ProtocolTraits(networked=False),
    }
)


def traits(protocol: str) -> ProtocolTraits:
    """The :class:`ProtocolTraits` of ``protocol`` (one of :data:`PROTOCOLS`)."""
    try:
        return _TRAITS[protocol]
    except KeyError:
        raise ConfigurationError(f"unknown protocol {protocol!r}") from None


class Secret:
    """A string that never shows itself in ``repr`` or ``str``; ``reveal()`` to use it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret value. Pass it straight to the client library; never log it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[object, ...]:
        return (Secret, (self._value,))


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One broker address. ``tls`` is part of the identity: a TLS and a plain endpoint
    on the same host and port are different endpoints."""

    host: str
    port: int
    tls: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """A parsed broker URL. Safe to log: credentials are :class:`Secret` and excluded
    from ``repr``."""

    scheme: str
    protocol: str
    tls: bool
    endpoints: tuple[Endpoint, ...]
    path: str = ""
    username: str | None = field(default=None, repr=False)
    password: Secret | None = field(default=None, repr=False)
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def redacted(self) -> str:
        """The URL without credentials: what logs, errors and the outbox may hold."""
        networked = traits(self.protocol).networked
        hosts = ",".join(str(e) for e in self.endpoints) if networked else ""
        text = f"{self.scheme}://{hosts}"
        if not networked:
            text += self.path
        elif self.path:
            text += "/" + quote(self.path, safe="")
        if self.options:
            text += "?" + "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(self.options.items())
            )
        return text

    def __str__(self) -> str:
        return self.redacted()

    def with_options(self, extra: Mapping[str, str]) -> BrokerUrl:
        """A copy with ``extra`` merged over the URL's query options."""
        merged = dict(self.options)
        merged.update(extra)
        return BrokerUrl(
            scheme=self.scheme,
            protocol=self.protocol,
            tls=self.tls,
            endpoints=self.endpoints,
            path=self.path,
            username=self.username,
            password=self.password,
            options=MappingProxyType(merged),
        )


def _fail(reason: str) -> ConfigurationError:
    # NOTE: never echo the URL itself: it may hold a password.
    return ConfigurationError(f"malformed broker URL: {reason}")


def _parse_host(text: str, default_port: int, tls: bool) -> Endpoint:
    if not text:
        raise _fail("empty host in host list")
    host: str
    port_text: str | None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise _fail("unclosed '[' in IPv6 host")
        host = text[1:close]
        rest = text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise _fail("unexpected text after IPv6 host")
        port_text = rest[1:] if rest else None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _fail("bracketed host is not an IPv6 address") from None
    else:
        if text.count(":") > 1:
            raise _fail("IPv6 hosts must be written in brackets, e.g. [::1]:5672")
        host, sep, port_text_raw = text.partition(":")
        port_text = port_text_raw if sep else None
        if not host:
            raise _fail("empty host name")
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
        if not set(host) <= allowed:
            raise _fail("host name has characters outside letters, digits, '.', '-', '_'")
    if port_text is None or port_text == "":
        if port_text == "":
            raise _fail("empty port")
        port = default_port
    else:
        if not port_text.isascii() or not port_text.isdigit():
            raise _fail("port must be a number")
        port = int(port_text)
        if not 0 < port < 65536:
            raise _fail("port must be between 1 and 65535")
    return Endpoint(host=host, port=port, tls=tls)


def parse_url(url: str) -> BrokerUrl:
    """Parse a broker URL; raises :class:`ConfigurationError` (a ``ValueError``) on any
    malformed input and never another exception."""
    if not isinstance(url, str):
        raise ConfigurationError(f"broker URL must be a string, not {type(url).__name__}")
    if not url.isprintable() or any(c.isspace() for c in url):
        raise _fail("it contains whitespace or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _fail("missing '://' after the scheme (e.g. amqp://host:5672)")
    scheme = scheme.lower()
    spec = SCHEMES.get(scheme)
    if spec is None:
        known = ", ".join(sorted(SCHEMES))
        raise ConfigurationError(f"unknown URL scheme {scheme!r}; expected one of: {known}")

    rest, _, fragment = rest.partition("#")
    if fragment:
        raise _fail("fragments ('#') are not allowed")
    rest, _, query = rest.partition("?")
    options: dict[str, str] = {}
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise _fail("query string must be name=value pairs joined by '&'") from None
        for name, value in pairs:
            if not name:
                raise _fail("empty option name in query string")
            if name in options:
                raise _fail(f"option {name!r} given twice")
            options[name] = value

    if not traits(spec.protocol).networked:
        if "@" in rest:
            raise _fail("memory:// URLs take no credentials")
        name = rest.strip("/")
        if not name or "/" in name or "," in name:
            raise _fail("memory URLs name one broker: memory://NAME")
        return BrokerUrl(
            scheme=scheme,
            protocol=spec.protocol,
            tls=False,
            endpoints=(),
            path=name,
            options=MappingProxyType(options),
        )

    authority, slash, path = rest.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    if not at:
        hostlist, userinfo = authority, ""
    username: str | None = None
    password: Secret | None = None
    if at:
        user_raw, colon, pass_raw = userinfo.partition(":")
        if not user_raw:
            raise _fail("empty user name before '@'")
        username = unquote(user_raw, errors="strict") if _valid_escapes(user_raw) else None
        if username is None:
            raise _fail("bad percent-escape in user name")
        if colon:
            if not _valid_escapes(pass_raw):
                raise _fail("bad percent-escape in password")
            password = Secret(unquote(pass_raw, errors="strict"))
    if not hostlist:
        raise _fail("no host given")
    endpoints = tuple(
        _parse_host(item, spec.default_port, spec.tls) for item in hostlist.split(",")
    )
    if len(set(endpoints)) != len(endpoints):
        raise _fail("the same host is listed twice")
    if slash and path:
        if "/" in path:
            raise _fail("path must be one segment (percent-encode '/' as %2F)")
        if not _valid_escapes(path):
            raise _fail("bad percent-escape in path")
        path = unquote(path, errors="strict")
    return BrokerUrl(
        scheme=scheme,
        protocol=spec.protocol,
        tls=spec.tls,
        endpoints=endpoints,
        path=path,
        username=username,
        password=password,
        options=MappingProxyType(options),
    )


def _valid_escapes(text: str) -> bool:
    hexdigits = set("0123456789abcdefABCDEF")
    i = 0
    while i < len(text):
        if text[i] == "%":
            if len(text) < i + 3 or not set(text[i + 1 : i + 3]) <= hexdigits:
                return False
            i += 3
        else:
            i += 1
    try:
        unquote(text, errors="strict")
    except UnicodeDecodeError:
        return False
    return True


class MergePolicy(enum.Enum):
    """How broker-advertised candidates combine with the configured hosts (as Qpid JMS)."""

    REPLACE = "replace"  #: use the advertised list instead of the configured one
    ADD = "add"  #: use both, configured hosts first
    IGNORE = "ignore"  #: never follow advertised hosts


@dataclass(slots=True)
class _EndpointState:
    endpoint: Endpoint
    backoff: Backoff


class EndpointList:
    """Thread-safe rotation over broker endpoints with a breaker per endpoint.

    :meth:`next` returns the next endpoint whose breaker allows an attempt, or the one
    that allows one soonest (with the wait) when all are open. :meth:`failed` opens an
    endpoint's breaker for a jittered, growing time; :meth:`succeeded` closes it.
    """

    def __init__(
        self,
        configured: Iterable[Endpoint],
        *,
        policy: RetryPolicy | None = None,
        merge: MergePolicy = MergePolicy.REPLACE,
        allow: Callable[[Endpoint], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._configured = tuple(configured)
        if not self._configured:
            raise ConfigurationError("at least one endpoint is required")
        self._tls = any(e.tls for e in self._configured)
        self._policy = policy or RetryPolicy(initial=0.2, maximum=5.0)
        self._merge = merge
        self._allow = allow
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._states: dict[Endpoint, _EndpointState] = {}
        self._order: list[Endpoint] = []
        self._cursor = 0
        self._set_order(list(self._configured))
        #: Advertised endpoints refused by policy (TLS downgrade, allow-list), for logs.
        self.refused: list[Endpoint] = []
        #: Who hears of fail-overs (see msgsafe._observer); None: nobody.
        self._observer = observer_now()
        #: The endpoint of the last good connection, and whether one was dialled since.
        self._served: Endpoint | None = None
        self._dialled = False

    def _set_order(self, order: list[Endpoint]) -> None:
        self._order = order
        for ep in order:
            if ep not in self._states:
                self._states[ep] = _EndpointState(
                    ep, Backoff(self._policy, clock=self._clock, rng=self._rng)
                )
        self._cursor %= max(1, len(self._order))

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """The current rotation, in order."""
        with self._lock:
            return tuple(self._order)

    def next(self) -> tuple[Endpoint, float]:
        """The next endpoint to try and how many seconds to wait before trying it."""
        with self._lock:
            self._dialled = True
            n = len(self._order)
            for i in range(n):
                ep = self._order[(self._cursor + i) % n]
                if self._states[ep].backoff.ready():
                    self._cursor = (self._cursor + i + 1) % n
                    return ep, 0.0
            best = min(self._order, key=lambda e: self._states[e].backoff.remaining())
            self._cursor = (self._order.index(best) + 1) % n
            return best, self._states[best].backoff.remaining()

    def failed(self, endpoint: Endpoint) -> float:
        """Record a failed attempt on ``endpoint``; returns its breaker's open time."""
        with self._lock:
            state = self._states.get(endpoint)
            return state.backoff.failure() if state else 0.0

    def succeeded(self, endpoint: Endpoint) -> None:
        """Record a good connection to ``endpoint``."""
        with self._lock:
            state = self._states.get(endpoint)
            if state:
                state.backoff.success()
            previous, dialled = self._served, self._dialled
            self._served, self._dialled = endpoint, False
        if self._observer is not None and previous is not None and dialled:
            # A new connection after an earlier one served: the client failed over.
            reason = "reconnect" if previous == endpoint else "next-endpoint"
            self._observer.failover(str(previous), str(endpoint), reason)

    def advertise(self, candidates: Iterable[Endpoint]) -> tuple[Endpoint, ...]:
        """Merge broker-advertised ``candidates``; returns the ones accepted.

        An advertised plain endpoint is never followed from a TLS connection (that would
        hand the session to anyone on the path), and the allow-list, when given, is
        applied to every advertised endpoint.
        """
        accepted: list[Endpoint] = []
        refused: list[Endpoint] = []
        for cand in candidates:
            downgrade = self._tls and not cand.tls
            if downgrade or (self._allow is not None and not self._allow(cand)):
                refused.append(cand)
            elif cand not in accepted:
                accepted.append(cand)
        with self._lock:
            self.refused.extend(refused)
            if self._merge is MergePolicy.IGNORE or not accepted:
                return ()
            if self._merge is MergePolicy.REPLACE:
                self._set_order(accepted)
            else:
                merged = list(self._configured)
                merged += [c for c in accepted if c not in merged]
                self._set_order(merged)
        return tuple(accepted)
