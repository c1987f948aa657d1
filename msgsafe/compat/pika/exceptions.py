"""``pika.exceptions`` through the wrapper: the very classes of pika, re-exported.

``from msgsafe.compat.pika import exceptions`` (or ``import msgsafe.compat.pika.exceptions``)
gives the classes the wrapper raises, so a legacy ``except pika.exceptions.UnroutableError``
matches whether ``pika`` names the wrapper or the library.
"""

from __future__ import annotations

from msgsafe.errors import MissingExtra

try:
    from pika import exceptions as _pe
    from pika.exceptions import *  # noqa: F403 - the whole of pika.exceptions, unchanged
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

#: Every public name of ``pika.exceptions`` (classes are pika's own objects).
__all__ = sorted(
    name
    for name, value in vars(_pe).items()
    if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_")
)
