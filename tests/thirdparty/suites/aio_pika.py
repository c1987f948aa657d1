"""aio-pika's own tests of connections, channels, exchanges and publishing
(``tests/test_amqp.py``, ``tests/test_amqp_robust.py``; Apache-2.0), against
:mod:`msgsafe.compat.aio_pika`.

The suite's conftest starts a docker image; here the harness's RabbitMQ node stands in
(``amqp_direct_url`` points at it, the docker check is skipped). It needs aiomisc's
pytest plugin (``pip install aiomisc aiomisc-pytest``), as aio-pika's own CI does.
"""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

_CONFTEST = '''\
"""Harness: shortuuid (a test dependency of aio-pika) as a stand-in module."""

import sys
import types
import uuid

sys.modules.setdefault("shortuuid", types.SimpleNamespace(uuid=lambda: uuid.uuid4().hex))
'''

#: Where the suite's conftest reads the docker container's address.
_CONTAINER_ADDRESS = (
    "        host=rabbitmq_container.host,\n" + '        port=rabbitmq_container.ports["5672/tcp"],'
)

#: Why the wrapper differs in the two tests that fail with it on purpose.
_WHY = {
    "test_big_message": "a 22 MB body is over msgsafe's max_message_size (8 MiB): "
    "ChannelPreconditionFailed before sending",
    "test_delivery_fail": "the broker's nack (x-overflow reject-publish) is transient for "
    "msgsafe: the message is stored, no DeliveryError",
}

SUITE = Suite(
    name="aio-pika",
    broker="rabbitmq",
    repo="mosquito/aio-pika",
    commit="0a9f24c9349f9158a959bf1e64d2c909350727d7",
    test_files=("tests/test_amqp.py", "tests/test_amqp_robust.py"),
    support=("tests/__init__.py", "tests/conftest.py", "tests/docker_client.py"),
    edits=(
        ("        raise pytest.UsageError(str(e)) from e", "        pass  # the harness's broker"),
        # NOTE: the suite's leak probe traces allocations in aio_pika/__init__.py; behind
        # the import swap that name is msgsafe's module: the probe keeps aio-pika's file.
        (
            "        tracemalloc.Filter(True, aio_pika.__file__),",
            '        tracemalloc.Filter(True, __import__("aio_pika").__file__),',
        ),
        (
            "def amqp_direct_url(rabbitmq_container: ContainerInfo) -> URL:",
            "def amqp_direct_url() -> URL:",
        ),
        (
            _CONTAINER_ADDRESS,
            '        host="127.0.0.1",\n        port={port},',
        ),
    ),
    swap=(
        (
            "import aio_pika\nimport aio_pika.exceptions\n",
            "import msgsafe.compat.aio_pika as aio_pika\n",
        ),
        (
            "import aio_pika\nfrom .docker_client",
            "import msgsafe.compat.aio_pika as aio_pika\nfrom .docker_client",
        ),
        (
            "import aio_pika\nfrom aio_pika import RobustChannel\n",
            "import msgsafe.compat.aio_pika as aio_pika\n"
            "from msgsafe.compat.aio_pika import RobustChannel\n",
        ),
        # NOTE: the tests publish to auto-delete and exclusive queues, which msgsafe's
        # default require="durable" refuses before sending (docs/migration.md).
        (
            "params=[aio_pika.connect, aio_pika.connect_robust],",
            'params=[partial(aio_pika.connect, require="any"), '
            'partial(aio_pika.connect_robust, require="any")],',
        ),
        (
            "    return aio_pika.connect_robust\n",
            '    return partial(aio_pika.connect_robust, require="any")\n',
        ),
    ),
    set_aside={},
    # Test ids carry their module (two test files): test_amqp's with the connect
    # fixture's parameter, test_amqp_robust's (connect_robust only) without.
    intended={
        f"{module}::{cls}::{test}{param}": _WHY[test]
        for module, cls, params in (
            ("test_amqp", "TestCaseAmqp", ("[connect]", "[connect_robust]")),
            ("test_amqp", "TestCaseAmqpNoConfirms", ("[connect]", "[connect_robust]")),
            ("test_amqp_robust", "TestCaseAmqp", ("",)),
            ("test_amqp_robust", "TestCaseAmqpNoConfirms", ("",)),
            ("test_amqp_robust", "TestCaseAmqpNoConfirmsRobust", ("",)),
        )
        for test in _WHY
        for param in params
    }
    | {
        # The robust module's own class runs the same two tests with its own parameters.
        f"test_amqp_robust::TestCaseNoRobust::{test}{param}": _WHY[test]
        for test, params in (
            (
                "test_big_message",
                (
                    "[robust=0-robust=0]",
                    "[robust=0-robust=1]",
                    "[robust=1-robust=0]",
                    "[robust=1-robust=1]",
                ),
            ),
            ("test_delivery_fail", ("[robust=0]", "[robust=1]")),
        )
        for param in params
    },
    conftest=_CONFTEST,
    pytest_args=("-p", "no:asyncio"),
)
