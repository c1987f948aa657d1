"""The documentation's Python blocks that need a broker run here, against the suite's
own (started through ``msgsafe.cluster`` by tests/fixtures/): each page's blocks that
need the same broker, in order, in one process, as written — only the broker's address
and the queue and topic names replaced (tests/support/docs_blocks.py). The README's
tour runs in tests/integration/examples/test_readme_blocks.py; the blocks that need no
broker in tests/unit/test_docs.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.commands import Run
from tests.support.docs_blocks import DESTINATIONS, all_blocks, groups, run_blocks

pytestmark = pytest.mark.integration

BLOCKS = [block for block in all_blocks() if block.page != "README.md"]
CASES = sorted(
    (need, page)
    for need in ("rabbitmq", "kafka", "kafka-registry", "amqp10", "postgres", "integration")
    for page in groups(BLOCKS, need)
)


def _rabbitmq(request: pytest.FixtureRequest) -> dict[str, str]:
    urls = request.getfixturevalue("rabbit_urls")
    return {
        "cluster_url": repr(urls.cluster),
        "node_params": f"pika.URLParameters({urls.amqp[0]!r})",
        "amqp10_url": repr(urls.amqp10[0]),
    }


def _kafka(request: pytest.FixtureRequest) -> dict[str, str]:
    cluster = request.getfixturevalue("kafka_cluster")
    values = {"kafka_url": repr(cluster.url), "bootstrap": repr(cluster.bootstrap)}
    # The pages send to topics a reader created with the replication the promise needs.
    for name in DESTINATIONS:
        fresh = f"docs-{name}-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(fresh, partitions=3)
        values[f"dest_{name}"] = fresh
    return values


def _kafka_registry(request: pytest.FixtureRequest) -> dict[str, str]:
    return {**_kafka(request), "registry_url": repr(request.getfixturevalue("registry_url"))}


def _amqp10(request: pytest.FixtureRequest) -> dict[str, str]:
    return {"artemis_url": repr(request.getfixturevalue("artemis_pair").url)}


def _postgres(request: pytest.FixtureRequest) -> dict[str, str]:
    return {"conninfo": repr(request.getfixturevalue("postgres_conninfo"))}


FIXTURES: dict[str, Callable[[pytest.FixtureRequest], dict[str, str]]] = {
    "rabbitmq": _rabbitmq,
    "kafka": _kafka,
    "kafka-registry": _kafka_registry,
    "amqp10": _amqp10,
    "postgres": _postgres,
    "integration": lambda request: {},
}


def _service(run: Run) -> None:
    lines = run.lines()
    # Confirmed into a quorum queue (replicated), then read back.
    assert lines[:2] == ["Status.CONFIRMED", "Guarantee.REPLICATED"], run.stdout
    assert lines[2].endswith("b'{\"id\": 1}'"), run.stdout


def _sending(run: Run) -> None:
    lines = run.lines()
    # send_batch: 1000 confirmed, none stored; the asyncio consumer reads them all.
    assert lines[0] == "1000 0 Status.CONFIRMED", run.stdout
    assert sum(line.startswith('b\'{"id":') for line in lines[1:]) >= 1000, run.stdout


def _legacy(run: Run) -> None:
    assert run.lines()[-1] in ("0 {'confirmed': 100, 'stored': 0}", "published 10"), run.stdout


def _schemas(run: Run) -> None:
    # Avro, then Protobuf: each record confirmed, read back decoded, its body in
    # Confluent's wire format.
    lines = run.lines()
    avro = ["Status.CONFIRMED", "{'id': 'o-1', 'amount': 1250}", "b'\\x00'"]
    protobuf = ["Status.CONFIRMED", "o-2 990", "b'\\x00'"]
    assert lines == avro + protobuf, run.stdout


#: What a page's run prints, where the page promises it in its comments.
EXPECTED: dict[tuple[str, str], Callable[[Run], None]] = {
    ("rabbitmq", "docs/getting-started/service.md"): _service,
    ("rabbitmq", "docs/guides/sending.md"): _sending,
    ("kafka", "docs/getting-started/legacy-producer.md"): _legacy,
    ("rabbitmq", "docs/getting-started/legacy-producer.md"): _legacy,
    ("kafka-registry", "docs/guides/schemas.md"): _schemas,
}


def test_every_page_that_needs_a_broker_is_run() -> None:
    assert len(CASES) >= 8, CASES
    assert set(EXPECTED) <= set(CASES)


@pytest.mark.parametrize(("need", "page"), CASES, ids=[f"{n}:{p}" for n, p in CASES])
def test_the_blocks_of_a_page_run(
    need: str, page: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    blocks = groups(BLOCKS, need)[page]
    values = FIXTURES[need](request)
    for name in DESTINATIONS:
        values.setdefault(f"dest_{name}", f"docs-{name}-{uuid.uuid4().hex[:8]}")
    run = run_blocks(
        blocks,
        values,
        label=f"python blocks of {page} on {need} ({len(blocks)})",
        cwd=tmp_path,
        timeout=300,
    )
    print(run.stdout)
    assert run.code == 0, f"{page} on {need}:\n{run.stderr[-5000:]}"
    check = EXPECTED.get((need, page))
    if check is not None:
        check(run)
