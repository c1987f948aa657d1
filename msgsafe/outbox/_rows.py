"""Envelope <-> row conversion shared by the SQLite and PostgreSQL stores, and the
entries the stores list for the CLI."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError
from msgsafe.message import Envelope

__all__ = [
    "OutboxEntry",
    "QuarantinedEntry",
    "decode_headers",
    "encode_headers",
    "make_envelope",
    "redact_target",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})
_USERINFO = re.compile(r"^([a-z0-9+.-]+://)[^@/]*@", re.IGNORECASE)


def encode_headers(headers: Mapping[str, str]) -> str | None:
    """Headers as compact JSON, or None when there are none (the common case)."""
    if not headers:
        return None
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)


def decode_headers(text: str | None) -> Mapping[str, str]:
    """The inverse of :func:`encode_headers`."""
    if not text:
        return _EMPTY
    value = json.loads(text)
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def make_envelope(
    message_id: str,
    destination: str,
    key: bytes | None,
    headers: str | None,
    body: bytes,
    created_at: float,
) -> Envelope:
    """Rebuild a stored envelope exactly as it was put (same id, same creation time)."""
    return Envelope(
        destination=destination,
        body=bytes(body),
        message_id=message_id,
        key=None if key is None else bytes(key),
        headers=decode_headers(headers),
        created_at=created_at,
    )


def redact_target(target: str | None) -> str:
    """The target URL without credentials, as rows store it."""
    if not target:
        return ""
    try:
        return parse_url(target).redacted()
    except ConfigurationError:
        return _USERINFO.sub(r"\1", target)


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A waiting message as :meth:`list` shows it."""

    envelope: Envelope
    target: str
    attempts: int
    ready_at: float  #: epoch seconds; 0 means ready now
    last_error: str | None


@dataclass(frozen=True, slots=True)
class QuarantinedEntry:
    """A message moved aside after a permanent error."""

    envelope: Envelope
    target: str
    attempts: int
    error: str
    quarantined_at: float
