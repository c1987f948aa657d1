"""Root of the test suite.

Fixture modules live in ``tests/fixtures/``, one per broker family (each starts its own
brokers on loopback and stops them); every module there is loaded as a pytest plugin so
any test folder can use any broker.
"""

from __future__ import annotations

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if not path.stem.startswith("_")
)
