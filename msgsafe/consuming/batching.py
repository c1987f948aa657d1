"""``Consumer.run(handler, inbox=..., batch=BatchPolicy(...))``: how many messages the
inbox may commit in one transaction, and how long a worker waits to gather them.

With a batch policy the handler takes a list: ``handler(deliveries, tx)``, every
delivery of the list new to the inbox, its effects written through ``tx``; msgsafe
records all their ids in that one transaction, commits, then acknowledges each. What the
promise of the single handler call keeps, the batch keeps:

- nothing is acknowledged before its batch's transaction committed;
- an id the inbox holds already is acknowledged without being in the list (its effects
  are not applied twice), and one given twice is in it once;
- per-key order: a batch holds a run of each key's deliveries in arrival order, and a
  key's later deliveries wait for the batch (or the retry) of its earlier ones;
- a batch whose handler raises is rolled back whole and its deliveries are handled one
  at a time (``handler([delivery], tx)``, each in a transaction of its own, with the
  run's retries and dead-letter destination), so one poison message is dead-lettered
  alone and the others are committed; each keeps its attempt count;
- where the inbox counts attempts (a broker that keeps no delivery count), the batch's
  are counted in one statement before the handler is called; a delivery seen before
  (``attempt`` above 1: a retry, or a process that died in its handler) is handled
  alone, so a message that kills its consumer reaches ``max_attempts`` on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from msgsafe.errors import ConfigurationError

__all__ = ["BatchPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPolicy:
    """Up to ``max_messages`` deliveries per handler call and inbox transaction; a worker
    with fewer ready waits up to ``max_wait`` seconds for more (0: takes what is ready,
    never waiting for a batch to fill)."""

    max_messages: int = 100
    max_wait: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max_messages, bool) or not isinstance(self.max_messages, int):
            raise ConfigurationError(f"max_messages must be an int, not {self.max_messages!r}")
        if self.max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        if (
            not isinstance(self.max_wait, (int, float))
            or math.isnan(self.max_wait)
            or self.max_wait < 0
        ):
            raise ConfigurationError(f"max_wait must be seconds >= 0, not {self.max_wait!r}")
