"""Drop-in wrappers for code written against confluent-kafka or pika.

Change one import line and a legacy producer gains msgsafe's promise (broker-confirmed
or stored in the local outbox, never silently lost), fail-over across the listed hosts
and pipelined confirms::

    from confluent_kafka import Producer                  # before
    from msgsafe.compat.confluent_kafka import Producer   # after

    import pika                                           # before
    from msgsafe.compat import pika                       # after

The modules here are imported lazily (each needs its client library); the public import
path is :mod:`msgsafe.compat`. See ``docs/migration.md`` for exactly what changes.
"""

from __future__ import annotations

from msgsafe.sdk.compat._common import CompatWarning

__all__ = ["CompatWarning"]
