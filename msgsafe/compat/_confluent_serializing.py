"""``confluent_kafka.SerializingProducer`` on msgsafe's :class:`Producer` drop-in, and
``DeserializingConsumer`` as confluent-kafka ships it.

:class:`SerializingProducer` takes the real class's configuration (``key.serializer``,
``value.serializer``, and their ``.builder`` forms, built and closed the same way by
confluent-kafka's own helpers) and its methods: ``produce(topic, key, value, ...)``
serializes the key, then the value, with a ``SerializationContext(topic, field,
headers)``, and raises ``KeySerializationError`` / ``ValueSerializationError`` as the
real one does, before anything is queued. What it hands on is bytes, so a message the
brokers cannot take now is STORED with its final bytes and schema id, and forwarded as
they are (see ``docs/guides/schemas.md`` for what that means when the schema evolves
meanwhile).

``DeserializingConsumer`` is confluent-kafka's own class: msgsafe's drop-in keeps
confluent-kafka's ``Consumer`` (the consumer's promise is its own commits), and the
deserializing one derives from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

from msgsafe.errors import MissingExtra

try:
    from confluent_kafka import DeserializingConsumer
    from confluent_kafka.error import KeySerializationError, ValueSerializationError
    from confluent_kafka.serialization import MessageField, SerializationContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("kafka", "confluent-kafka") from exc

# NOTE: confluent-kafka's own builders of SerializingProducer's serializers (2.16:
# ``key.serializer.builder``, owned serializers closed on close()); older releases have
# neither, and take ready-made serializers only.
try:
    from confluent_kafka._serde_builder import (
        SharedClusterIdResolver,
        build_serdes,
        close_serdes,
        pop_serde_props,
        propagate_cluster_id_resolver,
    )

    _BUILDERS = True
except ImportError:  # pragma: no cover - older confluent-kafka
    _BUILDERS = False

from msgsafe.compat._kafka_config import DeliveryCallback
from msgsafe.compat._kafka_report import PARTITION_UA
from msgsafe.compat.confluent_kafka import Producer

__all__ = ["DeserializingConsumer", "SerializingProducer"]

_KEY, _VALUE = MessageField.KEY, MessageField.VALUE


class SerializingProducer(Producer):
    """``confluent_kafka.SerializingProducer`` whose messages are confirmed with
    ``acks=all`` or stored in msgsafe's outbox (see the module doc and
    :class:`~msgsafe.compat.confluent_kafka.Producer`)."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._owned_serdes: list[Any] = []
        if _BUILDERS:
            specs, rest = pop_serde_props(dict(conf), "key.serializer", "value.serializer")
            serdes, self._owned_serdes, rest = build_serdes(specs, rest)
        else:  # pragma: no cover - older confluent-kafka
            rest = dict(conf)
            serdes = [rest.pop("key.serializer", None), rest.pop("value.serializer", None)]
        self._key_serializer, self._value_serializer = serdes
        try:
            super().__init__(rest)
            if _BUILDERS:
                propagate_cluster_id_resolver(SharedClusterIdResolver(self.cluster_id), serdes)
        except BaseException:
            owned, self._owned_serdes = self._owned_serdes, []
            with contextlib.suppress(Exception):
                close_serdes(owned)
            raise

    def produce(  # type: ignore[override]
        self,
        topic: str,
        key: Any = None,
        value: Any = None,
        partition: int = PARTITION_UA,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, object] | Iterable[tuple[str, object]] | None = None,
    ) -> None:
        """Serialize ``key`` then ``value`` and queue the message: confluent-kafka's
        ``SerializingProducer.produce``. ``RuntimeError`` once closed and ``TypeError``
        for a topic that is not a str, before the serializers run (they may register
        schemas); ``KeySerializationError`` / ``ValueSerializationError`` wrap what a
        serializer raises, and nothing is queued."""
        if self._closed:
            raise RuntimeError("Producer has been closed")
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        # confluent-kafka types ctx.headers narrower than produce() takes them; they are
        # passed on as given, as its SerializingProducer does.
        ctx = SerializationContext(topic, _KEY, headers)  # type: ignore[arg-type]
        if self._key_serializer is not None:
            try:
                key = self._key_serializer(key, ctx)
            except Exception as exc:
                raise KeySerializationError(exc) from exc
        ctx.field = _VALUE
        if self._value_serializer is not None:
            try:
                value = self._value_serializer(value, ctx)
            except Exception as exc:
                raise ValueSerializationError(exc) from exc
        # Positional, as Producer.produce declares them: this runs for every message.
        Producer.produce(self, topic, value, key, partition, on_delivery, timestamp, headers)

    def close(self, timeout: float = 30.0) -> bool:
        """Close the producer (sends in flight get ``timeout`` to be confirmed, then are
        stored), then the serializers it built from ``.builder`` settings."""
        result = super().close(timeout)
        owned, self._owned_serdes = self._owned_serdes, []
        if owned:
            close_serdes(owned)
        return result
