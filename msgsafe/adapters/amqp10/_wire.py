"""The one hot call into proton below its public API: transfer pre-encoded bytes.

``Sender.delivery()`` wraps every new delivery in a Python object the adapter never
uses (it matches outcomes by tag); calling the three C functions directly saves that
wrapper on every message. When the binding changes shape, the public API is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["send_bytes"]

try:  # python-qpid-proton >= 0.39 ships its C binding as the top-level module cproton
    from cproton import pn_delivery, pn_link_advance, pn_link_send  # type: ignore[import-untyped]

    def send_bytes(link: Any, tag: str, data: bytes) -> None:
        """Create delivery ``tag`` on ``link``, write ``data`` and complete it."""
        impl = link._impl
        pn_delivery(impl, tag)
        if pn_link_send(impl, data) < 0:
            link.stream(b"")  # let proton raise its own error for the link's state
        pn_link_advance(impl)

except ImportError:  # pragma: no cover - older or repackaged bindings

    def send_bytes(link: Any, tag: str, data: bytes) -> None:
        """Create delivery ``tag`` on ``link``, write ``data`` and complete it."""
        link.delivery(tag)
        link.stream(data)
        link.advance()
