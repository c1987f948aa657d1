"""Counting for the Kafka wrapper's direct-lane tests: every produce, every delivery
callback, every id read back, and the per-key order of first arrivals."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

from msgsafe.message import Delivery

#: Outcomes a callback may report: the promise allows nothing else.
SAFE_OUTCOMES = frozenset({"confirmed", "stored"})


@dataclass
class LaneLedger:
    """What a test produced through ``msgsafe.compat.confluent_kafka`` and what came of it.

    Each value is ``b"<key>:<n>"`` (the n-th message of its key), so the order of a key
    can be read back from the records; ids come from the callbacks' ``message_id()``.
    """

    produced: int = 0
    per_key: collections.Counter[str] = field(default_factory=collections.Counter)
    #: message id -> "confirmed", "stored" or the error's name
    outcomes: dict[str, str] = field(default_factory=dict)
    repeated_callbacks: int = 0
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    first_seen: list[tuple[str, int]] = field(default_factory=list)  #: (key, n) in arrival order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, err: Any, msg: Any) -> None:
        """The delivery callback of every produce."""
        status = "stored" if msg.stored() else ("confirmed" if err is None else err.name())
        with self.lock:
            if msg.message_id() in self.outcomes:
                self.repeated_callbacks += 1
            self.outcomes[msg.message_id()] = status

    def produce(self, producer: Any, topic: str, count: int, *, keys: int = 16) -> None:
        """``count`` keyed messages, serving callbacks every 200 and when the queue is full."""
        for i in range(count):
            key = f"k{i % keys}"
            number = self.per_key[key]
            self.per_key[key] += 1
            value = f"{key}:{number}".encode()
            while True:
                try:
                    producer.produce(topic, value, key=key, on_delivery=self.report)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.produced += 1
            if i % 200 == 199:
                producer.poll(0)

    def record(self, delivery: Delivery) -> None:
        """``consume_until``'s on_delivery: count each id, note first arrivals."""
        message_id = delivery.message_id
        if message_id is None:
            return
        if message_id not in self.received:
            key, number = delivery.body.decode().rsplit(":", 1)
            self.first_seen.append((key, int(number)))
        self.received[message_id] += 1

    def summary(self, name: str) -> str:
        outcomes = collections.Counter(self.outcomes.values())
        return (
            f"[{name}] produced={self.produced} callbacks={len(self.outcomes)} {dict(outcomes)} "
            f"received={sum(self.received.values())} unique={len(self.received)} "
            f"lost={len(self.lost)} duplicates={self.duplicates} unknown={len(self.unknown)}"
        )

    @property
    def lost(self) -> set[str]:
        return set(self.outcomes) - set(self.received)

    @property
    def unknown(self) -> set[str]:
        return set(self.received) - set(self.outcomes)

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.received.values())

    def check(self, name: str) -> None:
        """Every produce got one callback saying confirmed or stored; every id arrived;
        duplicates only of known ids; each key's first arrivals in produce order."""
        summary = self.summary(name)
        assert len(self.outcomes) == self.produced, summary
        assert self.repeated_callbacks == 0, summary
        assert set(self.outcomes.values()) <= SAFE_OUTCOMES, summary
        assert not self.lost, summary
        assert not self.unknown, summary
        last: dict[str, int] = {}
        for key, number in self.first_seen:
            assert number > last.get(key, -1), f"{summary}: {key} {number} after {last[key]}"
            last[key] = number
