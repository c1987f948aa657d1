"""Declarations a message carries: the exchanges, queues and bindings to declare before it
is published, wherever and whenever that happens.

A publisher that declares its destination on every publish (kombu's
``Producer.publish(..., declare=[queue])``, what Celery does for each task) expects the
queue to exist once its message is accepted. A message stored in the outbox while the
broker was away is published later, possibly by another process (a forwarder sidecar)
that knows nothing of the publisher's routing: the declarations travel with the message,
in the :data:`DECLARE_HEADER` header (JSON), and the RabbitMQ transport runs them on a
side channel before it publishes the message (once per transport and declaration set,
see :mod:`~msgsafe.adapters.rabbitmq._side`). The header is not published.

Pure data and its codec, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from msgsafe.errors import InvalidMessage

__all__ = ["DECLARE_HEADER", "Declaration", "decode", "encode", "queues_of"]

#: Header holding the declarations of a message (JSON, see :func:`encode`).
DECLARE_HEADER = "msgsafe-amqp-declare"

Kind = Literal["exchange", "queue", "bind", "exchange_bind"]

#: Argument value types a declaration may carry (JSON's, as AMQP tables hold them).
_SCALARS = (str, int, bool, type(None))


@dataclass(frozen=True, slots=True)
class Declaration:
    """One AMQP 0-9-1 declaration.

    ``kind``: ``exchange`` (``name``, ``type``), ``queue`` (``name``, ``exclusive``),
    ``bind`` (queue ``name`` to ``source`` exchange with ``routing_key``) or
    ``exchange_bind`` (exchange ``name`` to ``source``). ``arguments`` is the AMQP
    argument table (``x-queue-type``...).
    """

    kind: Kind
    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    exclusive: bool = False
    source: str = ""
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == "exchange":
            out.update(type=self.type, durable=self.durable, auto_delete=self.auto_delete)
        elif self.kind == "queue":
            out.update(durable=self.durable, auto_delete=self.auto_delete, exclusive=self.exclusive)
        else:
            out.update(source=self.source, routing_key=self.routing_key)
        if self.arguments:
            out["arguments"] = dict(self.arguments)
        return out


def encode(declarations: Iterable[Declaration]) -> str:
    """The header value of ``declarations`` (compact JSON, in declaring order). Raises
    :class:`InvalidMessage` for an argument value JSON cannot carry as it is."""
    items = [d.as_json() for d in declarations]
    for item in items:
        for name, value in item.get("arguments", {}).items():
            if not isinstance(value, _SCALARS):
                raise InvalidMessage(
                    f"declaration argument {name!r} has a {type(value).__name__} value; "
                    "msgsafe carries text, whole numbers and booleans"
                )
    return json.dumps(items, separators=(",", ":"), sort_keys=True)


def decode(text: str) -> tuple[Declaration, ...]:
    """The declarations of a header value. Raises :class:`InvalidMessage` when it is not
    one :func:`encode` wrote."""
    try:
        items = json.loads(text)
        out = []
        for item in items:
            kind = item["kind"]
            if kind not in ("exchange", "queue", "bind", "exchange_bind"):
                raise ValueError(f"unknown kind {kind!r}")
            out.append(
                Declaration(
                    kind=kind,
                    name=str(item["name"]),
                    type=str(item.get("type", "direct")),
                    durable=bool(item.get("durable", True)),
                    auto_delete=bool(item.get("auto_delete", False)),
                    exclusive=bool(item.get("exclusive", False)),
                    source=str(item.get("source", "")),
                    routing_key=str(item.get("routing_key", "")),
                    arguments=dict(item.get("arguments") or {}),
                )
            )
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidMessage(f"unreadable {DECLARE_HEADER} header: {exc}") from exc
    return tuple(out)


def queues_of(declarations: Iterable[Declaration]) -> tuple[str, ...]:
    """The names of the queues ``declarations`` declare, in order."""
    return tuple(d.name for d in declarations if d.kind == "queue" and d.name)
