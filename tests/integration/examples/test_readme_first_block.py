"""The README's first Python block runs as written against the suite's RabbitMQ cluster
(only its URL and queue name replaced): it sends, confirms with a guarantee, and reads
the message back."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import ROOT, run_python

pytestmark = pytest.mark.integration


def test_the_first_readme_block_runs_against_rabbitmq(rabbit_urls: RabbitUrls) -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", readme, re.S)
    assert found is not None
    code = found.group(1)
    assert '"amqp://guest:guest@127.0.0.1:5672/%2F"' in code and '"orders"' in code
    queue = f"readme-{uuid.uuid4().hex[:8]}"
    code = code.replace('"amqp://guest:guest@127.0.0.1:5672/%2F"', repr(rabbit_urls.cluster))
    code = code.replace('"orders"', repr(queue))
    result = run_python("-c", code, label="README first block")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["Status.CONFIRMED", "Guarantee.REPLICATED"], result.stdout
    assert len(lines) == 3 and lines[2].endswith("b'{\"id\": 1}'"), result.stdout
