"""What both wrappers share: the warning category, header conversion and ``with``."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from msgsafe.errors import InvalidMessage

__all__ = [
    "ClosesOnExit",
    "CompatWarning",
    "header_text",
    "headers_dict",
    "warn",
]


class CompatWarning(UserWarning):
    """A setting or argument of the wrapped library was overridden or is not carried."""


class ClosesOnExit:
    """``with obj:`` closes ``obj`` on leaving the block when it is still open, as the
    wrapped libraries' connections, channels and producers do."""

    is_open: Any

    def close(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.is_open:
            self.close()


def warn(message: str, *, depth: int = 1) -> None:
    """Warn at the caller of the public wrapper method that is ``depth`` frames above
    this call (1: the function calling ``warn`` is the public method)."""
    warnings.warn(message, CompatWarning, stacklevel=2 + depth)


def header_text(name: object, value: object) -> str:
    """A header value as msgsafe carries it (text).

    ``bytes`` must be UTF-8; numbers and booleans become their text; anything else
    (nested tables, lists, None) raises :class:`InvalidMessage` rather than being
    silently changed.
    """
    if not isinstance(name, str):
        raise InvalidMessage(f"header names must be str, not {type(name).__name__}")
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessage(
                f"header {name!r} is not UTF-8 text; msgsafe carries text header values"
            ) from None
    if isinstance(value, (bool, int, float)):
        return str(value)
    raise InvalidMessage(
        f"header {name!r} has a {type(value).__name__} value; msgsafe carries text, "
        "numbers and UTF-8 bytes"
    )


def headers_dict(
    headers: Mapping[str, object] | Iterable[tuple[str, object]] | None,
) -> dict[str, str]:
    """A header mapping or list of pairs as text; a repeated name keeps its last value."""
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for item in pairs:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise InvalidMessage("headers must be a mapping or a list of (name, value)") from None
        out[name] = header_text(name, value)
    return out
