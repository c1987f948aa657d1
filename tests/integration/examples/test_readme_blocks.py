"""The README's tour runs as written against the suite's RabbitMQ cluster (only the URL
and the queue name replaced): it sends, confirms with a guarantee and reads back. The
pages of the site run their own blocks in tests/integration/docs/ (the same mechanism:
tests/support/docs_blocks.py)."""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.commands import ROOT, run_python
from tests.support.docs_blocks import groups, parse, program

pytestmark = pytest.mark.integration


def test_the_readme_tour_runs_against_rabbitmq(rabbit_urls: RabbitUrls) -> None:
    blocks = groups(parse(ROOT / "README.md"), "rabbitmq").get("README.md", [])
    assert blocks, "the README lost its tour (a Python block marked docs-test: rabbitmq)"
    values = {
        "cluster_url": repr(rabbit_urls.cluster),
        "node_params": f"pika.URLParameters({rabbit_urls.amqp[0]!r})",
        "amqp10_url": repr(rabbit_urls.amqp10[0]),
        "dest_orders": f"readme-{uuid.uuid4().hex[:8]}",
    }
    code = program(blocks, values)
    assert rabbit_urls.cluster in code and values["dest_orders"] in code
    result = run_python("-c", code, label="README tour")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    # Confirmed, replicated (a quorum queue), read back.
    assert lines[:2] == ["Status.CONFIRMED", "Guarantee.REPLICATED"], result.stdout
    assert lines[2].endswith("b'{\"id\": 1}'"), result.stdout
