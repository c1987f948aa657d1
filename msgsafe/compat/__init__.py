"""Drop-in wrappers for code written against confluent-kafka or pika.

Change one import line and a legacy producer gains msgsafe's promise (broker-confirmed
or stored in the local outbox, never silently lost), fail-over across the listed hosts
and publisher confirms::

    from confluent_kafka import Producer                  # before
    from msgsafe.compat.confluent_kafka import Producer   # after

    import pika                                           # before
    from msgsafe.compat import pika                       # after

Each submodule needs its client library (the ``kafka`` / ``rabbitmq`` extra) and is
imported only when named. See ``docs/migration.md`` for exactly what changes.

- :mod:`msgsafe.compat.pika` — pika's names, with msgsafe's ``BlockingConnection`` and
  ``BlockingChannel``;
  :mod:`._pika_config` maps pika's parameters and errors.
- :mod:`msgsafe.compat.confluent_kafka` — confluent-kafka's names, with msgsafe's
  ``Producer``; :mod:`._kafka_config` maps the librdkafka settings.
- :mod:`._common` — the warning category and header conversion both share.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from msgsafe.compat._common import CompatWarning

__all__ = ["CompatWarning", "confluent_kafka", "pika"]


def __getattr__(name: str) -> ModuleType:
    # ``from msgsafe.compat import pika`` imports the submodule on demand, so a user of
    # one library never needs the other.
    if name in ("confluent_kafka", "pika"):
        return importlib.import_module(f"msgsafe.compat.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
