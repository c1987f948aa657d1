"""Session clusters stopped once the last module that needs them has run.

An idle broker cluster still costs CPU, taken from every test that runs after it (measured
on two cores: an idle 3-node Apache Kafka about a third of a core, a Qpid HA group a
quarter, an Artemis pair a fifth). A session fixture of :data:`NAMES` hands its ``stop``
to :func:`release_after_last_user`; the root conftest plans, from the collected tests,
which test closes the last module that uses it and calls :func:`after_test` after each
teardown, which stops what that test was the last user of.

A module uses a fixture when one of its tests has it (or one of its dependents) in its
fixture closure, or when the module's source names one of them in quotes: tests that call
``request.getfixturevalue("kafka_cluster")`` are invisible to collection. So are fixtures
of a ``conftest.py`` that ask that way (the contract suite's broker cases): a module uses
what a conftest of its folder or a folder above (up to the root) asks for with
``getfixturevalue``. Whole modules, because a module-scoped fixture may use the cluster in
its own teardown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

#: Each released session fixture, and the fixtures that reach it through it (a test that
#: asks for any of them needs the cluster).
NAMES: dict[str, tuple[str, ...]] = {
    "kafka_cluster": ("kafka_cluster", "kafka", "kafka_url", "kafka_topic", "chaos_kafka"),
    "rabbit_cluster": ("rabbit_cluster", "rabbit", "rabbit_urls", "rabbit_proxies"),
    "artemis_session": ("artemis_session", "artemis_pair"),
    "pg_pair_session": ("pg_pair_session", "pg_pair"),
    "net_rabbit": ("net_rabbit",),
    "spark": ("spark",),
    "schema_registry": ("schema_registry", "registry", "registry_url"),
}

_last_user: dict[str, str] = {}
_stops: dict[str, Callable[[], None]] = {}


def _asked_by_conftests(module: Path, root: Path, cache: dict[Path, set[str]]) -> set[str]:
    """The names of :data:`NAMES` that a ``conftest.py`` of ``module``'s folder, or of a
    folder above it up to ``root``, asks for with ``getfixturevalue`` (read once a
    folder). Only that call counts: a conftest's other strings (a lane named "kafka")
    say nothing of the clusters its modules use."""
    asked: set[str] = set()
    for folder in module.parents:
        if folder not in cache:
            conftest = folder / "conftest.py"
            source = conftest.read_text(errors="replace") if conftest.is_file() else ""
            cache[folder] = {
                name
                for name, aliases in NAMES.items()
                if any(f'getfixturevalue("{alias}")' in source for alias in aliases)
            }
        asked |= cache[folder]
        if folder == root:
            break
    return asked


def plan(items: Sequence[pytest.Item], root: Path) -> None:
    """Remember, for each of :data:`NAMES`, the node id of the last test of the last
    module (in run order) that uses it. ``root``: the folder above which no conftest
    applies (pytest's rootdir)."""
    _last_user.clear()
    last_of_module: dict[str, str] = {}
    users: dict[str, str] = {}
    #: Per module, the names its source (or a conftest above it) asks for by string.
    named: dict[str, set[str]] = {}
    conftests: dict[Path, set[str]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        last_of_module[module] = item.nodeid
        if module not in named:
            path = Path(str(item.path))
            source = path.read_text(errors="replace") if path.is_file() else ""
            named[module] = {
                name
                for name, aliases in NAMES.items()
                if any(f'"{alias}"' in source for alias in aliases)
            } | _asked_by_conftests(path, root, conftests)
        for name, aliases in NAMES.items():
            if name in named[module] or any(alias in item.fixturenames for alias in aliases):
                users[name] = module
    for name, module in users.items():
        _last_user[name] = last_of_module[module]


def release_after_last_user(request: pytest.FixtureRequest, stop: Callable[[], None]) -> None:
    """Register ``stop`` of the session fixture asking (one of :data:`NAMES`): it runs
    after the teardown of the test that :func:`plan` found to be its last user. The
    fixture's own finalizer still runs at the session's end; ``stop`` must be idempotent."""
    _stops[request.fixturename] = stop


def after_test(item: pytest.Item) -> None:
    """Stop every registered cluster whose last user ``item`` was."""
    for name in [n for n, last in _last_user.items() if last == item.nodeid]:
        stop = _stops.pop(name, None)
        if stop is not None:
            log.info("%s: stopped after its last user, %s", name, item.nodeid)
            stop()
