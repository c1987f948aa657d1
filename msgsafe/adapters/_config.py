"""Adapter configuration: frozen, keyword-only dataclasses built from URL query options
and keyword arguments, validated at construction, unknown names refused (a typo must
not be silently ignored), secrets hidden from ``repr``."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError

__all__ = ["TransportOptions", "build_config"]

C = TypeVar("C", bound="TransportOptions")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportOptions:
    """Options every adapter understands. Adapters subclass this with their own."""

    #: Seconds to establish a connection to one endpoint before trying the next.
    connect_timeout: float = 5.0
    #: Seconds a publish may wait for the broker's confirm before it fails transiently.
    confirm_timeout: float = 10.0
    #: Messages in flight (sent, not yet confirmed) at most.
    max_in_flight: int = 1000
    #: Largest body accepted, in bytes; bigger ones raise MessageTooLarge before sending.
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


def _coerce(name: str, value: object, hint: Any) -> object:
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
    if hint is int:
        if isinstance(value, bool):
            raise ConfigurationError(f"option {name!r} must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigurationError(f"option {name!r} must be an integer")
    if hint is float:
        if isinstance(value, bool):
            raise ConfigurationError(f"option {name!r} must be a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigurationError(f"option {name!r} must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigurationError(f"option {name!r} must be a string")
    return value


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
        name: _coerce(name, value, hints[name]) for name, value in merged.items()
    }
    try:
        return cls(**values)
    except ConfigurationError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"invalid options for {url.scheme}://: {exc}") from None
