"""The quickstart against the suite's RabbitMQ cluster, as examples/README.md shows it:
the host-list URL with ``declare=quorum`` so the producer creates the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import run_example

pytestmark = pytest.mark.integration


def test_quickstart_on_rabbitmq(rabbit_urls: RabbitUrls, tmp_path: Path) -> None:
    url = rabbit_urls.cluster + ("&" if "?" in rabbit_urls.cluster else "?") + "declare=quorum"
    result = run_example("quickstart.py", url, home=tmp_path)
    assert result.code == 0, result.stderr
    assert "guest:guest" not in result.stdout + result.stderr
    assert sum(line.endswith(" CONFIRMED") for line in result.lines()) == 4
    assert result.lines()[-1] == "sent 3 · received 3 · duplicates dropped 1"


def test_quickstart_on_rabbitmq_amqp10(rabbit_urls: RabbitUrls, tmp_path: Path) -> None:
    url = rabbit_urls.amqp10[0] + "?declare=quorum"
    result = run_example("quickstart.py", url, home=tmp_path)
    assert result.code == 0, result.stderr
    assert result.lines()[-1] == "sent 3 · received 3 · duplicates dropped 1"
