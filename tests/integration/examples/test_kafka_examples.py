"""The examples that need a Kafka broker, against the suite's Apache Kafka cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.commands import run_example

pytestmark = pytest.mark.integration


def test_kafka_keys(kafka_url: str, tmp_path: Path) -> None:
    # The example creates its own topic, as it does for a user.
    result = run_example("kafka_keys.py", kafka_url, home=tmp_path)
    assert result.code == 0, result.stderr
    lines = result.lines()
    assert re.fullmatch(r"created topic keys-[0-9a-f]{8}", lines[0])
    assert lines[1] == "sent 200: CONFIRMED 200"
    # The topic it creates is one doctor rates safe: three replicas on three brokers.
    topic = lines[0].removeprefix("created topic ")
    from msgsafe.adapters.kafka.check import inspect_destination
    from msgsafe.endpoints import parse_url
    from msgsafe.message import Guarantee

    report = inspect_destination(parse_url(kafka_url), topic)
    assert report.guarantee is Guarantee.REPLICATED, report.reasons
    for n in range(1, 5):
        assert f"customer-{n}: received 50 of 50, in order: True" in lines


def test_quickstart_on_kafka(kafka_url: str, tmp_path: Path) -> None:
    result = run_example("quickstart.py", kafka_url, home=tmp_path)
    assert result.code == 0, result.stderr
    assert sum(line.endswith(" CONFIRMED") for line in result.lines()) == 4
    assert result.lines()[-1] == "sent 3 · received 3 · duplicates dropped 1"
