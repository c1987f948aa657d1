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

from tests.support import session_clusters

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
#: move together so a module's own clusters start once. A test (or a module, through
#: ``pytestmark``) that starts only clusters of its own may choose its lane with
#: ``@pytest.mark.lane("kafka")``, to even out the two lanes' wall time.
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


def _chosen_lane(item: pytest.Item) -> str | None:
    """The lane a ``lane`` marker on the test, its class or its module names, if any."""
    marker = item.get_closest_marker("lane")
    if marker is None:
        return None
    (name,) = marker.args
    if name not in LANES:
        raise pytest.UsageError(f"{item.nodeid}: lane({name!r}) is not one of {LANES}")
    return str(name)


def _kafka_case(item: pytest.Item) -> bool:
    """A test of another module run with a Kafka parameter (``[kafka]``,
    ``[kafka-expired]``, ``[kafka:docs/...]``): it joins the Kafka lane on its own, so
    that the other lane never starts a Kafka cluster for it (several such cases ask for
    the session cluster through ``request.getfixturevalue``)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    parts = callspec.id.replace(":", "-").split("-")
    return "kafka" in parts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("--lane")
    if lane is None:
        return
    kafka_modules = {item.nodeid.split("::", 1)[0] for item in items if _kafka_lane(item)}
    keep, drop = [], []
    for item in items:
        chosen = _chosen_lane(item)
        if chosen is not None:
            in_kafka = chosen == "kafka"
        else:
            in_kafka = item.nodeid.split("::", 1)[0] in kafka_modules or _kafka_case(item)
        (keep if in_kafka == (lane == "kafka") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --- session clusters: stopped after their last user (tests/support/session_clusters.py) ---


def pytest_collection_finish(session: pytest.Session) -> None:
    session_clusters.plan(session.items, session.config.rootpath)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    session_clusters.after_test(item)


# --- the JVMs the suite starts ------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # The brokers the suite starts are Java programs that run for minutes under light
    # load: C1 alone compiles them in half the CPU of C1+C2, and an idle 3-node Kafka
    # then costs a third less. Benchmarks, which start brokers outside pytest, keep
    # the JVM's default. JDK_JAVA_OPTIONS reaches every `java` launched, Spark's too.
    os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
