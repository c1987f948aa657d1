"""Root of the test suite.

Fixture modules live in ``tests/fixtures/``, one per broker family (each starts its own
brokers on loopback and stops them); every module there is loaded as a pytest plugin so
any test folder can use any broker.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if not path.stem.startswith("_")
)


#: What the fast tier never starts: brokers, JVMs, databases, Spark (``make test-fast``
#: sets MSGSAFE_TEST_TIER=fast; a test that needs one belongs in tests/integration).
_SERVERS = {
    "java",
    "beam.smp",
    "rabbitmq-server",
    "postgres",
    "pg_ctl",
    "pg_ctlcluster",
    "initdb",
    "spark-class",
    "spark-submit",
    "tansu",
    "mvn",
}


def _program(args: Any) -> str:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
    return os.path.basename(os.fsdecode(first).split()[0]) if first else ""


@pytest.fixture(autouse=True, scope="session")
def _fast_tier_starts_no_server() -> Iterator[None]:
    """In the fast tier, starting a broker, JVM or database process fails the test."""
    if os.environ.get("MSGSAFE_TEST_TIER") != "fast":
        yield
        return
    real = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        program = _program(args)
        if program in _SERVERS:
            raise AssertionError(
                f"the fast tier starts no server, but this test ran {program!r}: "
                "mark it integration or move it to tests/integration"
            )
        real(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real  # type: ignore[method-assign]


# --- lanes: `make test` runs the broker tests as two concurrent pytest processes -------

#: A module belongs to the Kafka lane when its path names Kafka or Spark or one of its
#: tests uses the session Kafka cluster or a Spark fixture; every other module is in the
#: "other" lane (RabbitMQ, AMQP 1.0 brokers, PostgreSQL, network labs). Whole modules
#: move together so a module's own clusters start once.
LANES = ("kafka", "other")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        choices=LANES,
        default=None,
        help="run only the modules of one lane (scripts/test.sh runs both at once)",
    )


def _kafka_lane(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0].lower()
    if "kafka" in path or "spark" in path:
        return True
    return any(name == "kafka_cluster" or "spark" in name for name in item.fixturenames)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("--lane")
    if lane is None:
        return
    kafka_modules = {item.nodeid.split("::", 1)[0] for item in items if _kafka_lane(item)}
    keep, drop = [], []
    for item in items:
        in_kafka = item.nodeid.split("::", 1)[0] in kafka_modules
        (keep if in_kafka == (lane == "kafka") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
