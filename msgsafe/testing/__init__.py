"""Test helpers that are public API: the in-process broker with fault injection, and
harnesses that start real brokers on loopback for integration tests.

``from msgsafe.testing import MemoryBroker`` is the double for users' own tests.
The harness modules (``msgsafe.testing.rabbitmq``, ``msgsafe.testing.kafka``,
``msgsafe.testing.faultproxy``) are imported explicitly; they need the brokers'
programs installed, not only Python packages.
"""

from msgsafe.adapters.memory.broker import MemoryBroker

__all__ = ["MemoryBroker"]
