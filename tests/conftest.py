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
