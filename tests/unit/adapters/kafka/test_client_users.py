"""The Kafka client's users reach the adapter through its public modules only.

The confluent-kafka drop-in (``msgsafe/compat/``) and the Spark sink (``msgsafe/spark/``)
produce on :class:`msgsafe.adapters.kafka.client.KafkaClient`; its settings, errors and
headers are the adapter's business. A private module of the adapters imported there
(``adapters._config``, ``adapters.kafka._errors``, ...) would be a second copy of
that business starting again; and librdkafka's errors are translated inside
``msgsafe/adapters/kafka/`` alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[4] / "msgsafe"
USERS = ("compat", "spark")


def _imported_modules(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (at the top or inside a function), by its full
    name; ``from a import b`` yields ``a.b`` too, since ``b`` may be a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _private_adapter_module(name: str) -> bool:
    parts = name.split(".")
    return parts[:2] == ["msgsafe", "adapters"] and any(p.startswith("_") for p in parts[2:])


def _sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (PACKAGE / folder).rglob("*.py"))


def test_the_lane_users_import_no_private_module_of_the_adapters() -> None:
    found = []
    for path in _sources(*USERS):
        private = {name for name in _imported_modules(path) if _private_adapter_module(name)}
        # ``from msgsafe.adapters._config import x`` names the module once, not x again.
        found.extend(
            f"{path.relative_to(PACKAGE.parent)}: {name}"
            for name in sorted(private)
            if name.rpartition(".")[0] not in private
        )
    assert not found, "use msgsafe.adapters.kafka.client (or another public module):\n" + "\n".join(
        found
    )


def test_kafka_errors_are_translated_inside_the_kafka_adapter_only() -> None:
    kafka = PACKAGE / "adapters" / "kafka"
    found = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if kafka not in path.parents
        and "msgsafe.adapters.kafka._errors" in set(_imported_modules(path))
    ]
    assert not found, "translate through KafkaClient.error instead:\n" + "\n".join(found)


def test_the_checks_see_an_import_of_a_private_module() -> None:
    """The two checks above would pass vacuously if they missed an import form."""
    sample = PACKAGE / "adapters" / "kafka" / "client.py"
    names = set(_imported_modules(sample))
    assert "msgsafe.adapters.kafka._errors" in names
    assert any(_private_adapter_module(name) for name in names)
