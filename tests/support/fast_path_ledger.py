"""Counting for the Kafka wrapper's fast-path tests: the loss ledger fed by every
produce's delivery callback and every id read back, and the per-key order of first
arrivals."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from msgsafe.message import Delivery, Status
from tests.support.ledger import Ledger


@dataclass
class FastPathLedger(Ledger):
    """What a test produced through ``msgsafe.compat.confluent_kafka`` and what came of it.

    The wrapper chooses the ids, so an id is ``sent`` when its delivery callback names it:
    ``stored`` or ``confirmed`` is a receipt, an error a failure (by its name). Each value
    is ``b"<key>:<n>"`` (the n-th message of its key), so the order of a key is read back
    from the records into ``positions``.
    """

    produced: int = 0
    per_key: collections.Counter[str] = field(default_factory=collections.Counter)
    repeated_callbacks: int = 0
    arrivals: list[str] = field(default_factory=list)  #: ids in arrival order, copies too

    def on_delivery(self, err: Any, msg: Any) -> None:
        """The delivery callback of every produce."""
        message_id = msg.message_id()
        with self.lock:
            if message_id in self.sent:
                self.repeated_callbacks += 1
            self.sent.add(message_id)
        if msg.stored():
            self.add_receipt(message_id, Status.STORED)
        elif err is None:
            self.add_receipt(message_id, Status.CONFIRMED)
        else:
            with self.lock:
                self.failures[err.name()] += 1

    def produce(self, producer: Any, topic: str, count: int, *, keys: int = 16) -> None:
        """``count`` keyed messages, serving callbacks every 200 and when the queue is full."""
        for i in range(count):
            key = f"k{i % keys}"
            number = self.per_key[key]
            self.per_key[key] += 1
            value = f"{key}:{number}".encode()
            while True:
                try:
                    producer.produce(topic, value, key=key, on_delivery=self.on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.produced += 1
            if i % 200 == 199:
                producer.poll(0)

    def record(self, delivery: Delivery) -> None:
        """``consume_until``'s on_delivery: count each id, note its key and position."""
        message_id = delivery.message_id
        if message_id is None:
            return
        key, number = delivery.body.decode().rsplit(":", 1)
        with self.lock:
            self.positions.setdefault(message_id, (key, int(number)))
            self.received[message_id] += 1
            self.arrivals.append(message_id)

    def report(self, name: str) -> str:
        return (
            f"{super().report(name)} produced={self.produced} "
            f"repeated_callbacks={self.repeated_callbacks}"
        )

    def check(self, name: str) -> None:
        """Every produce got one callback saying confirmed or stored; every id arrived;
        duplicates only of known ids; each key's first arrivals in produce order."""
        summary = self.report(name)
        assert len(self.sent) == self.produced, summary
        assert self.repeated_callbacks == 0, summary
        assert not self.failures, summary
        assert not self.lost, summary
        assert not self.unknown, summary
        late = self.order_violations(self.arrivals)
        assert not late, f"{summary}: {late[:5]}"
