"""Randomized, composed faults on a real cluster, with a checker: ``msgsafe nemesis``.

- :mod:`~msgsafe.nemesis.schedule`: the seeded schedule of fault windows (pure);
- :mod:`~msgsafe.nemesis.history`: the JSON-lines history every process of a run writes;
- :mod:`~msgsafe.nemesis.checker`: lost, unexpected, duplicates, per-key order, recovery
  time and the series of the picture, from that history;
- :mod:`~msgsafe.nemesis.picture`: the run as an SVG, fault windows shaded;
- :mod:`~msgsafe.nemesis.worker`: the producer and consumer processes of a run;
- :mod:`~msgsafe.nemesis.runner`: starts the cluster (:mod:`msgsafe.cluster`), the
  workers and the faults, heals, drains, reads back and checks.
"""

from __future__ import annotations
