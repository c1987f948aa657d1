"""The differential harness: one scenario, run with the real client and with the wrapper
on the same real broker, and what the code observed compared.

A test takes the ``side`` fixture (parametrized ``real`` / ``wrapper``) and calls
``differ(scenario)``: the scenario runs with this side's client and returns what legacy
code can observe (return values, callbacks in order, exception types, consumed headers
and properties, counts) as plain data. On the real side that is recorded; on the
wrapper side it is compared with the real side's (run now if the real run has not
happened in this session), so the wrapper run fails on any difference. An intended
difference is passed as ``intended``: a function turning the real observation into the
wrapper's, whose docstring says why in one line.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster

#: Observations of the real client, by test name.
_REAL: dict[str, Any] = {}


@dataclass(frozen=True)
class Side:
    """One client under test: ``name`` ("real" / "wrapper") and its module."""

    name: str
    module: Any
    make: Callable[..., Any]  #: the client's connection / producer, with the test's config
    config: Any = None  #: what ``make`` connects with (parameters, config dict)

    @property
    def wrapped(self) -> bool:
        return self.name == "wrapper"


def differ(
    request: pytest.FixtureRequest,
    side: Side,
    real: Side,
    scenario: Callable[[Side], Any],
    *,
    intended: Callable[[Any], Any] | None = None,
) -> Any:
    """Run ``scenario`` on ``side``; on the wrapper, assert it observed what the real
    client observed (after ``intended``). Returns the observation."""
    observed = scenario(side)
    name = request.node.originalname
    print(f"\n{name}[{side.name}]: {observed!r}")
    if not side.wrapped:
        _REAL[name] = observed
        return observed
    if name not in _REAL:
        _REAL[name] = scenario(real)
    expected = _REAL[name] if intended is None else intended(_REAL[name])
    assert observed == expected, f"wrapper observed {observed!r}, real client {expected!r}"
    return observed


def rabbit_params(cluster: RabbitCluster) -> list[pika.ConnectionParameters]:
    """pika's parameters for every node of ``cluster``."""
    creds = pika.PlainCredentials(cluster.username, cluster.password)
    return [
        pika.ConnectionParameters("127.0.0.1", cluster.port(i), credentials=creds)
        for i in range(cluster.size)
    ]


def sides(
    make: Callable[[str, Any, Path], Side], cluster: str
) -> tuple[Callable[..., Side], Callable[..., Side]]:
    """The ``side`` (each of "real" and "wrapper") and ``real`` fixtures of a differential
    module whose ``make(name, brokers, tmp_path)`` builds a side on the session fixture
    named ``cluster`` (``kafka_cluster``, ``rabbit_cluster``, ``artemis_pair``)."""

    @pytest.fixture(params=["real", "wrapper"])
    def side(request: pytest.FixtureRequest, tmp_path: Path) -> Side:
        return make(request.param, request.getfixturevalue(cluster), tmp_path)

    @pytest.fixture
    def real(request: pytest.FixtureRequest, tmp_path: Path) -> Side:
        return make("real", request.getfixturevalue(cluster), tmp_path)

    return side, real


def new_topic(cluster: KafkaCluster, prefix: str, partitions: int = 3) -> str:
    """A fresh topic of ``partitions`` on ``cluster``, named ``prefix-<random>``."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    cluster.create_topic(name, partitions=partitions)
    return name
