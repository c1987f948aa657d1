"""How tests/conftest.py splits the broker tests between the two lanes of ``make test``:
by module (a path or a fixture naming Kafka or Spark), by a ``[kafka]`` parameter, and by
a ``lane`` marker on a test or a module, which wins over both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests import conftest


@dataclass
class _Callspec:
    id: str


@dataclass
class _Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)
    lane: str | None = None
    callspec: _Callspec | None = None

    def get_closest_marker(self, name: str) -> Any:
        if name != "lane" or self.lane is None:
            return None
        return pytest.mark.lane(self.lane).mark


class _Hook:
    def __init__(self) -> None:
        self.deselected: list[_Item] = []

    def pytest_deselected(self, items: list[_Item]) -> None:
        self.deselected.extend(items)


class _Config:
    def __init__(self, lane: str | None) -> None:
        self.lane = lane
        self.hook = _Hook()

    def getoption(self, name: str) -> str | None:
        assert name == "--lane"
        return self.lane


def _items() -> list[_Item]:
    return [
        _Item("tests/chaos/test_kafka_matrix.py::test_cell"),
        _Item("tests/integration/x/test_y.py::test_a", fixturenames=["kafka_cluster"]),
        _Item("tests/integration/x/test_y.py::test_b"),  # with test_a: one module, one lane
        _Item("tests/chaos/test_nemesis.py::test_slice[rabbitmq]", callspec=_Callspec("rabbitmq")),
        _Item("tests/chaos/test_nemesis.py::test_slice[kafka]", callspec=_Callspec("kafka")),
        _Item("tests/chaos/test_nemesis.py::test_slice[qpid]", lane="kafka"),
        _Item("tests/chaos/test_nemesis.py::test_slice[artemis]", lane="kafka"),
        _Item("tests/chaos/test_spark_x.py::test_chosen_other", lane="other"),
        _Item("tests/chaos/test_amqp10_matrix.py::test_cell"),
    ]


def _lane(name: str) -> list[str]:
    items: list[Any] = _items()
    config = _Config(name)
    conftest.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    return [item.nodeid.split("::", 1)[1] for item in items]


def test_a_lane_marker_moves_a_test_and_the_rest_keeps_its_lane() -> None:
    assert _lane("kafka") == [
        "test_cell",
        "test_a",
        "test_b",
        "test_slice[kafka]",
        "test_slice[qpid]",
        "test_slice[artemis]",
    ]
    assert _lane("other") == ["test_slice[rabbitmq]", "test_chosen_other", "test_cell"]


def test_without_a_lane_every_test_runs() -> None:
    items: list[Any] = _items()
    conftest.pytest_collection_modifyitems(_Config(None), items)  # type: ignore[arg-type]
    assert len(items) == len(_items())


def test_an_unknown_lane_is_a_usage_error() -> None:
    items: list[Any] = [_Item("tests/chaos/test_x.py::test_y", lane="fast")]
    with pytest.raises(pytest.UsageError, match="lane\\('fast'\\)"):
        conftest.pytest_collection_modifyitems(_Config("kafka"), items)  # type: ignore[arg-type]
