"""PostgreSQL errors as one short line: the first cause, never libpq's whole dump.

libpq reports a failed connection as several lines — each host tried, hints, a summary
of every attempt — and psycopg passes them on. :func:`first_cause` keeps the line that
says what went wrong ("connection to 127.0.0.1:5433 refused", "password authentication
failed for user "app"") and :func:`store_error` makes it the typed error a caller can
act on; the full text stays on the exception's ``__cause__`` and in the DEBUG log.
Nothing here can show a password: libpq does not put one in its messages, and every
line still goes through :func:`~msgsafe.outbox._pg_url.redact_conninfo`.
"""

from __future__ import annotations

import logging
import re

from msgsafe.errors import OutboxError, OutboxLoginRefused
from msgsafe.outbox._pg_url import redact_conninfo

__all__ = ["READ_ONLY_LOGIN", "first_cause", "is_auth_failure", "is_read_only", "store_error"]

log = logging.getLogger("msgsafe.outbox")

#: What a read-only login is told: the cause and the fix, in one line.
READ_ONLY_LOGIN = (
    "the login is read-only (default_transaction_read_only=on): the outbox needs a login"
    " that can write"
)

_SERVER_AT = re.compile(r'^connection to server at "([^"]*)"(?: \([^)]*\))?, port (\d+) failed: ')
_SOCKET_AT = re.compile(r'^connection to server on socket "([^"]*)" failed: ')
_AT = re.compile(r"^(.*) \(at ([^)]*)\)$")
_ATTEMPT = re.compile(r"^- host: .*?: (?=connection failed: )")
_PREFIXES = ("connection failed: ", "FATAL:  ", "FATAL: ", "ERROR:  ", "ERROR: ")
#: SQLSTATEs of a refused login: invalid_password, invalid_authorization_specification.
_AUTH_STATES = ("28P01", "28000")
#: What makes one cause more telling than another, most first.
_TELLING = ("authentication failed", "read-only", "does not exist", "refused")
#: read_only_sql_transaction.
_READ_ONLY_STATE = "25006"


def _lines(exc: BaseException) -> list[str]:
    return [line.strip() for line in str(exc).splitlines() if line.strip()]


def _clean(line: str) -> str:
    """One libpq line, its host named briefly and the prefixes dropped (psycopg's
    "- host: ..., hostaddr: ...:" of each attempt, severities)."""
    line = _ATTEMPT.sub("", line)
    for prefix in _PREFIXES:
        if line.startswith(prefix):
            line = line[len(prefix) :]
    where = ""
    if m := _SERVER_AT.match(line):
        where, line = f"{m.group(1)}:{m.group(2)}", line[m.end() :]
    elif m := _SOCKET_AT.match(line):
        where, line = m.group(1), line[m.end() :]
    for prefix in _PREFIXES:
        if line.startswith(prefix):
            line = line[len(prefix) :]
    if where and line.lower().rstrip(".") == "connection refused":
        return f"connection to {where} refused"
    return f"{line} (at {where})" if where else line


def _attempts(exc: BaseException) -> list[str]:
    """Each connection attempt's cause, once each, in the order tried."""
    causes: list[str] = []
    lines = _lines(exc)
    for line in [line for line in lines if line.startswith("- host:")] or lines:
        if "connection to server" in line:
            cause = _clean(line)
            if cause not in causes:
                causes.append(cause)
    return causes


def _grouped(causes: list[str]) -> list[str]:
    """The same cause on several hosts said once, naming them all."""
    places: dict[str, list[str]] = {}
    for cause in causes:
        m = _AT.match(cause)
        text, where = (m.group(1), m.group(2)) if m else (cause, "")
        places.setdefault(text, []).append(where)
    return [
        f"{text} (at {', '.join(where)})" if any(where) else text for text, where in places.items()
    ]


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_auth_failure(exc: BaseException) -> bool:
    """True when ``exc`` is the server refusing the login (user or password)."""
    if _sqlstate(exc) in _AUTH_STATES:
        return True
    text = str(exc)
    return "password authentication failed" in text or "no password supplied" in text


def is_read_only(exc: BaseException) -> bool:
    """True when every host ``exc`` names was passed over as read-only, or a write was
    refused in a read-only transaction (a standby, or a read-only login)."""
    if _sqlstate(exc) == _READ_ONLY_STATE:
        return True
    causes = _attempts(exc)
    return bool(causes) and all("read-only" in c or "hot standby" in c for c in causes)


def first_cause(exc: BaseException) -> str:
    """The one line that says what went wrong: the server's own message for a
    statement, the most telling connection failure (a refused login before a refused
    port) otherwise."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if isinstance(primary, str) and primary:
        return redact_conninfo(primary.splitlines()[0])
    attempts = _grouped(_attempts(exc))
    if len(attempts) > 1:
        # Several hosts: the telling causes first (a refused login before a refused port).
        attempts.sort(key=lambda c: not any(t in c for t in _TELLING[:3]))
        return redact_conninfo("; ".join(attempts))
    lines = attempts or [
        _clean(line)
        for line in _lines(exc)
        if not line.startswith(("Is the server running", "Multiple connection attempts"))
    ]
    return redact_conninfo(lines[0] if lines else type(exc).__name__)


def store_error(exc: BaseException, where: str) -> OutboxError:
    """``exc`` (a psycopg error) as a one-line typed error naming ``where`` (the store,
    without credentials); the whole text goes to the DEBUG log."""
    log.debug("PostgreSQL outbox %s: %s", where, redact_conninfo(str(exc)))
    cause = first_cause(exc)
    if is_auth_failure(exc):
        return OutboxLoginRefused(f"PostgreSQL outbox: {cause}", endpoint=where)
    return OutboxError(f"PostgreSQL outbox: {cause}", endpoint=where)
