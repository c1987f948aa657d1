"""In-process doubles for users' own tests: no broker program, no network namespace.

``from msgsafe.testing import MemoryBroker`` is the broker ``memory://NAME`` connects
to, with fault injection. :mod:`msgsafe.testing.faultproxy` is a TCP fault proxy to put
between a client and any broker (black-hole, reset, latency, bandwidth, cut mid-frame).
Real brokers on loopback are started by :mod:`msgsafe.cluster`.
"""

from msgsafe.adapters.memory.broker import MemoryBroker

__all__ = ["MemoryBroker"]
