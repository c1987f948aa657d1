"""What ``Consumer.run`` is built of: per-key lanes over a pool of worker threads
(:mod:`~msgsafe.consuming.lanes`), batches of them through one inbox transaction
(:mod:`~msgsafe.consuming.batching`), the decision after each handler call — acknowledge,
retry, dead-letter, give back (:mod:`~msgsafe.consuming.runner`) — the dead-letter
message (:mod:`~msgsafe.consuming.dead_letter`), the clock its waits go through
(:mod:`~msgsafe.consuming.clock`) and, for ``AsyncConsumer.run``, the inbox's transaction
awaited from the event loop (:mod:`~msgsafe.consuming.async_tx`)."""

from __future__ import annotations

from msgsafe.consuming.batching import BatchPolicy
from msgsafe.consuming.clock import MonotonicClock, RunClock
from msgsafe.consuming.dead_letter import DEAD_LETTER_HEADERS, dead_letter_headers
from msgsafe.consuming.runner import BatchHandler, Handler, OnExhausted

__all__ = [
    "DEAD_LETTER_HEADERS",
    "BatchHandler",
    "BatchPolicy",
    "Handler",
    "MonotonicClock",
    "OnExhausted",
    "RunClock",
    "dead_letter_headers",
]
