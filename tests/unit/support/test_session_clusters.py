"""Which test is a session cluster's last user (tests/support/session_clusters.py): a
module whose conftest asks for the cluster with ``getfixturevalue`` uses it too."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support import session_clusters


@dataclass
class _Item:
    """What :func:`session_clusters.plan` reads of a collected test."""

    nodeid: str
    path: Path
    fixturenames: list[str] = field(default_factory=list)


def _module(root: Path, relative: str, source: str = "") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def _last_users(items: list[_Item], root: Path) -> dict[str, str]:
    session_clusters.plan(cast(list[pytest.Item], items), root)
    return dict(session_clusters._last_user)


def test_a_module_using_a_cluster_through_its_conftest_keeps_it_to_its_last_test(
    tmp_path: Path,
) -> None:
    static = _module(tmp_path, "tests/integration/test_static.py")
    cased = _module(tmp_path, "tests/contract/test_cases.py")
    _module(
        tmp_path,
        "tests/contract/conftest.py",
        'def case(request):\n    return request.getfixturevalue("rabbit_urls")\n',
    )
    items = [
        _Item("tests/integration/test_static.py::test_a", static, ["rabbit_urls"]),
        _Item("tests/contract/test_cases.py::test_b", cased, ["case"]),
        _Item("tests/contract/test_cases.py::test_c", cased, ["case"]),
    ]
    assert _last_users(items, tmp_path)["rabbit_cluster"] == "tests/contract/test_cases.py::test_c"


def test_other_strings_of_a_conftest_and_conftests_above_the_root_do_not_count(
    tmp_path: Path,
) -> None:
    root = tmp_path / "project"
    # Above the root: not the project's.
    _module(tmp_path, "conftest.py", 'x = request.getfixturevalue("kafka_cluster")\n')
    _module(root, "tests/conftest.py", 'LANES = ("kafka", "other")\nNAME = "kafka_cluster"\n')
    first = _module(root, "tests/integration/test_first.py")
    second = _module(root, "tests/integration/test_second.py")
    items: list[Any] = [
        _Item("tests/integration/test_first.py::test_a", first, ["kafka"]),
        _Item("tests/integration/test_second.py::test_b", second, []),
    ]
    assert _last_users(items, root) == {"kafka_cluster": "tests/integration/test_first.py::test_a"}
