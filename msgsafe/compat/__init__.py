"""Drop-in wrappers for code written against confluent-kafka, kafka-python, aiokafka,
pika, Celery, aio-pika or python-qpid-proton.

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
  ``Producer`` and ``AIOProducer``; :mod:`._kafka_config` maps the librdkafka settings.
- :mod:`msgsafe.compat.kafka_python` — kafka-python's names, with msgsafe's
  ``KafkaProducer``; :mod:`msgsafe.compat.aiokafka` — aiokafka's, with
  ``AIOKafkaProducer``. Both publish through the confluent-kafka wrapper.
- :mod:`msgsafe.compat.celery` — ``install(app)``: a Celery app's task publishing.
- :mod:`msgsafe.compat.aio_pika` — aio-pika's names, with ``connect`` and
  ``connect_robust`` whose exchanges publish through msgsafe.
- :mod:`msgsafe.compat.proton` — ``BlockingConnection``: proton.utils' sender side.
- :mod:`._common` — the warning category and header conversion both share.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from msgsafe.compat._common import CompatWarning

__all__ = [
    "CompatWarning",
    "aio_pika",
    "aiokafka",
    "celery",
    "confluent_kafka",
    "kafka_python",
    "pika",
    "proton",
]
#: The submodules, each imported only when named (each needs its client library).
_SUBMODULES = frozenset(__all__) - {"CompatWarning"}


def __getattr__(name: str) -> ModuleType:
    # ``from msgsafe.compat import pika`` imports the submodule on demand, so a user of
    # one library never needs the other.
    if name in _SUBMODULES:
        return importlib.import_module(f"msgsafe.compat.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
