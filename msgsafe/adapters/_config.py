"""Adapter configuration: frozen, keyword-only dataclasses built from URL query options
and keyword arguments, validated at construction, unknown names refused (a typo must
not be silently ignored), secrets hidden from ``repr``.

Also the one size check every transport makes before sending (:func:`size_error`,
:func:`oversized`, against :attr:`TransportOptions.size_limit`): a message over the
limit fails alone with :class:`~msgsafe.errors.MessageTooLarge`, before the broker could
refuse it in a way that hurts the messages beside it.

And how a destination name is shown in the error of an adapter's name check
(:func:`shown_destination`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError, MessageTooLarge
from msgsafe.message import Batch, Envelope

__all__ = [
    "TransportOptions",
    "build_config",
    "oversized",
    "shown_destination",
    "size_error",
    "to_number",
]

C = TypeVar("C", bound="TransportOptions")
N = TypeVar("N", int, float)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportOptions:
    """Options every adapter understands. Adapters subclass this with their own."""

    #: Seconds to establish a connection to one endpoint before trying the next; when
    #: every endpoint failed its latest attempt, sends fail (or are STORED) at once.
    connect_timeout: float = 2.0
    #: Seconds a publish may wait for the broker's confirm before it fails transiently.
    confirm_timeout: float = 10.0
    #: Messages in flight (sent, not yet confirmed) at most.
    max_in_flight: int = 1000
    #: Largest message accepted, in bytes (body, key and headers, as
    #: :attr:`~msgsafe.message.Envelope.size` counts); bigger ones fail with
    #: MessageTooLarge before sending.
    max_message_size: int = 8 * 1024 * 1024
    #: Verify the broker's TLS certificate and host name. Turning it off is explicit.
    tls_verify: bool = True
    #: CA bundle for TLS verification (None: the system's trust store).
    tls_ca_file: str | None = None
    #: Client certificate and key for mutual TLS.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "confirm_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0")
        if self.max_in_flight < 1:
            raise ConfigurationError("max_in_flight must be >= 1")
        if self.max_message_size < 1:
            raise ConfigurationError("max_message_size must be >= 1")

    @property
    def size_limit(self) -> int:
        """The largest message the transport sends: ``max_message_size``, or less where
        the broker's own limit is lower (an adapter's options say so by overriding this)."""
        return self.max_message_size


def size_error(envelope: Envelope, limit: int, endpoint: str) -> MessageTooLarge | None:
    """The error for ``envelope`` when its body, key and headers (as
    :attr:`~msgsafe.message.Envelope.size` counts them) pass ``limit`` bytes, else None.

    ``limit`` is the transport's :attr:`TransportOptions.size_limit`, read once: this
    runs for every message.
    """
    key = envelope.key
    size = len(envelope.body) if key is None else len(envelope.body) + len(key)
    if envelope.headers:  # Envelope.size walks the headers; most envelopes have none
        size = envelope.size
    if size <= limit:
        return None
    return _too_large(size, limit, envelope.message_id, endpoint)


def oversized(batch: Batch, limit: int, endpoint: str) -> dict[int, MessageTooLarge]:
    """The messages of ``batch`` that :func:`size_error` refuses, by index, with their
    errors (empty at once when the largest body and the largest key fit together)."""
    bodies, keys = batch.bodies, batch.keys
    fixed = sum(len(k) + len(v) for k, v in batch.headers.items()) if batch.headers else 0
    # map/filter: C loops, this runs over every message of every batch.
    longest_key = 0 if keys is None else max(map(len, filter(None, keys)), default=0)
    if fixed + longest_key + max(map(len, bodies), default=0) <= limit:
        return {}
    found: dict[int, MessageTooLarge] = {}
    for index, body in enumerate(bodies):
        key = None if keys is None else keys[index]
        size = fixed + len(body) + len(key or b"")
        if size > limit:
            found[index] = _too_large(size, limit, batch.message_ids[index], endpoint)
    return found


def _too_large(size: int, limit: int, message_id: str, endpoint: str) -> MessageTooLarge:
    return MessageTooLarge(
        f"message of {size} bytes exceeds the limit of {limit} bytes",
        endpoint=endpoint,
        message_id=message_id,
    )


def shown_destination(destination: str) -> str:
    """``destination`` for an error text: whole when short, else its start and length
    (a name refused for its length would fill the line)."""
    if len(destination) <= 60:
        return repr(destination)
    return f"{destination[:40]!r}... ({len(destination)} characters)"


def coerce(name: str, value: object, hint: Any) -> object:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        empty = value is None or (isinstance(value, str) and value.lower() in ("", "none"))
        if optional and empty:
            return None
        if len(args) != 1:
            return value
        hint = args[0]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise ConfigurationError(f"option {name!r} must be true or false")
    if hint is int or hint is float:
        return to_number(name, value, hint)
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigurationError(f"option {name!r} must be a string")
    return value


def to_number(name: str, value: object, kind: type[N]) -> N:
    """``value`` (a number, or its text) as ``kind`` (int or float), else
    :class:`ConfigurationError` naming option ``name`` (never its value).

    ``bool`` is refused although it is an int; an int never takes a float's fraction.
    """
    if not isinstance(value, bool):
        if isinstance(value, kind) or (kind is float and isinstance(value, int)):
            return kind(value)
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
    wanted = "an integer" if kind is int else "a number"
    raise ConfigurationError(f"option {name!r} must be {wanted}")


def build_config(cls: type[C], url: BrokerUrl, options: Mapping[str, object]) -> C:
    """Build ``cls`` from the URL's query options overlaid by keyword ``options``.

    Strings from the URL are converted to the field's type; an unknown option name or a
    value of the wrong type raises :class:`ConfigurationError` naming the option (never
    its value, which may be a secret).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    merged: dict[str, object] = dict(url.options)
    merged.update(options)
    unknown = sorted(set(merged) - fields)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) for {url.scheme}://: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {
        name: coerce(name, value, hints[name]) for name, value in merged.items()
    }
    # An option given both ways must agree: which one wins would be a silent guess.
    for name in sorted(set(url.options) & set(options)):
        if coerce(name, url.options[name], hints[name]) != values[name]:
            raise ConfigurationError(
                f"option {name!r} is given twice with different values (URL and keyword "
                "argument): give it once"
            )
    try:
        return cls(**values)
    except ConfigurationError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"invalid options for {url.scheme}://: {exc}") from None
