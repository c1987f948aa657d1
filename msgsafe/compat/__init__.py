"""Drop-in replacements for legacy producer code: change one import line.

::

    from confluent_kafka import Producer                  # before
    from msgsafe.compat.confluent_kafka import Producer   # after

    import pika                                           # before
    from msgsafe.compat import pika                       # after

Each submodule needs its client library (the ``kafka`` / ``rabbitmq`` extra) and is
imported only when named. See ``docs/migration.md``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from msgsafe.sdk.compat import CompatWarning

__all__ = ["CompatWarning", "confluent_kafka", "pika"]


def __getattr__(name: str) -> ModuleType:
    # ``from msgsafe.compat import pika`` imports the submodule on demand, so a user of
    # one library never needs the other.
    if name in ("confluent_kafka", "pika"):
        return importlib.import_module(f"msgsafe.compat.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
