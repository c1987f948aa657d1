"""The PostgreSQL outbox named by a URL: ``postgresql://user:pw@h1:5432,h2:5432/db?table=T``.

:func:`parse_store_url` splits what msgsafe reads (``table``, ``lease``,
``write_timeout``) from what libpq reads (everything else, hosts as libpq's multi-host
URL) and adds the defaults a fleet needs: ``target_session_attrs=read-write`` (libpq
tries the hosts in order and keeps the one that takes writes: the primary, whichever
host it is after a fail-over), ``connect_timeout=5`` (a dead host is passed over within
seconds) and TCP keepalives
(a primary that vanishes without a reset is noticed). The password is never shown:
:attr:`StoreUrl.redacted` is what repr, logs, errors and the CLI print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from msgsafe.errors import ConfigurationError

__all__ = ["SCHEMES", "StoreUrl", "is_store_url", "parse_store_url", "redact_conninfo"]

SCHEMES = ("postgresql://", "postgres://")

#: libpq parameters msgsafe sets unless the URL does.
_DEFAULTS = {
    "target_session_attrs": "read-write",
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
}
_SECRETS = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_SECRET = re.compile(r"^([a-z]+://)([^:@/]*):[^@/]*@", re.IGNORECASE)


def is_store_url(spec: object) -> bool:
    """True when ``spec`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(spec, str) and spec.lower().startswith(SCHEMES)


def redact_conninfo(conninfo: str) -> str:
    """``conninfo`` (a URL or ``key=value`` string) without its password."""
    return _SECRETS.sub(r"\1***", _URL_SECRET.sub(r"\1\2@", conninfo))


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed store URL: ``conninfo`` for libpq (secret), and what msgsafe reads."""

    conninfo: str
    table: str
    lease_s: float | None
    hosts: tuple[str, ...]
    database: str
    user: str | None
    #: ``write_timeout=S``: how long a put keeps trying through a fail-over (None: the
    #: store's default).
    write_timeout_s: float | None = None

    @property
    def redacted(self) -> str:
        """The URL without the password: hosts, database, user and table."""
        who = f"{quote(self.user, safe='')}@" if self.user else ""
        return f"postgresql://{who}{','.join(self.hosts)}/{self.database}?table={self.table}"

    def __repr__(self) -> str:
        return f"StoreUrl({self.redacted!r})"


def parse_store_url(url: str, *, table: str = "msgsafe_outbox", store: str = "outbox") -> StoreUrl:
    """Split ``url`` (see the module docstring); ``table`` when the URL names none.

    :class:`ConfigurationError` (never quoting the password, naming the ``store`` the
    URL is for: ``"outbox"`` or ``"inbox"``) for anything that is not a
    ``postgresql://`` URL with at least a host or a database."""
    if not is_store_url(url):
        raise ConfigurationError(
            f"a PostgreSQL {store} URL starts with postgresql://, not {redact_conninfo(url)!r}"
        )
    rest = url.split("://", 1)[1]
    head, _, query = rest.partition("?")
    authority, _, path = head.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    if not at:
        userinfo, hostlist = "", authority
    user = unquote(userinfo.split(":", 1)[0]) if userinfo else None
    hosts = tuple(h for h in hostlist.split(",") if h) or ("localhost:5432",)
    database = unquote(path) or (user or "postgres")
    params = dict(parse_qsl(query, keep_blank_values=True))
    chosen = params.pop("table", table)
    lease = _seconds(params, "lease")
    write_timeout = _seconds(params, "write_timeout")
    for name, value in _DEFAULTS.items():
        params.setdefault(name, value)
    conninfo = f"postgresql://{authority}/{path}" + (f"?{urlencode(params)}" if params else "")
    return StoreUrl(conninfo, chosen, lease, hosts, database, user, write_timeout)


def _seconds(params: dict[str, str], name: str) -> float | None:
    """The seconds ``name`` gives (taken out of ``params``), None when absent;
    :class:`ConfigurationError` unless a number > 0."""
    text = params.pop(name, None)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be seconds, not {text!r}") from None
    if not value > 0:  # NaN too
        raise ConfigurationError(f"{name} must be > 0 seconds")
    return value
