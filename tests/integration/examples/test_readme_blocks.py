"""The README's Python blocks run as written against the suite's RabbitMQ cluster, in
order, in one process (only the URL and the queue name replaced): they send, confirm with
a guarantee, read back, test with the memory broker, count, trace and consume with
asyncio. The Spark block needs a SparkSession and a streaming DataFrame, which the README
does not build; tests/integration/spark runs the same sink."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import ROOT, run_python

pytestmark = pytest.mark.integration

_URL = '"amqp://guest:guest@127.0.0.1:5672/%2F"'


def _blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", readme, re.S)


def test_every_readme_block_runs_against_rabbitmq(rabbit_urls: RabbitUrls) -> None:
    blocks = [b for b in _blocks() if "df.writeStream" not in b]
    assert len(blocks) >= 7, "the README lost its Python blocks"
    code = "\n".join(blocks)
    assert _URL in code and '"orders"' in code
    queue = f"readme-{uuid.uuid4().hex[:8]}"
    code = code.replace(_URL, repr(rabbit_urls.cluster)).replace('"orders"', repr(queue))
    result = run_python("-c", code, label="README blocks")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    # The first block: confirmed, replicated (a quorum queue), read back.
    assert lines[:2] == ["Status.CONFIRMED", "Guarantee.REPLICATED"], result.stdout
    assert lines[2].endswith("b'{\"id\": 1}'"), result.stdout
    # send_batch: 1000 confirmed, none stored.
    assert lines[3] == "1000 0 Status.CONFIRMED", result.stdout
    # The asyncio consumer reads the batch (and whatever the counting block left).
    assert sum(line.startswith('b\'{"id":') for line in lines[4:]) >= 1000, result.stdout
